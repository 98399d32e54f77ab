"""spec.suspend through the pure TrainingJob reconcile: a job created suspended never plans,
suspending a running job drains it like a planned switch and releases every GPU, resuming
plans anew (the new generation resumes from the last checkpoint)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from operator_builders import JOB_SPEC, RecordingPlanner
from test_reconcile_trainingjob import NOW, _reason, observe, refuse, with_status

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.trainingjob import Observed, Outcome, reconcile
from sailplan.planner.api import Planned
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import Plan
from sailplan.planner.workerenv import CHECKPOINT_REQUEST_ANNOTATION

SUSPENDED = JOB_SPEC | {"suspend": True}
WORKERS = [f"opt-g1-a0-w{i}" for i in range(4)]


@pytest.fixture
def job(make_job: Callable[..., TrainingJob]) -> TrainingJob:
    return make_job()


def _edit(job: TrainingJob, **spec: Any) -> TrainingJob:
    """`job` after the user edited its spec (metadata.generation goes up)."""
    new_spec = job.spec.model_copy(update=spec)
    return job.model_copy(update={"spec": new_spec, "generation": job.generation + 1})


def test_a_job_created_suspended_never_plans_until_resumed(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    job = make_job(SUSPENDED)
    outcome = reconcile(Observed(job=job, pools=pools), refuse, catalog, NOW)
    assert outcome.create == () and outcome.delete_pods == ()
    status = outcome.status
    assert status.phase == "Suspended"
    assert _reason(status, "Suspended") == ("True", "JobSuspended")
    assert _reason(status, "Planned") == ("False", "Suspended")
    assert status.plan is None and outcome.memory is not None and outcome.memory.replan is None
    assert [e.reason for e in outcome.events] == ["Suspended"]
    # Kueue admits it: spec.suspend false plans and starts the workers.
    job = _edit(with_status(job, outcome), suspend=False)
    planner = RecordingPlanner(Planned(best=plan))
    resumed = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    assert len(planner.requests) == 1
    assert [o["kind"] for o in resumed.create].count("Pod") == 4
    assert resumed.status.phase == "Pending"
    assert _reason(resumed.status, "Suspended") == ("False", "JobResumed")
    assert _reason(resumed.status, "Planned") == ("True", "PlanCreated")
    assert "JobResumed" in [e.reason for e in resumed.events]


def _running(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> tuple[TrainingJob, list[dict[str, Any]]]:
    first = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, NOW
    )
    created = list(first.create)
    job = with_status(job, first)
    running = reconcile(
        observe(job, pools, created, dict.fromkeys(range(4), "Running")), refuse, catalog, NOW
    )
    assert running.status.phase == "Running"
    return with_status(job, running), created


def _pass(
    job: TrainingJob,
    pools: tuple[GPUPool, ...],
    created: list[dict[str, Any]],
    phases: dict[int, str],
    catalog: Catalog,
    *,
    seconds: float = 0,
    planner: Any = refuse,
) -> Outcome:
    return reconcile(
        observe(job, pools, created, phases), planner, catalog, NOW + timedelta(seconds=seconds)
    )


def test_suspending_a_running_job_drains_it_then_releases_every_gpu(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    job, created = _running(job, pools, plan, catalog)
    job = _edit(job, suspend=True)
    running = dict.fromkeys(range(4), "Running")
    # First the checkpoint-and-exit request of a planned switch; nothing is deleted yet.
    drain = _pass(job, pools, created, running, catalog)
    assert drain.annotate_pods == tuple(
        (name, {CHECKPOINT_REQUEST_ANNOTATION: "1"}) for name in WORKERS
    )
    assert drain.delete_pods == () and drain.create == ()
    assert drain.status.phase == "Suspended"
    assert _reason(drain.status, "Suspended") == ("True", "Suspending")
    assert _reason(drain.status, "Running") == ("False", "Suspended")
    assert _reason(drain.status, "Replanning") == ("False", "Suspended")
    assert drain.requeue_after is not None  # the drain timeout ends it without an event
    job = with_status(job, drain)
    # The workers wrote their checkpoint and exited: every pod is deleted.
    exited = _pass(job, pools, created, dict.fromkeys(range(4), "Succeeded"), catalog, seconds=5)
    assert exited.delete_pods == tuple(WORKERS)
    assert _reason(exited.status, "Suspended") == ("True", "Suspending")
    # Workers that exited are not a finished job.
    assert exited.status.phase == "Suspended"
    assert _reason(exited.status, "Complete") is None
    job = with_status(job, exited)
    kept = [o for o in created if o["kind"] != "Pod"]
    gone = _pass(job, pools, kept, {}, catalog, seconds=10)
    assert gone.delete_pods == () and gone.create == ()
    assert _reason(gone.status, "Suspended") == ("True", "JobSuspended")
    assert gone.status.workers.desired == 0 and gone.status.workers.pending == 0
    assert gone.status.phase == "Suspended"
    # Stays suspended: further passes change nothing and never ask the planner.
    job = with_status(job, gone)
    again = _pass(job, pools, kept, {}, catalog, seconds=60)
    assert (again.create, again.delete_pods, again.events) == ((), (), ())
    assert again.status == gone.status


def test_a_drain_that_outlasts_its_timeout_deletes_the_workers(
    make_job: Callable[..., TrainingJob],
    pools: tuple[GPUPool, ...],
    plan: Plan,
    catalog: Catalog,
) -> None:
    job = make_job(JOB_SPEC | {"replan": {"drainTimeoutSeconds": 30}})
    job, created = _running(job, pools, plan, catalog)
    job = _edit(job, suspend=True)
    running = dict.fromkeys(range(4), "Running")
    drain = _pass(job, pools, created, running, catalog)
    assert drain.delete_pods == ()
    job = with_status(job, drain)
    assert _pass(job, pools, created, running, catalog, seconds=29).delete_pods == ()
    assert _pass(job, pools, created, running, catalog, seconds=30).delete_pods == tuple(WORKERS)


def test_resuming_plans_a_new_generation(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    job, created = _running(job, pools, plan, catalog)
    job = _edit(job, suspend=True)
    kept = [o for o in created if o["kind"] != "Pod"]
    # Suspended while its pods were gone already: suspended at once.
    suspended = _pass(job, pools, kept, {}, catalog)
    assert _reason(suspended.status, "Suspended") == ("True", "JobSuspended")
    job = _edit(with_status(job, suspended), suspend=False)
    planner = RecordingPlanner(Planned(best=plan))
    resumed = _pass(job, pools, kept, {}, catalog, seconds=60, planner=planner)
    assert len(planner.requests) == 1
    # A new generation (never reusing 1), whose workers load the last checkpoint.
    assert [o["metadata"]["name"] for o in resumed.create if o["kind"] == "Pod"] == [
        f"opt-g2-a0-w{i}" for i in range(4)
    ]
    assert resumed.status.plan is not None and resumed.status.plan.generation == 2
    assert resumed.status.history[-1].reason.startswith("Resumed")
    assert _reason(resumed.status, "Suspended") == ("False", "JobResumed")
    assert resumed.status.phase == "Pending"
