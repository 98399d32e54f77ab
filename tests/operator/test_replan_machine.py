"""The replanning state machine: full switches, operator restarts, cooldown, failure budget.

Worker pods are rendered by the operator's own renderer (desired_children) and given the
status the kubelet would write; plans come from the real planner.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from operator_builders import JOB_SPEC, pool

from sailplan.operator.api.gpupool import NODEPOOL_LABEL, ZONE_LABEL, GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.children import desired_children
from sailplan.operator.reconcile.nodes import NodeInfo
from sailplan.operator.replan import machine as m
from sailplan.operator.replan import triggers as t
from sailplan.operator.replan.decision import (
    ReplanConfig,
    ReplanContext,
    ReplanInputs,
    effective_config,
    plan_request,
)
from sailplan.operator.replan.state import (
    FailureBudget,
    ReplanState,
    SwitchRecord,
    from_annotation,
    to_annotation,
)
from sailplan.planner.api import Planned, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance
from sailplan.planner.workerenv import TrainerProgress

ZONE = "us-central1-a"
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CATALOG = default_catalog()
MODEL = CATALOG.model("OPT-350M")
CONTEXT = ReplanContext(planner=make_plan, catalog=CATALOG)
SPEC = JOB_SPEC | {"training": {"globalBatchSize": 32, "steps": 100_000}}
GPUS_PER_NODE = 4


def make_job(**spec: Any) -> TrainingJob:
    return TrainingJob.model_validate(
        {"name": "opt", "namespace": "team-a", "uid": "u1", "spec": SPEC | spec}
    )


def gpupool(total: int, free: int) -> GPUPool:
    base = pool("a100", "a100-ondemand", {ZONE: total})
    zone = base.status.zones[0].model_copy(update={"nodes_free": free})
    return base.model_copy(update={"status": base.status.model_copy(update={"zones": (zone,)})})


def nodes(count: int, **overrides: NodeInfo) -> dict[str, NodeInfo]:
    labels = {ZONE_LABEL: ZONE, NODEPOOL_LABEL: "a100-ondemand"}
    found = {
        f"n{i}": NodeInfo(f"n{i}", labels, ready=True, gpus_allocatable=GPUS_PER_NODE)
        for i in range(count)
    }
    return found | overrides


def pods(
    job: TrainingJob, plan: Plan, generation: int, attempt: int = 0, **status: Any
) -> list[dict[str, Any]]:
    """The plan's worker pods with the given status fields, packed onto nodes n0, n1, ... in
    rank order as the scheduler packs them (GPUS_PER_NODE each)."""
    rendered = desired_children(job, plan, generation, attempt, {"a100": gpupool(1, 1)}).pods
    out = []
    for worker, pod in zip(plan.workers(), rendered, strict=True):
        pod = pod | {"status": {"phase": "Running"} | status}
        pod["metadata"] = pod["metadata"] | {"uid": f"{pod['metadata']['name']}-uid"}
        pod["spec"] = pod["spec"] | {"nodeName": f"n{worker.first_rank // GPUS_PER_NODE}"}
        out.append(pod)
    return out


def names(bodies: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(body["metadata"]["name"] for body in bodies)


def observe(
    job: TrainingJob,
    plan: Plan | None,
    bodies: list[dict[str, Any]],
    node_map: dict[str, NodeInfo],
    gpupools: list[GPUPool],
) -> ReplanInputs:
    facts = tuple(f for b in bodies if (f := t.pod_facts(b)) is not None)
    return ReplanInputs(
        job=job,
        model=MODEL,
        plan=plan,
        pods=facts,
        nodes=node_map,
        cluster=t.capacity_snapshot(gpupools, facts, node_map),
    )


@pytest.fixture(scope="module")
def plan1() -> Plan:
    """The plan on one free 4-GPU node: it uses all four GPUs of that node (checked below;
    whichever TP/DP shape the simulator prefers)."""
    result = make_plan(
        plan_request(make_job(), MODEL, t.capacity_snapshot([gpupool(1, 1)], [], {}))
    )
    assert isinstance(result, Planned)
    assert result.best.world_size == GPUS_PER_NODE
    return result.best


def running_state(job: TrainingJob, plan: Plan, **update: Any) -> ReplanState:
    cluster = t.capacity_snapshot([gpupool(1, 1)], [], {})
    return m.initial_state(job, 1, 0, plan, cluster=cluster).model_copy(update=update)


def replay(
    state: ReplanState, inputs: ReplanInputs, now: datetime, context: ReplanContext = CONTEXT
) -> tuple[ReplanState, tuple[m.Action, ...]]:
    """One pass, checked for determinism across an operator restart: the state is written
    out and read back (as a new process would), the same inputs fed twice, same result."""
    first = m.next_state(state, inputs, now, context)
    restored = from_annotation(to_annotation(state))
    assert restored == state
    assert m.next_state(restored, inputs, now, context) == first
    return first


def job_context(job: TrainingJob) -> ReplanContext:
    """The operator's default settings with the job's overrides, as the reconcile builds it."""
    return dataclasses.replace(CONTEXT, config=effective_config(ReplanConfig(), job))


def kinds(actions: tuple[m.Action, ...]) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_steady_state_does_nothing(plan1: Plan) -> None:
    # Our worker holds n0, so the GPUPool reports 0 free; the capacity view adds it back
    # and sees exactly the snapshot the plan was made on: no trigger, no action.
    job = make_job()
    state = running_state(job, plan1)
    inputs = observe(job, plan1, pods(job, plan1, 1), nodes(1), [gpupool(1, 0)])
    assert replay(state, inputs, NOW) == (state, ())


def test_voluntary_switch_drains_then_switches(plan1: Plan) -> None:
    job = make_job()
    state = running_state(job, plan1)
    old = pods(job, plan1, 1)
    # Three more nodes join the pool (4 ready, 3 free besides ours).
    grown = [gpupool(4, 3)]
    inputs = observe(job, plan1, old, nodes(4), grown)
    state, actions = replay(state, inputs, NOW)
    assert state.phase == "Draining" and state.target_generation == 2
    assert state.trigger == t.CAPACITY_ADDED
    assert kinds(actions) == ["EmitEvent", "RequestCheckpoint"]
    record = state.switch
    assert record is not None and (record.from_generation, record.to_generation) == (1, 2)
    assert record.predicted_gain is not None and record.predicted_gain >= 0.1
    assert actions[1] == m.RequestCheckpoint(names(pods(job, plan1, 1)), 1)

    # The annotation landed; no new checkpoint yet: nothing more to do, nothing repeated.
    for body in old:
        body["metadata"]["annotations"] |= {"sailplan.dev/checkpoint-request": "1"}
    inputs = observe(job, plan1, old, nodes(4), grown)
    assert replay(state, inputs, NOW + timedelta(seconds=5)) == (state, ())

    # The trainer checkpointed and exited 0: Switching deletes the old pod...
    for body in old:
        body["status"] = {"phase": "Succeeded"}
    inputs = observe(job, plan1, old, nodes(4), grown)
    switching, actions = replay(state, inputs, NOW + timedelta(seconds=40))
    assert switching.phase == "Switching"
    assert switching.last_drain_seconds == 40.0  # measured, reused as the next restart cost
    assert actions == (m.DeletePods(names(pods(job, plan1, 1))),)

    # ...and once it is gone (its node free again: the pass counts nodes from the live
    # pods, not from the status written before), creates generation 2 and runs it.
    inputs = observe(job, plan1, [], nodes(4), [gpupool(4, 4)])
    running, actions = replay(switching, inputs, NOW + timedelta(seconds=50))
    assert (running.phase, running.generation, running.attempt) == ("Running", 2, 0)
    create = actions[0]
    assert isinstance(create, m.CreateChildren) and (create.generation, create.attempt) == (2, 0)
    assert create.plan.world_size > plan1.world_size


def switching_to_four_nodes(job: TrainingJob, plan1: Plan) -> ReplanState:
    """A switch from plan1 (one node) to a plan on four, its old pod being deleted."""
    old = pods(job, plan1, 1)
    state, _ = replay(
        running_state(job, plan1), observe(job, plan1, old, nodes(4), [gpupool(4, 3)]), NOW
    )
    assert state.phase == "Draining"
    for body in old:
        body["status"] = {"phase": "Succeeded"}
    switching, _ = replay(state, observe(job, plan1, old, nodes(4), [gpupool(4, 3)]), NOW)
    target = switching.target()
    assert switching.phase == "Switching" and target is not None and target.world_size == 16
    return switching


@pytest.mark.parametrize("left", [0, 1])
def test_a_switch_whose_capacity_was_taken_meanwhile_plans_again(plan1: Plan, left: int) -> None:
    # While the old pod went, another job (of higher rank, whose pass came later) took
    # nodes the target counted on: only `left` free nodes remain when the old pod is gone.
    # The target's workers are not created to wait for nodes they will not get: the job
    # plans again on what is left, or waits.
    job = make_job()
    switching = switching_to_four_nodes(job, plan1)
    inputs = observe(job, plan1, [], nodes(4), [gpupool(4, left)])
    after, actions = replay(switching, inputs, NOW + timedelta(seconds=10))
    created = [a for a in actions if isinstance(a, m.CreateChildren)]
    assert all(not t.plan_shortfall(a.plan, inputs.cluster) for a in created)
    if left == 0:
        assert (after.phase, after.generation, created) == ("Waiting", 1, [])
        assert after.trigger == t.CAPACITY_LOST and m.job_phase(after) == "Unschedulable"
        assert after.target() is None
    else:
        # Generation 2 was announced (its switch is in the history): the new plan is 3.
        assert (after.phase, after.generation, after.trigger) == ("Running", 3, t.CAPACITY_LOST)
        assert [(a.generation, a.plan.world_size) for a in created] == [(3, GPUS_PER_NODE)]


def draining_state(job: TrainingJob, plan: Plan) -> ReplanState:
    """A switch to generation 2 waiting since NOW for a checkpoint newer than step 100."""
    return running_state(job, plan).model_copy(
        update={
            "phase": "Draining",
            "target_generation": 2,
            "target_attempt": 0,
            "target_plan": plan.to_json(),
            "since": NOW,
            "drain_checkpoint_step": 100,
        }
    )


def test_drain_ends_on_a_new_checkpoint_or_the_timeout(plan1: Plan) -> None:
    job = make_job()
    state = draining_state(job, plan1)
    inputs = observe(job, plan1, pods(job, plan1, 1), nodes(1), [gpupool(1, 0)])
    # Rank 0's reading (controller.progress.attach) reports checkpoint 120.
    progress = TrainerProgress(step=120, last_checkpoint_step=120, plan_generation=1)
    first, *rest = inputs.pods
    checkpointed = dataclasses.replace(
        inputs, pods=(dataclasses.replace(first, progress=progress), *rest)
    )
    after, _ = replay(state, checkpointed, NOW)
    assert after.phase == "Switching"  # checkpoint 120 is newer than 100 at drain start
    stuck = pods(job, plan1, 1)
    inputs = observe(job, plan1, stuck, nodes(1), [gpupool(1, 0)])
    assert replay(state, inputs, NOW + timedelta(seconds=299))[0].phase == "Draining"
    late, _ = replay(state, inputs, NOW + timedelta(seconds=300))  # drainTimeoutSeconds
    assert late.phase == "Switching"
    assert late.last_drain_seconds is None  # a timeout is not a measurement


def test_cooldown_delays_voluntary_but_not_involuntary(plan1: Plan) -> None:
    job = make_job(replan={"cooldownSeconds": 300})
    state = running_state(job, plan1, last_switch_time=NOW - timedelta(seconds=10))
    old = pods(job, plan1, 1)
    grown = observe(job, plan1, old, nodes(4), [gpupool(4, 3)])
    assert replay(state, grown, NOW) == (state, ())  # capacity added within the cooldown
    after, _ = replay(state, grown, NOW + timedelta(seconds=291))
    assert after.phase == "Draining"  # the cooldown is over
    preempted = pods(
        job, plan1, 1, phase="Failed", conditions=[{"type": "DisruptionTarget", "status": "True"}]
    )
    lost = observe(job, plan1, preempted, nodes(4), [gpupool(4, 3)])
    switched, actions = replay(state, lost, NOW)
    # Involuntary: straight to Switching (no draining a dead pod), cooldown ignored.
    assert switched.phase == "Switching" and switched.trigger == t.WORKER_PREEMPTED
    assert switched.failures.restarts == 0  # preemptions never spend the budget
    assert "DeletePods" in kinds(actions)


def test_workers_that_never_got_a_node_are_replaced_without_a_drain(plan1: Plan) -> None:
    # The plan's workers still wait for a node (the pool's zone gave none: a stockout) when
    # the capacity they were planned on is gone; V100s exist elsewhere. No worker runs, so
    # none can write a checkpoint: switch at once instead of waiting drainTimeoutSeconds.
    job = make_job()
    state = running_state(job, plan1)
    waiting = pods(job, plan1, 1, phase="Pending")
    for body in waiting:
        body["spec"] = {k: v for k, v in body["spec"].items() if k != "nodeName"}
    v100 = pool("v100", "v100-ondemand", {ZONE: 2}, gpu_type="V100-16")
    inputs = observe(job, plan1, waiting, nodes(0), [gpupool(0, 0), v100])
    switched, actions = replay(state, inputs, NOW)
    assert switched.phase == "Switching" and switched.trigger == t.CAPACITY_LOST
    assert "RequestCheckpoint" not in kinds(actions)
    assert m.DeletePods(names(waiting)) in actions


def test_workers_gone_with_their_nodes_and_no_capacity_wait_without_pods(plan1: Plan) -> None:
    # The pods went with their nodes (the pod garbage collector removed them before the
    # job looked): no disrupted pod to see, only capacity the plan counted that is gone.
    # Nothing runs, so nothing is kept: the job waits, Unschedulable, and does not recreate
    # its workers Pending on capacity that is not there (where they reserved GPUs and kept
    # it from ever showing as waiting).
    job = make_job()
    state = running_state(job, plan1)
    inputs = observe(job, plan1, [], nodes(0), [gpupool(0, 0)])
    waiting, actions = replay(state, inputs, NOW)
    assert waiting.phase == "Waiting" and waiting.trigger == t.CAPACITY_LOST
    assert m.job_phase(waiting) == "Unschedulable"
    again, actions = replay(waiting, inputs, NOW + timedelta(seconds=30))
    assert again == waiting and "CreateChildren" not in kinds(actions)


def test_no_capacity_waits_and_resumes_by_itself(plan1: Plan) -> None:
    job = make_job()
    state = running_state(job, plan1)
    # The only node vanished with our worker on it; the pool has nothing left.
    gone = pods(job, plan1, 1)
    inputs = observe(job, plan1, gone, {}, [gpupool(0, 0)])
    waiting, actions = replay(state, inputs, NOW)
    assert waiting.phase == "Waiting" and waiting.trigger == t.NODE_LOST
    assert m.replanning_condition(waiting, 1).status == "True"
    assert m.job_phase(waiting) == "Unschedulable"
    assert actions[-1] == m.DeletePods(names(pods(job, plan1, 1)))
    # Nothing changes: no planning, no new action beyond cleaning up the old pod.
    assert replay(waiting, observe(job, plan1, [], {}, [gpupool(0, 0)]), NOW)[0] == waiting
    # Two nodes come back: plan for them and switch to generation 2.
    back = observe(job, plan1, [], nodes(2), [gpupool(2, 2)])
    resumed, actions = replay(waiting, back, NOW + timedelta(minutes=5))
    assert (resumed.phase, resumed.generation) == ("Running", 2)
    assert "CreateChildren" in kinds(actions)


FAILED = {
    "phase": "Failed",
    "containerStatuses": [{"state": {"terminated": {"exitCode": 3}}}],
}


def test_real_failures_back_off_count_once_and_exhaust_the_budget(plan1: Plan) -> None:
    job = make_job(failure={"maxRestarts": 1})
    state = running_state(job, plan1)
    failed = pods(job, plan1, 1, **FAILED)
    inputs = observe(job, plan1, failed, nodes(1), [gpupool(1, 0)])
    restart, actions = replay(state, inputs, NOW)
    assert restart.phase == "Switching" and restart.target_attempt == 1
    assert restart.failures.restarts == 1
    assert restart.not_before == NOW + timedelta(seconds=10)  # base delay, first restart
    # The same failed pod seen again before the backoff ends: not counted twice, no action.
    again, actions = replay(restart, inputs, NOW + timedelta(seconds=5))
    assert again == restart and actions == ()
    # After the backoff: the failed pod is deleted, then attempt 1 is created.
    after, actions = replay(restart, inputs, NOW + timedelta(seconds=10))
    assert actions == (m.DeletePods(names(pods(job, plan1, 1))),)
    later = NOW + timedelta(seconds=15)
    running, actions = replay(after, observe(job, plan1, [], nodes(1), [gpupool(1, 1)]), later)
    assert (running.generation, running.attempt) == (1, 1)
    assert isinstance(actions[0], m.CreateChildren) and actions[0].attempt == 1
    # Attempt 1 fails too: the one restart allowed is spent, the job fails with the reason.
    failed = pods(job, plan1, 1, attempt=1, **FAILED)
    final, actions = replay(running, observe(job, plan1, failed, nodes(1), [gpupool(1, 0)]), NOW)
    assert final.phase == "Failed"
    assert "opt-g1-a1-w0" in final.message and "exit code 3" in final.message
    assert final.failures.restarts == 2


def test_backoff_doubles_up_to_the_cap(plan1: Plan) -> None:
    # Restarts 1, 2, 3 wait 10, 20, 40 s; the cap (600 s) stops the doubling at the 7th.
    job = make_job(failure={"maxRestarts": 10})
    delays = []
    for restarts in (0, 1, 2, 6):
        state = running_state(job, plan1).model_copy(
            update={"failures": FailureBudget(restarts=restarts)}
        )
        failed = observe(job, plan1, pods(job, plan1, 1, **FAILED), nodes(1), [gpupool(1, 0)])
        after, _ = m.next_state(state, failed, NOW, CONTEXT)
        assert after.not_before is not None
        delays.append((after.not_before - NOW).total_seconds())
    assert delays == [10, 20, 40, 600]


def test_the_jobs_drain_timeout_ends_the_drain_earlier(plan1: Plan) -> None:
    # Same stuck drain as above (no new checkpoint, the worker still runs), but the job allows
    # only 60 s: at 60 s it switches, where the operator default (300 s) still waits.
    job = make_job(replan={"drainTimeoutSeconds": 60})
    state = draining_state(job, plan1)
    stuck = observe(job, plan1, pods(job, plan1, 1), nodes(1), [gpupool(1, 0)])
    context = job_context(job)
    assert replay(state, stuck, NOW + timedelta(seconds=59), context)[0].phase == "Draining"
    assert replay(state, stuck, NOW + timedelta(seconds=60), context)[0].phase == "Switching"
    assert replay(state, stuck, NOW + timedelta(seconds=60))[0].phase == "Draining"


def test_backoff_doubles_from_the_jobs_base_up_to_its_cap(plan1: Plan) -> None:
    # backoffSeconds 30, maxBackoffSeconds 100: restarts 1, 2, 3, 4 wait 30, 60, then
    # min(100, 120) and min(100, 240); the operator defaults would give 10, 20, 40, 80.
    job = make_job(failure={"maxRestarts": 10, "backoffSeconds": 30, "maxBackoffSeconds": 100})
    context = job_context(job)
    delays = []
    for restarts in (0, 1, 2, 3):
        state = running_state(job, plan1).model_copy(
            update={"failures": FailureBudget(restarts=restarts)}
        )
        failed = observe(job, plan1, pods(job, plan1, 1, **FAILED), nodes(1), [gpupool(1, 0)])
        after, _ = replay(state, failed, NOW, context)
        assert after.not_before is not None
        delays.append((after.not_before - NOW).total_seconds())
    assert delays == [30, 60, 100, 100]


def test_lost_status_write_replays_the_same_work(plan1: Plan) -> None:
    # The operator writes the new state, then dies before performing the actions. The next
    # pass sees the new state and the OLD world and must issue the lost work again.
    job = make_job()
    old = pods(job, plan1, 1)
    grown = [gpupool(4, 3)]
    draining, actions = m.next_state(
        running_state(job, plan1), observe(job, plan1, old, nodes(4), grown), NOW, CONTEXT
    )
    again, replayed = replay(draining, observe(job, plan1, old, nodes(4), grown), NOW)
    assert again == draining
    assert replayed == tuple(a for a in actions if isinstance(a, m.RequestCheckpoint))
    # Switching whose delete was lost deletes again; Running(2) whose creates were lost
    # creates again (the worker renderer uses fixed names, so a duplicate is a 409).
    switching = draining.model_copy(update={"phase": "Switching"})
    _, deletes = replay(switching, observe(job, plan1, old, nodes(4), grown), NOW)
    assert deletes == (m.DeletePods(names(pods(job, plan1, 1))),)
    target = draining.target()
    assert target is not None
    running2 = draining.model_copy(
        update={
            "phase": "Running",
            "generation": 2,
            "target_generation": None,
            "target_attempt": None,
            "target_plan": None,
        }
    )
    _, creates = replay(running2, observe(job, target, [], nodes(4), [gpupool(4, 4)]), NOW)
    assert creates == (m.CreateChildren(2, 0, target),)


def test_cordoned_node_drains_without_a_gain_check(plan1: Plan) -> None:
    # The worker's node is cordoned (a drain is coming) and a second node is free. Moving is
    # not optional, so the gain threshold (set impossibly high) does not apply; the worker is
    # alive, so it checkpoints first (Draining), unlike after a preemption.
    job = make_job(replan={"minPredictedGain": 10})
    cordoned = NodeInfo(
        "n0", {ZONE_LABEL: ZONE, NODEPOOL_LABEL: "a100-ondemand"}, ready=True, unschedulable=True
    )
    inputs = observe(job, plan1, pods(job, plan1, 1), nodes(2, n0=cordoned), [gpupool(2, 1)])
    state, actions = replay(running_state(job, plan1), inputs, NOW)
    assert state.phase == "Draining" and state.trigger == t.NODE_CORDONED
    assert "RequestCheckpoint" in kinds(actions)


def test_measured_profiles_for_an_estimated_plan_are_judged_once(plan1: Plan) -> None:
    # plan1 was made from estimates only; a measured A100 profile arrives (profiling policy
    # Auto). The job re-judges its plan once with the measurement, whatever the outcome,
    # and then not again for the same store content.
    assert plan1.inputs.estimated
    measured = ProfileSet(
        compute=(
            ComputeProfile(
                model="OPT-350M",
                gpu_type="A100-40",
                tensor_parallel=4,
                micro_batch_size=1,
                forward_s=(0.001,) * MODEL.num_layers,
                backward_s=(0.002,) * MODEL.num_layers,
                update_s=(0.0001,) * MODEL.num_layers,
                provenance=Provenance(source="measured", tool="sailplan-profile"),
            ),
        )
    )
    job = make_job()
    state = running_state(job, plan1)
    base = observe(job, plan1, pods(job, plan1, 1), nodes(1), [gpupool(1, 0)])
    inputs = dataclasses.replace(base, measured=measured)
    judged, actions = replay(state, inputs, NOW)
    assert judged.evaluated_profiles == t.profiles_fingerprint(measured)
    assert judged.evaluated_profiles != state.evaluated_profiles
    assert actions  # an Event says what was decided (kept or switching)
    assert replay(judged, inputs, NOW) == (judged, ())


def test_a_lagging_pool_status_does_not_force_a_replan(plan1: Plan) -> None:
    # The GPUPool status still says zero ready nodes (computed before n0 came back) while our
    # worker already runs on the healthy n0. A running plan fits by definition: no switch,
    # no planner call, no action; only the new snapshot is recorded.
    job = make_job()
    state = running_state(job, plan1)
    inputs = observe(job, plan1, pods(job, plan1, 1), nodes(1), [pool("a100", "a100-ondemand", {})])
    after, actions = replay(state, inputs, NOW)
    assert (after.phase, after.generation, actions) == ("Running", 1, ())
    assert after.evaluated_cluster_hash == inputs.cluster.content_hash()


def test_history_entry_and_condition_fit_todays_crd(plan1: Plan) -> None:
    # The switch record folds trigger, gain and the old plan into the existing history
    # entry's reason; the Replanning condition is False (Stable) while simply running.
    record = SwitchRecord(
        time=NOW,
        trigger=t.CAPACITY_ADDED,
        message="a100: +12 GPUs",
        from_generation=1,
        to_generation=2,
        from_summary="1 stages x DP 1",
        to_summary="5 stages x DP 1",
        predicted_gain=0.35,
        predicted_samples_per_second=20.2,
    )
    entry = m.history_entry(record)
    assert (entry.generation, entry.summary) == (2, "5 stages x DP 1")
    assert entry.reason == (
        "CapacityAdded: a100: +12 GPUs, predicted gain +35.0% (from generation 1: 1 stages x DP 1)"
    )
    condition = m.replanning_condition(running_state(make_job(), plan1), 4)
    assert (condition.status, condition.reason, condition.observed_generation) == (
        "False",
        "Stable",
        4,
    )
    assert m.job_phase(running_state(make_job(), plan1)) is None
