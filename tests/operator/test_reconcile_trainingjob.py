"""The TrainingJob reconcile as a pure function: planning, adoption, idempotency, failures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import operator_builders
import pytest
from operator_builders import JOB_SPEC, RecordingPlanner

from sailplan.operator.api.common import find_condition
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import PlanSummary, TrainingJob, TrainingJobStatus
from sailplan.operator.controller.progress import Reading, attach
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.operator.reconcile.trainingjob import (
    Observed,
    Outcome,
    merge_patch,
    observed_plan,
    observed_pod,
    reconcile,
)
from sailplan.operator.replan.decision import reprice
from sailplan.planner.api import Infeasible, Planned, PlanRequest, PlanResult
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.workerenv import TrainerProgress

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def refuse(request: PlanRequest, measured: ProfileSet) -> PlanResult:
    raise AssertionError("the planner must not run when a plan already exists")


def with_status(job: TrainingJob, outcome: Outcome) -> TrainingJob:
    """The job as the next pass reads it: the status and the memory the pass wrote."""
    update: dict[str, Any] = {"status": outcome.status}
    if outcome.memory is not None:
        update["memory"] = outcome.memory
    return job.model_copy(update=update)


def observe(
    job: TrainingJob,
    pools: tuple[GPUPool, ...],
    created: list[dict[str, Any]],
    phases: dict[int, str] | None = None,
    preempted: frozenset[int] = frozenset(),
) -> Observed:
    """What the cluster shows after `created` objects were created (pods in `phases`)."""
    plans = tuple(p for p in (observed_plan(o) for o in created if o["kind"] == "ConfigMap") if p)
    pods = []
    for obj in created:
        if obj["kind"] != "Pod":
            continue
        index = int(obj["metadata"]["labels"]["sailplan.dev/worker-index"])
        status: dict[str, Any] = {"phase": (phases or {}).get(index, "Pending")}
        if index in preempted:
            status["conditions"] = [{"type": "DisruptionTarget", "status": "True"}]
        pod = observed_pod(obj | {"status": status})
        assert pod is not None
        pods.append(pod)
    return Observed(
        job=job,
        pools=pools,
        plans=plans,
        pods=tuple(pods),
        service_exists=any(o["kind"] == "Service" for o in created),
    )


def _reason(status: TrainingJobStatus, type_: str) -> tuple[str, str] | None:
    condition = find_condition(status.conditions, type_)
    return (condition.status, condition.reason) if condition else None


@pytest.fixture
def job(make_job: Callable[..., TrainingJob]) -> TrainingJob:
    return make_job()


@pytest.fixture
def planner(plan: Plan) -> RecordingPlanner:
    return RecordingPlanner(Planned(best=plan))


def test_first_pass_plans_and_creates_plan_service_then_pods(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    outcome = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    kinds = [o["kind"] for o in outcome.create]
    assert kinds == ["ConfigMap", "Service", "Pod", "Pod", "Pod", "Pod"]
    (request,) = planner.requests
    # The request reflects the spec and the GPUPools' free nodes.
    assert request.global_batch_size == 8
    assert request.model.name == "OPT-350M"
    assert sum(p.gpus for p in request.cluster.pools) == 2 * 4 + 2 * 4 + 3 * 4
    status = outcome.status
    assert status.phase == "Pending"
    assert status.plan is not None and status.plan.generation == 1
    assert status.plan.config_map == "opt-plan-g1"
    assert (status.plan.gpus, status.plan.workers) == (6, 4)
    assert [h.generation for h in status.history] == [1]
    assert _reason(status, "Planned") == ("True", "PlanCreated")
    assert _reason(status, "ProfilesMeasured") == ("True", "AllMeasured")
    assert [e.reason for e in outcome.events] == ["Planned", "PodsCreated"]
    assert outcome.plan_result == "planned"


def test_second_pass_with_the_children_in_place_creates_nothing(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    first = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    job = with_status(job, first)
    second = reconcile(observe(job, pools, list(first.create)), refuse, catalog, NOW)
    assert second.create == () and second.delete_pods == ()
    assert second.events == ()  # nothing new was decided
    assert second.status == first.status


def test_all_workers_running_makes_the_job_running(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    first = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    job = with_status(job, first)
    half = reconcile(
        observe(job, pools, list(first.create), {0: "Running", 1: "Running"}), refuse, catalog, NOW
    )
    assert half.status.phase == "Pending"
    assert (half.status.workers.running, half.status.workers.pending) == (2, 2)
    running = reconcile(
        observe(job, pools, list(first.create), dict.fromkeys(range(4), "Running")),
        refuse,
        catalog,
        NOW,
    )
    assert running.status.phase == "Running"
    assert _reason(running.status, "Running") == ("True", "AllWorkersRunning")
    assert [e.reason for e in running.events] == ["Running"]
    # Positive polarity for tools that read True as good; no Complete before the end.
    assert _reason(running.status, "Valid") == ("True", "Valid")
    assert _reason(running.status, "Schedulable") == ("True", "Schedulable")
    assert _reason(running.status, "Complete") is None


def test_operator_crash_after_the_plan_configmap_adopts_it(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    first = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    # Crash after the ConfigMap and two pods were created, before the status was written.
    created = [o for o in first.create if o["kind"] == "ConfigMap"] + [
        o for o in first.create if o["kind"] == "Pod"
    ][:2]
    after = reconcile(observe(job, pools, created), refuse, catalog, NOW)
    names = [o["metadata"]["name"] for o in after.create]
    assert names == ["opt", "opt-g1-a0-w2", "opt-g1-a0-w3"]  # the Service and missing pods
    assert _reason(after.status, "Planned") == ("True", "PlanAdopted")
    assert after.status.plan is not None and after.status.plan.generation == 1


def test_infeasible_plan_is_unschedulable_with_the_reason(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    infeasible = Infeasible(code="OutOfMemory", reason="stage 0 needs 41 GB, A100-40 has 40")
    outcome = reconcile(Observed(job=job, pools=pools), RecordingPlanner(infeasible), catalog, NOW)
    assert outcome.create == ()
    assert outcome.status.phase == "Unschedulable"
    condition = find_condition(outcome.status.conditions, "Unschedulable")
    assert condition is not None
    assert (condition.status, condition.reason) == ("True", "OutOfMemory")
    assert "41 GB" in condition.message
    schedulable = find_condition(outcome.status.conditions, "Schedulable")
    assert schedulable is not None
    assert (schedulable.status, schedulable.reason) == ("False", "OutOfMemory")
    assert schedulable.message == condition.message
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "OutOfMemory")]


def test_no_free_gpus_is_unschedulable_without_planning(job: TrainingJob, catalog: Catalog) -> None:
    from operator_builders import pool

    busy = (pool("a100", "a100-ondemand", {"us-central1-a": 0}),)
    outcome = reconcile(Observed(job=job, pools=busy), refuse, catalog, NOW)
    assert _reason(outcome.status, "Unschedulable") == ("True", "NoCapacity")
    assert _reason(outcome.status, "Schedulable") == ("False", "NoCapacity")


def test_unknown_model_is_invalid_and_names_the_known_ones(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    job = make_job(JOB_SPEC | {"model": {"name": "GPT-5"}})
    outcome = reconcile(Observed(job=job, pools=pools), refuse, catalog, NOW)
    assert outcome.status.phase == "Invalid"
    condition = find_condition(outcome.status.conditions, "Invalid")
    assert condition is not None and condition.reason == "UnknownModel"
    assert "GPT-5" in condition.message and "OPT-350M" in condition.message
    valid = find_condition(outcome.status.conditions, "Valid")
    assert valid is not None and (valid.status, valid.reason) == ("False", "UnknownModel")
    assert valid.message == condition.message


def test_unknown_pool_name_is_invalid(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    job = make_job(JOB_SPEC | {"pools": {"names": ["h100"]}})
    outcome = reconcile(Observed(job=job, pools=pools), refuse, catalog, NOW)
    condition = find_condition(outcome.status.conditions, "Invalid")
    assert condition is not None and "h100" in condition.message and "a100" in condition.message


def test_custom_model_with_sequence_override_reaches_the_planner(
    make_job: Callable[..., TrainingJob],
    pools: tuple[GPUPool, ...],
    planner: RecordingPlanner,
    catalog: Catalog,
) -> None:
    custom = {
        "name": "tiny",
        "hiddenSize": 256,
        "numBlocks": 4,
        "numHeads": 4,
        "vocabSize": 1000,
        "sequenceLength": 512,
    }
    training = JOB_SPEC["training"] | {"sequenceLength": 128}
    job = make_job(JOB_SPEC | {"model": {"custom": custom}, "training": training})
    reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    (request,) = planner.requests
    assert (request.model.name, request.model.hidden_size, request.model.sequence_length) == (
        "tiny",
        256,
        128,
    )


def test_a_sequence_length_for_a_convnet_is_an_invalid_shape(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    training = JOB_SPEC["training"] | {"sequenceLength": 128}
    job = make_job(JOB_SPEC | {"model": {"name": "WideResNet-50-2"}, "training": training})
    outcome = reconcile(Observed(job=job, pools=pools), refuse, catalog, NOW)
    condition = find_condition(outcome.status.conditions, "Invalid")
    assert condition is not None
    assert condition.message == (
        "spec.training.sequenceLength: WideResNet-50-2 is a convnet, it has no sequence length"
    )


def _running(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> tuple[TrainingJob, list[dict[str, Any]]]:
    first = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    return with_status(job, first), list(first.create)


def test_a_real_failure_restarts_the_generation_under_new_names_after_a_backoff(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    job, created = _running(job, pools, planner, catalog)
    phases = {0: "Running", 1: "Failed", 2: "Running", 3: "Running"}
    failed = reconcile(observe(job, pools, created, phases), refuse, catalog, NOW)
    # The restart is counted at once, but nothing is torn down before the backoff
    # (ReplanConfig default: 10 s for the first restart) so a crash loop cannot spin.
    assert (failed.status.restarts, failed.status.preemptions) == (1, 0)
    assert failed.create == () and failed.delete_pods == ()
    assert failed.requeue_after == 10.0
    assert failed.status.phase == "Replanning"
    assert any(e.reason == "Restarting" and e.type == "Warning" for e in failed.events)
    job = with_status(job, failed)
    later = NOW + timedelta(seconds=10)
    # The same failed pod seen again does not count twice; the old attempt is deleted ...
    teardown = reconcile(observe(job, pools, created, phases), refuse, catalog, later)
    assert teardown.status.restarts == 1
    assert teardown.delete_pods == ("opt-g1-a0-w0", "opt-g1-a0-w1", "opt-g1-a0-w2", "opt-g1-a0-w3")
    assert teardown.create == ()
    # ... and only once its pods are gone does the next attempt start, under new names.
    job = with_status(job, teardown)
    kept = [o for o in created if o["kind"] != "Pod"]
    outcome = reconcile(observe(job, pools, kept), refuse, catalog, later)
    assert [o["metadata"]["name"] for o in outcome.create] == [
        "opt-g1-a1-w0",
        "opt-g1-a1-w1",
        "opt-g1-a1-w2",
        "opt-g1-a1-w3",
    ]
    assert (outcome.status.restarts, outcome.status.preemptions, outcome.status.attempt) == (
        1,
        0,
        1,
    )
    # The restarted pods rendezvous at the new worker 0.
    env = {e["name"]: e.get("value") for e in outcome.create[0]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"].startswith("opt-g1-a1-w0.")


def test_preemption_replans_at_once_without_using_a_restart(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    job, created = _running(job, pools, planner, catalog)
    phases = {0: "Running", 1: "Running", 2: "Failed", 3: "Running"}
    outcome = reconcile(observe(job, pools, created, phases, frozenset({2})), planner, catalog, NOW)
    assert (outcome.status.restarts, outcome.status.preemptions) == (0, 1)
    # Lost capacity is replanned for at once (no backoff): a new generation, the old pods go.
    assert len(planner.requests) == 2
    assert outcome.status.phase == "Replanning"
    assert outcome.memory.replan is not None
    assert outcome.memory.replan.target_generation == 2
    # Every pod of the old generation goes, the preempted one included: two generations
    # never run side by side.
    assert outcome.delete_pods == tuple(f"opt-g1-a0-w{i}" for i in range(4))
    assert outcome.create == ()
    assert outcome.status.history[-1].generation == 2
    assert outcome.status.history[-1].reason.startswith("WorkerPreempted")
    assert _reason(outcome.status, "Replanning") == ("True", "WorkerPreempted")


def test_a_switch_whose_status_write_was_lost_is_recorded_once_on_the_next_pass(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    """The operator writes the job's memory, then its status. Killed between the two, the
    next pass reads the new memory (a switch under way) with the old status: the switch
    still reaches the history and the preemption count, once, however many passes follow."""
    job, created = _running(job, pools, planner, catalog)
    before = job.status
    phases = {0: "Running", 1: "Running", 2: "Failed", 3: "Running"}
    preempted = observe(job, pools, created, phases, frozenset({2}))
    switched = reconcile(preempted, planner, catalog, NOW)
    assert switched.memory is not None and switched.memory.replan is not None
    # The memory landed, the status patch did not.
    crashed = job.model_copy(update={"memory": switched.memory, "status": before})
    later = NOW + timedelta(seconds=5)
    resumed = reconcile(replace(preempted, job=crashed), planner, catalog, later)
    assert [h.generation for h in resumed.status.history] == [1, 2]
    assert resumed.status.history[-1].reason.startswith("WorkerPreempted")
    assert resumed.status.preemptions == 1
    again = reconcile(
        replace(preempted, job=with_status(crashed, resumed)), planner, catalog, later
    )
    assert [h.generation for h in again.status.history] == [1, 2]
    assert again.status.preemptions == 1


def test_restarts_exhausted_fails_the_job(
    make_job: Callable[..., TrainingJob],
    pools: tuple[GPUPool, ...],
    planner: RecordingPlanner,
    catalog: Catalog,
) -> None:
    job = make_job(JOB_SPEC | {"failure": {"maxRestarts": 0}})
    job, created = _running(job, pools, planner, catalog)
    phases = {0: "Running", 1: "Failed", 2: "Running", 3: "Pending"}
    outcome = reconcile(observe(job, pools, created, phases), refuse, catalog, NOW)
    assert outcome.status.phase == "Failed"
    assert _reason(outcome.status, "Failed") == ("True", "RestartsExhausted")
    assert _reason(outcome.status, "Complete") is None
    assert outcome.create == ()
    # Pods still holding GPUs are released; the failed one is kept for its logs.
    assert outcome.delete_pods == ("opt-g1-a0-w0", "opt-g1-a0-w2", "opt-g1-a0-w3")
    # A terminal job stays terminal.
    final = reconcile(
        observe(with_status(job, outcome), pools, created, phases), refuse, catalog, NOW
    )
    assert final.create == () and final.delete_pods == () and final.status.phase == "Failed"


def test_all_workers_succeeded_completes_the_job(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    job, created = _running(job, pools, planner, catalog)
    done = reconcile(
        observe(job, pools, created, dict.fromkeys(range(4), "Succeeded")), refuse, catalog, NOW
    )
    assert done.status.phase == "Succeeded"
    assert _reason(done.status, "Succeeded") == ("True", "Completed")
    # batch/v1 Job's condition name, so `kubectl wait --for=condition=Complete` works.
    assert _reason(done.status, "Complete") == ("True", "Completed")


def test_progress_is_rank_zeros_reading_and_stays_while_rank_zero_is_unread(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    job, created = _running(job, pools, planner, catalog)
    pods = [dict(o) for o in created]
    worker0 = next(p for p in pods if p["metadata"]["name"].endswith("-w0"))
    worker0["metadata"] = worker0["metadata"] | {
        "uid": "rank0-uid",
        # What older trainers patched onto their pod: no longer a source of progress.
        "annotations": {"sailplan.dev/progress": '{"step": 99}'},
    }
    running = observe(job, pools, pods, dict.fromkeys(range(4), "Running"))
    read_at = NOW - timedelta(seconds=30)
    reading = Reading(
        TrainerProgress(step=40, loss=2.5, samples_per_second=31.04719, last_checkpoint_step=25),
        read_at,
    )
    read = replace(running, pods=attach(running.pods, {"rank0-uid": reading}))
    outcome = reconcile(read, refuse, catalog, NOW)
    progress = outcome.status.progress
    assert progress is not None
    # samples/s is a printer column: written with 3 significant digits.
    assert (progress.step, progress.loss, progress.samples_per_second) == (40, 2.5, 31.0)
    assert outcome.status.to_kube()["progress"]["samplesPerSecond"] == 31.0
    assert progress.last_checkpoint_step == 25
    assert progress.time == read_at  # its age: when the operator read step 40
    # The next pass has no reading (rank 0 did not answer): the numbers and their time stay.
    job = with_status(job, outcome)
    later = reconcile(
        observe(job, pools, pods, dict.fromkeys(range(4), "Running")),
        refuse,
        catalog,
        NOW + timedelta(minutes=5),
    )
    assert later.status.progress == progress


def test_merge_patch_nulls_removed_keys_and_skips_equal_ones() -> None:
    old = {"phase": "Pending", "plan": {"generation": 1, "gpus": 4}, "progress": {"step": 3}}
    new = {"phase": "Running", "plan": {"generation": 1}}
    assert merge_patch(old, new) == {"phase": "Running", "plan": {"gpus": None}, "progress": None}
    assert merge_patch(new, new) == {}


def test_infeasible_answer_stands_until_the_cluster_or_the_job_changes(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    from operator_builders import pool

    infeasible = RecordingPlanner(Infeasible(code="OverBudget", reason="cheapest is $30/h"))
    first = reconcile(Observed(job=job, pools=pools), infeasible, catalog, NOW)
    job = with_status(job, first)
    # Same job, same free nodes: the planner is not asked again (it would raise).
    again = reconcile(Observed(job=job, pools=pools), refuse, catalog, NOW)
    assert again.status == first.status and again.events == ()
    # A node more in a pool changes the cluster hash: plan again.
    grown = (pool("a100", "a100-ondemand", {"us-central1-a": 3, "us-central1-b": 2}), pools[1])
    reconcile(Observed(job=job, pools=grown), infeasible, catalog, NOW)
    # So does a new job generation (the user relaxed the budget).
    edited = job.model_copy(update={"generation": 2})
    reconcile(Observed(job=edited, pools=pools), infeasible, catalog, NOW)
    assert len(infeasible.requests) == 3


def test_ranks_finishing_a_moment_apart_keep_the_job_running(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    job, created = _running(job, pools, planner, catalog)
    phases = {0: "Succeeded", 1: "Running", 2: "Running", 3: "Running"}
    outcome = reconcile(observe(job, pools, created, phases), refuse, catalog, NOW)
    assert outcome.status.phase == "Running"


def test_a_pool_with_an_unknown_gpu_type_makes_the_job_invalid(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    broken = GPUPool.model_validate(
        {
            "name": "h200",
            "spec": {"nodePool": "h200", "gpuType": "H200-141"},
            "status": {
                "conditions": [
                    {
                        "type": "GPUTypeResolved",
                        "status": "False",
                        "reason": "UnknownGPUType",
                        "message": "spec.gpuType: unknown GPU type 'H200-141'; known: A100-40, V100-16",
                    }
                ]
            },
        }
    )
    outcome = reconcile(Observed(job=job, pools=(*pools, broken)), refuse, catalog, NOW)
    condition = find_condition(outcome.status.conditions, "Invalid")
    assert condition is not None and condition.reason == "UnknownGPUType"
    assert "GPUPool h200" in condition.message and "A100-40" in condition.message


def test_children_of_an_earlier_job_with_the_same_name_are_not_adopted(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    first = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    # The job was deleted and created again: new uid, old children still awaiting GC.
    reborn = job.model_copy(update={"uid": "uid-5678", "status": TrainingJobStatus()})
    outcome = reconcile(observe(reborn, pools, list(first.create)), planner, catalog, NOW)
    assert len(planner.requests) == 2  # planned afresh instead of adopting the stale plan
    assert _reason(outcome.status, "Planned") == ("True", "PlanCreated")
    owners = {o["metadata"]["ownerReferences"][0]["uid"] for o in outcome.create}
    assert owners == {"uid-5678"}
    # Generation 2: the stale generation-1 names are still taken until the GC runs.
    assert outcome.status.plan is not None and outcome.status.plan.generation == 2
    assert "opt-g2-a0-w0" in {o["metadata"]["name"] for o in outcome.create}


def _candidate(plan: Plan, samples_per_second: float) -> Plan:
    """Another layout than `plan` (half the micro-batch size; the decision compares layouts
    and predictions only), predicting `samples_per_second`."""
    assert plan.predictions is not None
    predictions = plan.predictions.model_copy(update={"samples_per_second": samples_per_second})
    return plan.model_copy(
        update={"micro_batch_size": 1, "num_micro_batches": 4, "predictions": predictions}
    )


@pytest.mark.parametrize(("factor", "switches"), [(1.05, False), (3.0, True)])
def test_new_capacity_switches_only_when_the_gain_is_worth_it(  # noqa: PLR0917
    make_job: Callable[..., TrainingJob],
    pools: tuple[GPUPool, ...],
    planner: RecordingPlanner,
    plan: Plan,
    catalog: Catalog,
    factor: float,
    switches: bool,
) -> None:
    # Much work left (a million steps), so the restart cost (about two minutes for
    # OPT-350M, replan.cost) is small against the time a faster plan saves.
    spec = JOB_SPEC | {"training": {"globalBatchSize": 8, "steps": 10**6, "seed": 7}}
    job, created = _running(make_job(spec), pools, planner, catalog)
    running = dict.fromkeys(range(4), "Running")
    grown = (
        operator_builders.pool("a100", "a100-ondemand", {"us-central1-a": 4, "us-central1-b": 2}),
        pools[1],
    )
    observed = observe(job, grown, created, running)
    # The baseline is the current plan re-priced on the grown cluster (replan.decision),
    # so the candidate's gain over it is exactly factor - 1.
    current = reprice(plan, plan.model, build_snapshot(grown), ProfileSet(), catalog)
    candidate = RecordingPlanner(
        Planned(best=_candidate(plan, current.samples_per_second * factor))
    )
    outcome = reconcile(observed, candidate, catalog, NOW)
    assert len(candidate.requests) == 1  # new capacity is judged ...
    assert outcome.create == () and outcome.delete_pods == ()
    if not switches:
        # ... +5% is below the default minimum gain (+10%): the plan stays, nobody is asked
        # to checkpoint, the history is unchanged, an Event says why.
        assert outcome.annotate_pods == ()
        assert outcome.status.history == job.status.history
        assert outcome.status.phase == "Running"
        skipped = [e for e in outcome.events if e.reason == "ReplanSkipped"]
        assert skipped and "minimum 10%" in skipped[0].message
        # Judged once: the same cluster again does not ask the planner again.
        again = reconcile(
            observe(with_status(job, outcome), grown, created, running), refuse, catalog, NOW
        )
        assert again.annotate_pods == () and again.events == ()
        return
    # ... +200% is worth it: every worker is asked for a checkpoint at the next step
    # boundary (the switch happens once they exit), and the history records the switch.
    assert outcome.annotate_pods == tuple(
        (f"opt-g1-a0-w{i}", {"sailplan.dev/checkpoint-request": "1"}) for i in range(4)
    )
    assert outcome.status.phase == "Replanning"
    entry = outcome.status.history[-1]
    assert entry.generation == 2 and entry.reason.startswith("CapacityAdded")
    assert "predicted gain +200.0%" in entry.reason
    # The workers exit 0 after the checkpoint: that is a switch, not the job succeeding.
    done = dict.fromkeys(range(4), "Succeeded")
    switched = reconcile(
        observe(with_status(job, outcome), grown, created, done), refuse, catalog, NOW
    )
    assert switched.status.phase == "Replanning"
    assert switched.delete_pods == tuple(f"opt-g1-a0-w{i}" for i in range(4))


def test_no_capacity_left_waits_with_the_reason_and_resumes_when_it_returns(
    job: TrainingJob, pools: tuple[GPUPool, ...], planner: RecordingPlanner, catalog: Catalog
) -> None:
    job, created = _running(job, pools, planner, catalog)
    # Every node is gone: the workers were preempted and the GPUPools have nothing ready.
    empty = (
        operator_builders.pool("a100", "a100-ondemand", {"us-central1-a": 0}),
        operator_builders.pool("v100", "v100-ondemand", {"us-west1-b": 0}, gpu_type="V100-16"),
    )
    failed = dict.fromkeys(range(4), "Failed")
    waiting = reconcile(
        observe(job, empty, created, failed, frozenset(range(4))), planner, catalog, NOW
    )
    assert waiting.status.phase == "Unschedulable"
    assert _reason(waiting.status, "Unschedulable") == ("True", "NoCapacity")
    condition = find_condition(waiting.status.conditions, "Unschedulable")
    assert condition is not None and "no free or obtainable GPU nodes" in condition.message
    assert waiting.create == ()
    assert (waiting.status.restarts, waiting.status.preemptions) == (0, 0)  # nothing switched yet
    # Nothing changes: it keeps waiting without asking the planner.
    job = with_status(job, waiting)
    kept = [o for o in created if o["kind"] != "Pod"]
    still = reconcile(observe(job, empty, kept), refuse, catalog, NOW)
    assert still.status.phase == "Unschedulable" and still.create == ()
    # Capacity returns: a new generation starts by itself.
    resumed = reconcile(observe(with_status(job, still), pools, kept), planner, catalog, NOW)
    assert resumed.memory.replan is not None and resumed.memory.replan.generation == 2
    assert [o["metadata"]["name"] for o in resumed.create if o["kind"] == "Pod"] == [
        f"opt-g2-a0-w{i}" for i in range(4)
    ]
    assert resumed.status.history[-1].reason.startswith("CapacityReturned")


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        (42.15181355961952, 42.2),
        (14.679999999999998, 14.7),
        (0.0012345, 0.00123),
        (123456.7, 123000.0),
        (0.0, 0.0),
        (None, None),
    ],
)
def test_printer_column_numbers_are_written_with_three_significant_digits(
    written: float | None, shown: float | None
) -> None:
    summary = PlanSummary(
        generation=1,
        config_map="opt-plan-g1",
        summary="s",
        predicted_samples_per_second=written,
        predicted_usd_per_hour=written,
    )
    assert summary.predicted_samples_per_second == shown
    assert summary.to_kube().get("predictedUsdPerHour") == shown
