"""spec.activeDeadlineSeconds and spec.ttlSecondsAfterFinished through the pure reconcile,
with the clock injected as `now`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from operator_builders import JOB_SPEC, RecordingPlanner
from test_reconcile_trainingjob import NOW, _reason, observe, refuse, with_status

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.trainingjob import Observed, reconcile
from sailplan.planner.api import Planned
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import Plan

WORKERS = tuple(f"opt-g1-a0-w{i}" for i in range(4))


def test_the_active_deadline_fails_the_job_and_deletes_its_workers(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    job = make_job(JOB_SPEC | {"activeDeadlineSeconds": 600})
    first = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, NOW
    )
    assert first.status.start_time == NOW
    # The pass asks to be woken at the deadline, whatever else happens meanwhile.
    assert first.requeue_after == 600
    job, created = with_status(job, first), list(first.create)
    running = dict.fromkeys(range(4), "Running")
    before = reconcile(
        observe(job, pools, created, running), refuse, catalog, NOW + timedelta(seconds=599)
    )
    assert before.status.phase == "Running" and before.delete_pods == ()
    assert before.requeue_after == 1
    job = with_status(job, before)
    late = NOW + timedelta(seconds=600)
    after = reconcile(observe(job, pools, created, running), refuse, catalog, late)
    assert after.status.phase == "Failed"
    assert _reason(after.status, "Failed") == ("True", "DeadlineExceeded")
    assert _reason(after.status, "Running") == ("False", "DeadlineExceeded")
    assert _reason(after.status, "Complete") is None
    assert after.delete_pods == WORKERS
    assert after.status.completion_time == late
    assert [(e.type, e.reason) for e in after.events] == [("Warning", "DeadlineExceeded")]
    # Terminal: nothing more, however late.
    job = with_status(job, after)
    final = reconcile(
        observe(job, pools, created, running), refuse, catalog, late + timedelta(days=1)
    )
    assert (final.create, final.delete_pods, final.delete_job) == ((), (), False)
    assert final.status.phase == "Failed"


def test_time_suspended_does_not_count_toward_the_deadline(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    job = make_job(JOB_SPEC | {"activeDeadlineSeconds": 600, "suspend": True})
    suspended = reconcile(Observed(job=job, pools=pools), refuse, catalog, NOW)
    assert suspended.status.start_time is None and suspended.requeue_after is None
    job = with_status(job, suspended)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"suspend": False})})
    resumed_at = NOW + timedelta(hours=5)
    resumed = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, resumed_at
    )
    assert resumed.status.start_time == resumed_at
    assert resumed.status.phase == "Pending"


def _succeeded(
    make_job: Callable[..., TrainingJob],
    pools: tuple[GPUPool, ...],
    plan: Plan,
    catalog: Catalog,
    ttl: int,
) -> TrainingJob:
    job = make_job(JOB_SPEC | {"ttlSecondsAfterFinished": ttl})
    first = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, NOW
    )
    job = with_status(job, first)
    done = reconcile(
        observe(job, pools, list(first.create), dict.fromkeys(range(4), "Succeeded")),
        refuse,
        catalog,
        NOW,
    )
    assert done.status.phase == "Succeeded" and done.status.completion_time == NOW
    return with_status(job, done)


def test_a_finished_job_is_deleted_once_its_ttl_has_passed(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    job = _succeeded(make_job, pools, plan, catalog, ttl=3600)
    waiting = reconcile(
        Observed(job=job, pools=pools), refuse, catalog, NOW + timedelta(seconds=60)
    )
    assert not waiting.delete_job
    assert waiting.requeue_after == 3540  # woken when the TTL runs out
    expired = reconcile(Observed(job=job, pools=pools), refuse, catalog, NOW + timedelta(hours=1))
    assert expired.delete_job
    assert (expired.create, expired.delete_pods) == ((), ())


def test_a_ttl_of_zero_deletes_at_once_and_no_ttl_keeps_the_job(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    job = _succeeded(make_job, pools, plan, catalog, ttl=0)
    assert reconcile(Observed(job=job, pools=pools), refuse, catalog, NOW).delete_job
    kept = job.model_copy(
        update={"spec": job.spec.model_copy(update={"ttl_seconds_after_finished": None})}
    )
    outcome = reconcile(Observed(job=kept, pools=pools), refuse, catalog, NOW + timedelta(days=30))
    assert not outcome.delete_job and outcome.requeue_after is None
