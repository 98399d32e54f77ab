"""The replanning state machine: `next_state(state, inputs, now, context) -> (state, actions)`.

    Running(N) --voluntary switch--> Draining(N -> N+1) --> Switching(N+1) --> Running(N+1)
    Running(N) --preempted/lost----> Switching(N+1)                        --> Running(N+1)
    Running(N) --real failure------> Switching(N, attempt+1, after backoff) --> Running(N)
    Running/Waiting --no capacity--> Waiting --capacity returns--> Switching(N+1)
    Running(N) --budget spent------> Failed
    any --spec.suspend--> Draining(suspend) --> Suspended --resumed--> Switching(N+1) | Waiting

Draining asks every worker for a checkpoint (CHECKPOINT_REQUEST_ANNOTATION) and waits, at
most `drain_timeout_seconds`, for their clean exit or a newer complete checkpoint in the
progress they report. Switching deletes every pod that is not the target's and creates
the target's pods only once the old ones are gone, so two generations never train (or
write checkpoints) at the same time. Suspending (spec.suspend) drains the same way, then
deletes every pod and holds none; resuming replans from nothing, like capacity returning.

Pure and deterministic: the same state and inputs give the same result, and every action
is safe to repeat (annotate to a fixed value, delete what exists, create by fixed name
with 409 = done). A switch's record rides in the state (`ReplanState.switch`): the caller
adds it to status.history when the history lacks its generation, so a crash between
writing the state and writing the status still records it on the next pass. The cooldown
only delays voluntary switches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta

from sailplan.operator.api import trainingjob as api
from sailplan.operator.api.common import Condition
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.summary import KubeEvent, summarize
from sailplan.operator.replan import triggers as t
from sailplan.operator.replan.decision import (
    Keep,
    ReplanContext,
    ReplanInputs,
    Switch,
    Wait,
    decide,
)
from sailplan.operator.replan.state import (
    MAX_COUNTED_FAILURES,
    PHASE_DRAINING,
    PHASE_FAILED,
    PHASE_RUNNING,
    PHASE_SUSPENDED,
    PHASE_SWITCHING,
    PHASE_WAITING,
    FailureBudget,
    ReplanState,
    SwitchRecord,
)
from sailplan.operator.search import Searching
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.types import ProfileSet


# -- actions (data; the caller performs them) ------------------------------------------------
@dataclass(frozen=True)
class RequestCheckpoint:
    """Set CHECKPOINT_REQUEST_ANNOTATION = str(generation) on these pods."""

    pods: tuple[str, ...]
    generation: int


@dataclass(frozen=True)
class DeletePods:
    pods: tuple[str, ...]


@dataclass(frozen=True)
class CreateChildren:
    """Create the missing children of `plan` (reconcile.children.desired_children with this
    generation and attempt): plan ConfigMap, Service, worker pods; 409 means done."""

    generation: int
    attempt: int
    plan: Plan


@dataclass(frozen=True)
class EmitEvent:
    event: KubeEvent


Action = RequestCheckpoint | DeletePods | CreateChildren | EmitEvent

REASON_REPLANNING = "Replanning"
REASON_REPLAN_SKIPPED = "ReplanSkipped"
REASON_PLAN_SWITCHED = "PlanSwitched"
REASON_DRAINING = "Draining"
REASON_NO_CAPACITY = "NoCapacity"


def initial_state(
    job: TrainingJob,
    generation: int,
    attempt: int,
    plan: Plan,
    *,
    cluster: ClusterSnapshot | None = None,
    measured: ProfileSet | None = None,
) -> ReplanState:
    """The state of a job running `plan`: judged against `cluster` and `measured` when the
    caller has the snapshot and profiles the plan was made from, else against the plan's
    recorded snapshot hash."""
    return ReplanState(
        generation=generation,
        attempt=attempt,
        evaluated_cluster_hash=cluster.content_hash() if cluster else plan.inputs.cluster_hash,
        evaluated_cluster=cluster,
        evaluated_spec=t.spec_fingerprint(job.spec),
        evaluated_profiles=t.profiles_fingerprint(measured or ProfileSet()),
    )


def history_entry(record: SwitchRecord) -> api.PlanHistoryEntry:
    """The record in today's status.history shape (trigger and gain folded into reason)."""
    gain = f", predicted gain {record.predicted_gain:+.1%}" if record.predicted_gain else ""
    return api.PlanHistoryEntry(
        generation=record.to_generation,
        time=record.time,
        reason=f"{record.trigger}: {record.message}{gain} (from generation "
        f"{record.from_generation}: {record.from_summary})",
        summary=record.to_summary,
        predicted_samples_per_second=record.predicted_samples_per_second,
    )


def suspending(state: ReplanState) -> bool:
    """The state drains for spec.suspend or is suspended (no switch is under way)."""
    return state.phase == PHASE_SUSPENDED or (
        state.phase == PHASE_DRAINING and state.trigger == t.SUSPENDED
    )


def replanning_condition(state: ReplanState, generation: int) -> Condition:
    """status.conditions[Replanning]: True while a switch or a wait is under way."""
    busy = state.phase in (PHASE_DRAINING, PHASE_SWITCHING, PHASE_WAITING) and not suspending(state)
    reason = (state.trigger or state.phase) if busy else api.REASON_NOT_REPLANNING
    message = f"{state.phase}: {state.message}" if busy else ""
    return Condition(
        type=api.COND_REPLANNING,
        status="True" if busy else "False",
        reason=reason,
        message=message,
        observed_generation=generation,
    )


def job_phase(state: ReplanState) -> str | None:
    """The TrainingJob phase the replan state implies; None = the reconcile's own (from pods)."""
    if suspending(state):
        # Suspended phase only while spec.suspend holds (the reconcile says so); a resumed
        # job still in this state waits for its new plan.
        return api.PHASE_PENDING
    return {
        PHASE_DRAINING: api.PHASE_REPLANNING,
        PHASE_SWITCHING: api.PHASE_REPLANNING,
        PHASE_WAITING: api.PHASE_UNSCHEDULABLE,
        PHASE_FAILED: api.PHASE_FAILED,
    }.get(state.phase)


# -- the machine -------------------------------------------------------------------------------
def next_state(
    state: ReplanState, inputs: ReplanInputs, now: datetime, context: ReplanContext
) -> tuple[ReplanState, tuple[Action, ...]]:
    """Advance as far as the inputs allow (e.g. Draining -> Switching -> Running in one call),
    stopping once the running generation or attempt changed."""
    actions: list[Action] = []
    for _ in range(4):
        new, step = _step(state, inputs, now, context)
        actions.extend(a for a in step if a not in actions)
        if new == state:
            break
        if (new.generation, new.attempt) != (state.generation, state.attempt):
            # Switched: the new plan is judged on the next pass, against pods and GPUPool
            # statuses observed after its pods exist (these inputs describe the old plan).
            return new, tuple(actions)
        state = new
    return state, tuple(actions)


def _step(
    state: ReplanState, inputs: ReplanInputs, now: datetime, context: ReplanContext
) -> tuple[ReplanState, list[Action]]:
    if state.phase == PHASE_FAILED:
        return state, []  # terminal, suspended or not
    if inputs.job.spec.suspend:
        return _suspend(state, inputs, now, context)
    if suspending(state):
        return _resume(state, inputs, now, context)
    if state.phase == PHASE_RUNNING:
        return _running(state, inputs, now, context)
    if state.phase == PHASE_DRAINING:
        return _draining(state, inputs, now, context)
    if state.phase == PHASE_SWITCHING:
        return _switching(state, inputs, now, context)
    if state.phase == PHASE_WAITING:
        return _waiting(state, inputs, now, context)
    return state, []


def _current(state: ReplanState, inputs: ReplanInputs) -> list[t.WorkerPod]:
    return [
        p for p in inputs.pods if (p.generation, p.attempt) == (state.generation, state.attempt)
    ]


def _live(pods: list[t.WorkerPod]) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in pods if not p.deleting))


def _running(
    state: ReplanState, inputs: ReplanInputs, now: datetime, context: ReplanContext
) -> tuple[ReplanState, list[Action]]:
    mine = _current(state, inputs)
    actions: list[Action] = []
    stale = _live([p for p in inputs.pods if p not in mine])
    if stale:
        actions.append(DeletePods(stale))
    plan = inputs.plan
    if plan is not None and mine and all(p.phase == "Succeeded" for p in mine):
        return state, actions  # training finished: nothing to replan
    report = t.classify_pods(mine, inputs.nodes)
    if report.disrupted:
        pod, why = report.disrupted[0]
        name = t.WORKER_PREEMPTED if pod.disruption else t.NODE_LOST
        extra = f" (+{len(report.disrupted) - 1} more)" if len(report.disrupted) > 1 else ""
        trigger = t.Trigger(name, why + extra, involuntary=True, graceful=False)
        new, more = _replan(state, inputs, now, context, trigger)
        return new, actions + more
    if report.failed:
        new, more = _failed(state, inputs, now, context, report)
        return new, actions + more
    hash_now = inputs.cluster.content_hash()
    forced: t.Trigger | None = None
    if report.cordoned:
        forced = t.Trigger(t.NODE_CORDONED, report.cordoned[0][1], involuntary=True)
    elif (
        plan is not None
        and _unplaced(mine, plan)
        and (shortfall := t.plan_shortfall(plan, inputs.cluster))
    ):
        # Graceful only while a worker runs (it may train on and checkpoint first); workers
        # whose pods went with their nodes, or that never got one, leave nothing to keep: with
        # no plan that fits, the job waits (Unschedulable) instead of recreating them Pending.
        forced = t.Trigger(
            t.CAPACITY_LOST,
            "; ".join(shortfall),
            involuntary=True,
            graceful=any(p.phase == "Running" for p in mine),
        )
    if forced is not None:
        if (state.trigger, state.evaluated_cluster_hash) == (forced.name, hash_now):
            return state, actions + _ensure(state, inputs, mine)  # judged already: no capacity
        new, more = _replan(state, inputs, now, context, forced)
        return new, actions + more
    voluntary = t.voluntary_trigger(
        spec=inputs.job.spec,
        evaluated_spec=state.evaluated_spec,
        cluster=inputs.cluster,
        evaluated_hash=state.evaluated_cluster_hash,
        evaluated_cluster=state.evaluated_cluster,
        plan=plan,
        measured=inputs.measured,
        evaluated_profiles=state.evaluated_profiles,
    )
    if voluntary is None:
        if state.trigger or _evaluated(state, inputs) != state:
            state = _evaluated(state, inputs).model_copy(update={"trigger": "", "message": ""})
        return state, actions + _ensure(state, inputs, mine)
    cooldown = timedelta(seconds=inputs.job.spec.replan.cooldown_seconds)
    cooling = state.last_switch_time is not None and now < state.last_switch_time + cooldown
    # An objective edit is the user's order, not a flapping node: it skips the cooldown.
    if cooling and voluntary.name != t.OBJECTIVE_CHANGED:
        return state, actions + _ensure(state, inputs, mine)
    new, more = _replan(state, inputs, now, context, voluntary)
    return new, actions + more + (_ensure(new, inputs, mine) if new.phase == PHASE_RUNNING else [])


def _unplaced(mine: list[t.WorkerPod], plan: Plan) -> bool:
    """Some worker is missing or not yet on a node. Only then can a capacity shortfall be
    real: workers that all run on healthy nodes prove the plan fits, whatever a GPUPool
    status that lags the pod informer (or vice versa) momentarily says."""
    placed = {p.worker_index for p in mine if p.node and p.phase != "Pending"}
    return len(placed) < len(plan.workers())


def _evaluated(state: ReplanState, inputs: ReplanInputs) -> ReplanState:
    return state.model_copy(
        update={
            "evaluated_cluster_hash": inputs.cluster.content_hash(),
            "evaluated_cluster": inputs.cluster,
            "evaluated_spec": t.spec_fingerprint(inputs.job.spec),
            "evaluated_profiles": t.profiles_fingerprint(inputs.measured),
        }
    )


def _ensure(state: ReplanState, inputs: ReplanInputs, mine: list[t.WorkerPod]) -> list[Action]:
    """Recreate missing workers of the running plan (e.g. after an operator restart)."""
    plan = inputs.plan
    if plan is None:
        return []
    present = {p.worker_index for p in mine}
    if len(present) >= len(plan.workers()):
        return []
    return [CreateChildren(state.generation, state.attempt, plan)]


def _next_generation(state: ReplanState, inputs: ReplanInputs) -> int:
    # Every generation ever used counts, so a number is never reused for another plan.
    seen = [state.generation, state.target_generation or 0]
    seen += [p.generation for p in inputs.pods]
    status = inputs.job.status
    seen += [h.generation for h in status.history]
    if status.plan is not None:
        seen.append(status.plan.generation)
    return max(seen) + 1


def _replan(
    state: ReplanState,
    inputs: ReplanInputs,
    now: datetime,
    context: ReplanContext,
    trigger: t.Trigger,
) -> tuple[ReplanState, list[Action]]:
    judged = _evaluated(state, inputs)
    decision = decide(inputs, context, trigger, state.last_drain_seconds)
    if isinstance(decision, Switch) and decision.interim is not None:
        # The interim plan was made from other inputs: judged against those, so new
        # capacity or measurements since still trigger a replan.
        made_from = dataclasses.replace(
            inputs, cluster=decision.interim.cluster, measured=decision.interim.measured
        )
        judged = _evaluated(state, made_from)
    if isinstance(decision, Searching):
        # Nothing is judged yet: the same trigger asks again on the next pass, which the
        # planning service runs when the search has ended.
        return state, []
    mine = _current(state, inputs)
    if isinstance(decision, Keep):
        message = f"{trigger.message}: keeping generation {state.generation}: {decision.reason}"
        event = KubeEvent("Normal", REASON_REPLAN_SKIPPED, message)
        return judged.model_copy(update={"trigger": "", "message": ""}), [EmitEvent(event)]
    if isinstance(decision, Wait):
        message = (
            f"{trigger.message}; no plan fits what remains ({decision.code}): {decision.message}"
        )
        warning = EmitEvent(KubeEvent("Warning", REASON_NO_CAPACITY, message))
        if trigger.graceful and state.phase == PHASE_RUNNING:
            # The workers still run (e.g. a cordoned node not yet drained): let them, and
            # judge again when the cluster changes.
            return judged.model_copy(update={"trigger": trigger.name, "message": message}), [
                warning
            ]
        waiting = judged.model_copy(
            update={
                "phase": PHASE_WAITING,
                "trigger": trigger.name,
                "message": message,
                "since": now,
            }
        )
        live = _live(list(inputs.pods))
        return waiting, [warning, *([DeletePods(live)] if live else [])]
    target = _next_generation(state, inputs)
    record = SwitchRecord(
        time=now,
        trigger=trigger.name,
        message=decision.reason,
        from_generation=state.generation,
        to_generation=target,
        from_summary=summarize(inputs.plan) if inputs.plan is not None else "",
        to_summary=summarize(decision.plan),
        predicted_gain=decision.evaluation.gain_fraction if decision.evaluation else None,
        restart_seconds=decision.evaluation.restart_seconds if decision.evaluation else None,
        predicted_samples_per_second=(
            decision.plan.predictions.samples_per_second if decision.plan.predictions else None
        ),
    )
    # Only a worker that runs can write a checkpoint: workers still waiting for a node (a
    # plan on capacity that never came) are replaced at once.
    drain = (
        trigger.graceful
        and state.phase == PHASE_RUNNING
        and any(p.phase == "Running" for p in mine)
    )
    new = judged.model_copy(
        update={
            "phase": PHASE_DRAINING if drain else PHASE_SWITCHING,
            "target_generation": target,
            "target_attempt": 0,
            "target_plan": decision.plan.to_json(),
            "trigger": trigger.name,
            "message": decision.reason,
            "since": now,
            "not_before": None,
            "drain_checkpoint_step": inputs.last_checkpoint_step,
            "last_switch_time": now,
            "switch": record,
        }
    )
    kind = "Warning" if trigger.involuntary else "Normal"
    text = (
        f"{trigger.name}: {decision.reason}; generation {state.generation} -> {target} "
        f"({record.to_summary})"
    )
    return new, [EmitEvent(KubeEvent(kind, REASON_REPLANNING, text))]


def _failed(
    state: ReplanState,
    inputs: ReplanInputs,
    now: datetime,
    context: ReplanContext,
    report: t.PodReport,
) -> tuple[ReplanState, list[Action]]:
    """A real failure: restart the same plan as a new attempt after an exponential backoff,
    or give up once spec.failure.maxRestarts restarts are spent.

    The budget counts restarts, one per failed attempt, however many of its ranks exited
    non-zero (they usually fail together); the failed pods' UIDs are remembered so a pass
    that sees the same failed pods again never counts them twice.
    """
    budget = state.failures
    keys = [p.key for p, _ in report.failed]
    why = report.failed[0][1]
    fresh = not set(keys) <= set(budget.counted)
    restarts = budget.restarts + (1 if fresh else 0)
    counted = tuple(dict.fromkeys((*budget.counted, *keys)))[-MAX_COUNTED_FAILURES:]
    budget = FailureBudget(restarts=restarts, counted=counted, last_failure=why)
    limit = inputs.job.spec.failure.max_restarts
    mine = _current(state, inputs)
    if restarts > limit:
        message = f"{why}; all {limit} restarts are used up"
        failed = state.model_copy(
            update={
                "phase": PHASE_FAILED,
                "failures": budget,
                "trigger": t.WORKER_FAILED,
                "message": message,
                "since": now,
            }
        )
        actions: list[Action] = [
            EmitEvent(KubeEvent("Warning", api.REASON_RESTARTS_EXHAUSTED, message))
        ]
        live = _live([p for p in mine if not p.finished])
        if live:
            actions.append(DeletePods(live))
        return failed, actions
    config = context.config
    delay = min(config.backoff_cap_seconds, config.backoff_base_seconds * 2 ** (restarts - 1))
    plan = inputs.plan
    if plan is None:  # nothing to restart; the reconcile plans afresh
        return state.model_copy(update={"failures": budget}), []
    message = f"{why}; restart {restarts}/{limit} in {delay:.0f} s"
    switching = state.model_copy(
        update={
            "phase": PHASE_SWITCHING,
            "failures": budget,
            "target_generation": state.generation,
            "target_attempt": state.attempt + 1,
            "target_plan": plan.to_json(),
            "trigger": t.WORKER_FAILED,
            "message": message,
            "since": now,
            "not_before": now + timedelta(seconds=delay),
        }
    )
    event = KubeEvent("Warning", api.REASON_RESTARTING, message)
    return switching, [EmitEvent(event)] if fresh else []


@dataclass(frozen=True)
class _Drain:
    """How a drain stands: over (clean exit, a newer checkpoint, the timeout, or workers
    that died meanwhile), or which running workers still have to be asked."""

    over: bool
    seconds: float | None  # checkpoint request to clean end; None unless clean
    ask: tuple[str, ...]


def _drain(state: ReplanState, inputs: ReplanInputs, now: datetime, timeout: float) -> _Drain:
    mine = _current(state, inputs)
    running = [p for p in mine if not p.finished and not p.deleting]
    report = t.classify_pods(mine, inputs.nodes)
    started = state.since or now
    checkpoint = inputs.last_checkpoint_step
    newer = checkpoint is not None and (
        state.drain_checkpoint_step is None or checkpoint > state.drain_checkpoint_step
    )
    timed_out = now - started >= timedelta(seconds=timeout)
    clean = not running or newer
    over = clean or timed_out or bool(report.disrupted) or bool(report.failed)
    ask = tuple(sorted(p.name for p in running if p.checkpoint_request != str(state.generation)))
    return _Drain(over, (now - started).total_seconds() if clean else None, ask)


def _draining(
    state: ReplanState, inputs: ReplanInputs, now: datetime, context: ReplanContext
) -> tuple[ReplanState, list[Action]]:
    drain = _drain(state, inputs, now, context.config.drain_timeout_seconds)
    if drain.over:
        measured = drain.seconds if drain.seconds is not None else state.last_drain_seconds
        return (
            state.model_copy(
                update={"phase": PHASE_SWITCHING, "since": now, "last_drain_seconds": measured}
            ),
            [],
        )
    return state, [RequestCheckpoint(drain.ask, state.generation)] if drain.ask else []


def _suspend(
    state: ReplanState, inputs: ReplanInputs, now: datetime, context: ReplanContext
) -> tuple[ReplanState, list[Action]]:
    """spec.suspend: running workers checkpoint and exit as for a planned switch (a switch
    under way is abandoned), then every pod is deleted and none is created until resumed."""
    live = _live(list(inputs.pods))
    if state.phase == PHASE_SUSPENDED:
        return state, [DeletePods(live)] if live else []
    message = "spec.suspend is true"
    # Only a worker that runs can be training: pods still Pending (no node yet, an image
    # pulling) have nothing to checkpoint and are deleted at once.
    running = [p for p in _current(state, inputs) if p.phase == "Running" and not p.deleting]
    if state.phase == PHASE_DRAINING and state.trigger == t.SUSPENDED:
        drain = _drain(state, inputs, now, context.config.drain_timeout_seconds)
        if not drain.over:
            return state, [RequestCheckpoint(drain.ask, state.generation)] if drain.ask else []
    elif state.phase in (PHASE_RUNNING, PHASE_DRAINING) and running:
        # A planned switch's drain already asked for the checkpoint: it keeps its clock.
        switching = state.phase == PHASE_DRAINING
        draining = state.model_copy(
            update={
                "phase": PHASE_DRAINING,
                "trigger": t.SUSPENDED,
                "message": f"{message}: workers checkpoint and exit",
                "since": state.since if switching else now,
                "drain_checkpoint_step": (
                    state.drain_checkpoint_step if switching else inputs.last_checkpoint_step
                ),
                "target_generation": None,
                "target_attempt": None,
                "target_plan": None,
                "not_before": None,
            }
        )
        return draining, []
    suspended = state.model_copy(
        update={
            "phase": PHASE_SUSPENDED,
            "trigger": t.SUSPENDED,
            "message": f"{message}: no workers run",
            "since": now,
            "target_generation": None,
            "target_attempt": None,
            "target_plan": None,
            "not_before": None,
            "drain_checkpoint_step": None,
        }
    )
    return suspended, [DeletePods(live)] if live else []


def _resume(
    state: ReplanState, inputs: ReplanInputs, now: datetime, context: ReplanContext
) -> tuple[ReplanState, list[Action]]:
    """spec.suspend unset: plan anew on today's capacity, as when capacity returns to a
    waiting job; the new generation's workers resume from the last checkpoint. A drain
    still under way is cut short (its workers are deleted before the new ones start)."""
    trigger = t.Trigger(
        t.RESUMED, "spec.suspend was set to false", involuntary=True, graceful=False
    )
    fresh = dataclasses.replace(inputs, plan=None)
    return _replan(state, fresh, now, context, trigger)


def _switching(
    state: ReplanState, inputs: ReplanInputs, now: datetime, context: ReplanContext
) -> tuple[ReplanState, list[Action]]:
    if state.not_before is not None and now < state.not_before:
        return state, []
    generation, attempt, plan = state.target_generation, state.target_attempt, state.target()
    if generation is None or attempt is None or plan is None:
        # Unreachable through next_state; a hand-edited state falls back to Running.
        return state.model_copy(update={"phase": PHASE_RUNNING}), []
    target = (generation, attempt)
    others = [p for p in inputs.pods if (p.generation, p.attempt) != target]
    live = _live(others)
    if others:
        return state, [DeletePods(live)] if live else []
    shortfall = t.plan_shortfall(plan, inputs.cluster)
    if shortfall:
        # The target was chosen before the old pods were gone; meanwhile another job (one
        # of higher rank whose pass came later) took capacity it counted on. Plan again on
        # what is left instead of creating workers that would wait for those nodes.
        trigger = t.Trigger(t.CAPACITY_LOST, "; ".join(shortfall), involuntary=True, graceful=False)
        new, actions = _replan(state, dataclasses.replace(inputs, plan=None), now, context, trigger)
        if new.phase == PHASE_WAITING:
            # The target's number stays taken (its switch is in the history), its plan goes.
            new = new.model_copy(update={"target_plan": None, "target_attempt": None})
        return new, actions
    running = state.model_copy(
        update={
            "phase": PHASE_RUNNING,
            "generation": generation,
            "attempt": attempt,
            "target_generation": None,
            "target_attempt": None,
            "target_plan": None,
            "since": now,
            "not_before": None,
            "drain_checkpoint_step": None,
        }
    )
    text = f"generation {generation} attempt {attempt}: {summarize(plan)}"
    return running, [
        CreateChildren(generation, attempt, plan),
        EmitEvent(KubeEvent("Normal", REASON_PLAN_SWITCHED, text)),
    ]


def _waiting(
    state: ReplanState, inputs: ReplanInputs, now: datetime, context: ReplanContext
) -> tuple[ReplanState, list[Action]]:
    live = _live(list(inputs.pods))
    cleanup: list[Action] = [DeletePods(live)] if live else []
    if inputs.cluster.content_hash() == state.evaluated_cluster_hash:
        return state, cleanup
    trigger = t.Trigger(
        t.CAPACITY_RETURNED,
        f"capacity changed while waiting ({state.trigger})",
        involuntary=True,
        graceful=False,
    )
    # Nothing runs: judge the best plan on its own, with no current plan to beat.
    fresh = dataclasses.replace(inputs, plan=None)
    new, actions = _replan(state, fresh, now, context, trigger)
    if new.phase == PHASE_WAITING:
        new = new.model_copy(update={"since": state.since})
    return new, cleanup + [a for a in actions if not isinstance(a, DeletePods)]
