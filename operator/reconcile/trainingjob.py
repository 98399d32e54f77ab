"""One reconcile pass of a TrainingJob, as a pure function.

`reconcile(observed, planner, catalog, now, config)` looks at the job, the GPUPools, the nodes, the
job's plan ConfigMaps and worker pods (all as stored in the cluster) and returns what to
create, delete and annotate, the job's new status and the Events to record.

The first pass plans and starts generation 1. Every later pass hands the pods and the
cluster to the replan state machine (replan.machine), whose state is part of the
operator's memory of the job (`job.memory`, read from its state ConfigMap; the pass returns
the new memory as `Outcome.memory`: reconcile.memory): it tells preemptions from real
failures (only the latter spend spec.failure.maxRestarts, after a backoff), replans at once
onto what remains when capacity is lost, waits when nothing fits, and switches voluntarily
(checkpoint first, then new pods) when new capacity, prices or the objective make another
plan worth its restart cost. The current plan is the one of the memory's replan
generation, not the newest ConfigMap, so a switch the operator was interrupted in is
resumed, never half-adopted. A job whose memory lost its replan state adopts the newest
plan ConfigMap and recreates only the missing pods.

The batch fields come first: a job whose spec.managedBy names another controller is left
alone (Outcome.managed False: nothing is written); a finished job only waits for
spec.ttlSecondsAfterFinished (Outcome.delete_job); one active past
spec.activeDeadlineSeconds since status.startTime fails and loses its workers. A suspended
job that never planned stays without a plan; once it has one, the replan machine drains
and suspends it, and resumes it with a new plan.

The planner answers at once (sailplan.operator.search): while its search runs the pass
reports condition Planning and changes nothing else, and the planning service wakes the job
when the search ends. Each path of the pass states what it found as `Facts`; the status
conditions follow from them through the table in reconcile.conditions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sailplan.operator.api import trainingjob as api
from sailplan.operator.api.common import Condition, find_condition, set_condition
from sailplan.operator.api.gpupool import GPU_TYPE_RESOLVED, REASON_UNKNOWN_GPU_TYPE, GPUPool
from sailplan.operator.api.memory import JobMemory
from sailplan.operator.api.trainingjob import (
    PlanHistoryEntry,
    PlanSummary,
    Progress,
    TrainingJob,
    TrainingJobStatus,
    WorkerCounts,
)
from sailplan.operator.profiling.status import COND_PROFILING, ObservedJob
from sailplan.operator.profiling.step import Collect, ProfilingStep, profiling_step, reserve
from sailplan.operator.reconcile import kueue, naming, provisioning
from sailplan.operator.reconcile.children import (
    Children,
    RenderError,
    controller_uid,
    desired_children,
)
from sailplan.operator.reconcile.conditions import (
    CurrentPlan,
    Facts,
    Problem,
    conditions,
    phase_of,
    planning_condition,
)
from sailplan.operator.reconcile.nodes import NodeInfo
from sailplan.operator.reconcile.snapshot import PoolSelectionError, select_pools
from sailplan.operator.reconcile.summary import KubeEvent, summarize
from sailplan.operator.replan import machine, triggers
from sailplan.operator.replan.decision import (
    ReplanConfig,
    ReplanContext,
    ReplanInputs,
    effective_config,
    plan_request,
)
from sailplan.operator.replan.state import (
    PHASE_DRAINING,
    PHASE_SUSPENDED,
    PHASE_SWITCHING,
    ReplanState,
    SwitchRecord,
)
from sailplan.operator.search import Planner, PlannerAnswer, SearchFailed, Searching
from sailplan.planner.api import Infeasible, PlanRequest
from sailplan.planner.catalog import Catalog, UnknownModelError
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.workerenv import CHECKPOINT_REQUEST_ANNOTATION

# While a search runs the pass is repeated this often, so the Planning condition's elapsed
# time stays current; the planning service wakes the job as soon as the search ends.
SEARCH_REFRESH_SECONDS = 15.0


@dataclass
class _AskedPlanner:
    """The pass's planner, remembering its last answer for the Planning condition."""

    planner: Planner
    answer: PlannerAnswer | None = None

    def __call__(self, request: PlanRequest, measured: ProfileSet) -> PlannerAnswer:
        self.answer = self.planner(request, measured)
        return self.answer


# -- observed state ------------------------------------------------------------------------
@dataclass(frozen=True)
class ObservedPlan:
    name: str
    generation: int
    plan: Plan
    owner_uid: str = ""


@dataclass(frozen=True)
class Observed:
    job: TrainingJob
    pools: tuple[GPUPool, ...] = ()
    plans: tuple[ObservedPlan, ...] = ()
    pods: tuple[triggers.WorkerPod, ...] = ()
    service_exists: bool = False
    measured: ProfileSet = field(default_factory=ProfileSet)
    # Every node by name; a worker whose node is missing here is on a node that is gone.
    nodes: Mapping[str, NodeInfo] = field(default_factory=dict)
    profiling_jobs: tuple[ObservedJob, ...] = ()
    # The job's Kueue Workloads (reconcile.kueue), read only for a job with a queue name;
    # None: the API server does not serve them (Kueue is not installed).
    workloads: tuple[kueue.ObservedWorkload, ...] | None = ()
    # The value of the workers' PriorityClass, for that Workload (read for queued jobs).
    workload_priority: int = 0
    # The Workloads come from a watch: a change of theirs runs a pass, none is polled.
    workloads_watched: bool = False


def observed_pod(body: Mapping[str, Any]) -> triggers.WorkerPod | None:
    """A worker pod as the reconcile sees it; None if it lacks the operator's labels."""
    return triggers.pod_facts(body)


def observed_plan(body: Mapping[str, Any]) -> ObservedPlan | None:
    metadata = body.get("metadata") or {}
    labels = metadata.get("labels") or {}
    try:
        generation = int(labels[naming.LABEL_GENERATION])
        plan = Plan.from_json((body.get("data") or {})[naming.PLAN_KEY])
    except (KeyError, ValueError):
        return None
    return ObservedPlan(
        name=str(metadata.get("name", "")),
        generation=generation,
        plan=plan,
        owner_uid=controller_uid(metadata),
    )


# -- outcome -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    status: TrainingJobStatus
    create: tuple[dict[str, Any], ...] = ()
    delete_pods: tuple[str, ...] = ()
    events: tuple[KubeEvent, ...] = ()
    plan_result: str | None = None  # "planned" | "infeasible" when the planner ran
    # (pod name, annotations to merge): the checkpoint request of a planned switch.
    annotate_pods: tuple[tuple[str, dict[str, str]], ...] = ()
    # Run the next pass after this many seconds even if nothing changes (backoff, drain).
    requeue_after: float | None = None
    # Profiling needs whose Jobs succeeded: the handler reads their results into the store.
    collect: tuple[Collect, ...] = ()
    # spec.ttlSecondsAfterFinished has passed: delete the TrainingJob (its children follow
    # through their ownerReferences); nothing else is written.
    delete_job: bool = False
    # False: spec.managedBy names another controller; the handler writes nothing at all.
    managed: bool = True
    # Kueue Workloads of earlier plan generations or of a finished job (reconcile.kueue).
    delete_workloads: tuple[str, ...] = ()
    # The operator's memory of the job after this pass (its state ConfigMap); None leaves
    # it as stored.
    memory: JobMemory | None = None
    # (name, merge patch): an earlier Workload carried over to the plan (reconcile.kueue).
    patch_workloads: tuple[tuple[str, dict[str, Any]], ...] = ()


# -- helpers -------------------------------------------------------------------------------
def resolve_model(job: TrainingJob, catalog: Catalog) -> ModelSpec:
    """The model to train; raises UnknownModelError or ValueError with a one-line reason."""
    ref = job.spec.model
    if ref.name is not None:
        model = catalog.model(ref.name)
    elif ref.custom is not None:
        model = ref.custom.to_model_spec()
    else:  # the CRD's CEL rule makes this unreachable through the API server
        raise ValueError("spec.model: set exactly one of name and custom")
    length = job.spec.training.sequence_length
    if length is not None and model.architecture == "convnet":
        raise ValueError(
            f"spec.training.sequenceLength: {model.name} is a convnet, it has no sequence length"
        )
    if length is not None and length != model.sequence_length:
        model = ModelSpec.model_validate(model.model_dump() | {"sequence_length": length})
    return model


def plan_summary(plan: Plan, generation: int) -> PlanSummary:
    predictions = plan.predictions
    energy = predictions.energy if predictions else None
    return PlanSummary(
        generation=generation,
        config_map="",  # filled by the caller, which knows the job name
        summary=summarize(plan),
        pipeline_depth=plan.pipeline_depth,
        data_parallel=plan.data_parallel,
        workers=len(plan.workers()),
        gpus=plan.world_size,
        gpus_by_pool=plan.gpus_by_pool(),
        micro_batch_size=plan.micro_batch_size,
        predicted_samples_per_second=predictions.samples_per_second if predictions else None,
        predicted_usd_per_hour=predictions.usd_per_hour if predictions else None,
        predicted_iteration_seconds=predictions.iteration_seconds if predictions else None,
        predicted_joules_per_iteration=energy.joules_per_iteration if energy else None,
        predicted_joules_per_iteration_default=(
            energy.joules_per_iteration_default if energy else None
        ),
        cluster_hash=plan.inputs.cluster_hash,
        estimated_profiles=plan.inputs.estimated,
    )


def _with_conditions(
    status: TrainingJobStatus, new: list[Condition], now: datetime
) -> TrainingJobStatus:
    current = status.conditions
    for condition in new:
        current = set_condition(current, condition, now)
    return status.model_copy(update={"conditions": current})


def _concluded(status: TrainingJobStatus, facts: Facts, now: datetime) -> TrainingJobStatus:
    """`status` with the conditions the pass's facts determine (reconcile.conditions)."""
    return _with_conditions(status, conditions(facts), now)


def _next_generation(job: TrainingJob, observed: Observed, taken: tuple[int, ...] = ()) -> int:
    # Every source of truth for past generations counts, so a generation is never reused.
    seen = [p.generation for p in observed.plans] + list(taken)
    seen += [h.generation for h in job.status.history]
    if job.status.plan is not None:
        seen.append(job.status.plan.generation)
    return max(seen, default=0) + 1


_WARNING_CONDITIONS = {api.COND_INVALID, api.COND_UNSCHEDULABLE, api.COND_FAILED}
_EVENT_CONDITIONS = (
    api.COND_INVALID,
    api.COND_UNSCHEDULABLE,
    api.COND_PLANNED,
    api.COND_RUNNING,
    api.COND_SUCCEEDED,
    api.COND_FAILED,
    api.COND_SUSPENDED,
)


def _condition_events(old: TrainingJobStatus, new: TrainingJobStatus) -> list[KubeEvent]:
    """An Event for every decision: a condition that became True or changed its reason."""
    events = []
    for type_ in _EVENT_CONDITIONS:
        after = find_condition(new.conditions, type_)
        if after is None or after.status != "True":
            continue
        before = find_condition(old.conditions, type_)
        if before is not None and (before.status, before.reason, before.message) == (
            after.status,
            after.reason,
            after.message,
        ):
            continue
        kind = "Warning" if type_ in _WARNING_CONDITIONS else "Normal"
        events.append(KubeEvent(kind, after.reason if kind == "Warning" else type_, after.message))
    return events


def _finish(
    observed: Observed,
    status: TrainingJobStatus,
    *,
    create: list[dict[str, Any]] | None = None,
    delete: list[str] | None = None,
    extra_events: list[KubeEvent] | None = None,
    plan_result: str | None = None,
    memory: JobMemory | None = None,
) -> Outcome:
    """The pass's outcome; `memory` unset keeps the job's memory as it was."""
    events = _condition_events(observed.job.status, status) + (extra_events or [])
    return Outcome(
        status=status,
        create=tuple(create or ()),
        delete_pods=tuple(delete or ()),
        events=tuple(events),
        plan_result=plan_result,
        memory=memory if memory is not None else observed.job.memory,
    )


# -- the reconcile -------------------------------------------------------------------------
def manages(spec: Mapping[str, Any]) -> bool:
    """Whether this operator reconciles a job whose (unparsed) spec is `spec`: spec.managedBy
    unset or the operator's own name. Read before parsing, so a spec another controller
    owns never gets an Invalid status from this one."""
    return spec.get("managedBy") in (None, api.MANAGED_BY)


def invalid_status(
    job_status: TrainingJobStatus, generation: int, reason: str, message: str, now: datetime
) -> TrainingJobStatus:
    """Status of a job whose spec cannot be acted on (also used when the spec fails to parse)."""
    status = job_status.model_copy(
        update={"phase": api.PHASE_INVALID, "observed_generation": generation}
    )
    facts = Facts(generation, spec_checked=False, invalid=Problem(reason, message))
    return _concluded(status, facts, now)


def reconcile(
    observed: Observed,
    planner: Planner,
    catalog: Catalog,
    now: datetime,
    config: ReplanConfig | None = None,
) -> Outcome:
    """One pass; for a job with a Kueue queue name, gated on its Workload (reconcile.kueue):
    a Workload that lost its admission while workers run stops them as spec.suspend does."""
    job = observed.job
    mine = _mine(observed)
    workloads = (
        None
        if mine.workloads is None
        else tuple(w for w in mine.workloads if w.owner_uid in ("", job.uid))
    )
    live = [p.generation for p in mine.pods if not p.deleting]
    eviction = kueue.evicted(job, workloads, live)
    passed = observed
    if eviction is not None:
        suspended = job.model_copy(update={"spec": job.spec.model_copy(update={"suspend": True})})
        passed = replace(observed, job=suspended)
    outcome = _reconcile(passed, planner, catalog, now, config)
    if eviction is not None:
        # The pass saw spec.suspend; the next one must not report a resume of it.
        outcome = replace(
            outcome, events=tuple(e for e in outcome.events if e.reason != api.REASON_JOB_RESUMED)
        )
    outcome = _admitted(replace(mine, workloads=workloads), outcome, now)
    return _class_served(observed, outcome, now)


def _class_served(observed: Observed, outcome: Outcome, now: datetime) -> Outcome:
    """The job's ProvisioningClassServed condition, re-derived from its GPUPools each pass
    (reconcile.provisioning.job_class_condition): it holds across replans."""
    if not outcome.managed or outcome.delete_job:
        return outcome
    try:
        selected = select_pools(observed.job.spec.pools, observed.pools)
    except PoolSelectionError:
        return outcome
    previous = find_condition(outcome.status.conditions, provisioning.CLASS_SERVED)
    found = provisioning.job_class_condition(selected, previous)
    if found is None:
        return outcome
    found = found.model_copy(update={"observed_generation": observed.job.generation})
    return replace(outcome, status=_with_conditions(outcome.status, [found], now))


def _admitted(observed: Observed, outcome: Outcome, now: datetime) -> Outcome:
    """The pass's worker creations gated on the job's Kueue Workload (reconcile.kueue)."""
    job = observed.job
    if not kueue.queue_of(job) or not outcome.managed or outcome.delete_job:
        return outcome
    status = outcome.status
    replan = outcome.memory.replan if outcome.memory is not None else None
    generation = replan.generation if replan is not None else None
    plans = {p.generation: p.plan for p in observed.plans}
    for obj in outcome.create:
        made = observed_plan(obj) if obj["kind"] == "ConfigMap" else None
        if made is not None:
            plans.setdefault(made.generation, made.plan)
    plan = plans.get(generation) if generation is not None else None
    generation_pods: tuple[dict[str, Any], ...] = ()
    if plan is not None and generation is not None:
        try:
            pools = {p.name: p for p in observed.pools}
            generation_pods = desired_children(job, plan, generation, status.attempt, pools).pods
        except RenderError:
            generation_pods = ()
    admission = kueue.admit(
        job,
        observed.workloads,
        outcome.create,
        generation=generation,
        generation_pods=generation_pods,
        finished=status.phase in (api.PHASE_SUCCEEDED, api.PHASE_FAILED),
        previous=find_condition(job.status.conditions, kueue.COND_ADMITTED),
        priority=observed.workload_priority,
        watched=observed.workloads_watched,
    )
    if admission is None:
        return outcome
    withheld = sum(o["kind"] == "Pod" for o in outcome.create) - sum(
        o["kind"] == "Pod" for o in admission.create
    )
    events = outcome.events
    if withheld:  # the pass's "created N worker pods" did not happen
        events = tuple(e for e in events if e.reason != "PodsCreated")
    requeue = outcome.requeue_after
    if admission.requeue_after is not None:
        requeue = (
            admission.requeue_after if requeue is None else min(requeue, admission.requeue_after)
        )
    if admission.phase is not None and status.phase == api.PHASE_PENDING:
        status = status.model_copy(update={"phase": admission.phase})  # the queue holds it
    return replace(
        outcome,
        create=admission.create,
        delete_workloads=admission.delete_workloads,
        patch_workloads=admission.patch_workloads,
        status=_with_conditions(status, list(admission.conditions), now),
        events=(*events, *admission.events),
        requeue_after=requeue,
    )


def _reconcile(
    observed: Observed,
    planner: Planner,
    catalog: Catalog,
    now: datetime,
    config: ReplanConfig | None = None,
) -> Outcome:
    job = observed.job
    if job.spec.managed_by not in (None, api.MANAGED_BY):
        return Outcome(status=job.status, managed=False)  # another controller's job
    status = job.status.model_copy(update={"observed_generation": job.generation})
    if status.phase in (api.PHASE_SUCCEEDED, api.PHASE_FAILED):
        return _finished(observed, status, now)  # terminal: only the TTL is left
    # batch/v1's startTime: set when the job becomes active, unset while it is suspended.
    start = None if job.spec.suspend else (status.start_time or now)
    status = status.model_copy(update={"start_time": start})
    deadline = _deadline(job, status)
    if deadline is not None and now >= deadline:
        return _deadline_exceeded(_mine(observed), status, now)
    outcome = _active(observed, status, planner=planner, catalog=catalog, now=now, config=config)
    if outcome.status.phase in (api.PHASE_SUCCEEDED, api.PHASE_FAILED):
        finished = outcome.status.model_copy(update={"completion_time": now})
        outcome = replace(outcome, status=finished)
    elif deadline is not None:
        # Woken at the deadline even if nothing else happens to the job by then.
        left = max(1.0, (deadline - now).total_seconds())
        requeue = left if outcome.requeue_after is None else min(outcome.requeue_after, left)
        outcome = replace(outcome, requeue_after=requeue)
    return outcome


def _deadline(job: TrainingJob, status: TrainingJobStatus) -> datetime | None:
    seconds = job.spec.active_deadline_seconds
    if seconds is None or status.start_time is None:
        return None
    return status.start_time + timedelta(seconds=seconds)


def _deadline_exceeded(observed: Observed, status: TrainingJobStatus, now: datetime) -> Outcome:
    """spec.activeDeadlineSeconds passed: Failed, and every worker is deleted."""
    job = observed.job
    assert status.start_time is not None  # _deadline needs it
    message = (
        f"active longer than spec.activeDeadlineSeconds ({job.spec.active_deadline_seconds} s "
        f"since {status.start_time.isoformat()})"
    )
    facts = Facts(
        job.generation,
        spec_checked=False,
        failed=Problem(api.REASON_DEADLINE_EXCEEDED, message),
    )
    status = status.model_copy(
        update={"phase": api.PHASE_FAILED, "completion_time": now, "workers": WorkerCounts()}
    )
    live = [p.name for p in observed.pods if not p.deleting]
    return _finish(observed, _concluded(status, facts, now), delete=live)


def _finished(observed: Observed, status: TrainingJobStatus, now: datetime) -> Outcome:
    """A Succeeded or Failed job: deleted once spec.ttlSecondsAfterFinished has passed
    since status.completionTime, else woken then."""
    finished = status.completion_time or now  # finished before completionTime existed
    outcome = _finish(observed, status.model_copy(update={"completion_time": finished}))
    ttl = observed.job.spec.ttl_seconds_after_finished
    if ttl is None:
        return outcome
    left = (finished + timedelta(seconds=ttl) - now).total_seconds()
    if left <= 0:
        return replace(outcome, delete_job=True)
    return replace(outcome, requeue_after=left)


def _active(
    observed: Observed,
    status: TrainingJobStatus,
    *,
    planner: Planner,
    catalog: Catalog,
    now: datetime,
    config: ReplanConfig | None,
) -> Outcome:
    """The pass of a job that is neither finished nor past its deadline."""
    job = observed.job
    try:
        model = resolve_model(job, catalog)
    except UnknownModelError as error:
        return _finish(
            observed,
            invalid_status(status, job.generation, api.REASON_UNKNOWN_MODEL, str(error), now),
        )
    except ValueError as error:
        message = str(error).splitlines()[0]
        return _finish(
            observed,
            invalid_status(status, job.generation, api.REASON_INVALID_MODEL_SHAPE, message, now),
        )
    status = status.model_copy(update={"model": model.name})

    # Generations of stale plans still count, so new names never collide with them.
    taken = tuple(p.generation for p in observed.plans)
    observed = _mine(observed)
    replan = job.memory.replan
    if job.spec.suspend and not observed.plans and replan is None:
        # Never planned (created suspended, or suspended before its first plan): no plan,
        # no profiling Jobs, nothing reserved until spec.suspend is false.
        return _with_planning(_suspended_unplanned(observed, status, now), None, now)
    profiling = _profiling(observed, model, status)
    asked = _AskedPlanner(planner)
    if not observed.plans and replan is None:
        outcome = _plan(observed, model, status, asked, now, taken=taken, profiling=profiling)
    elif replan is not None and not observed.plans and not replan.target_plan:
        # The plan ConfigMaps were deleted under a running job: start over from a new plan.
        forgot = job.model_copy(update={"memory": job.memory.model_copy(update={"replan": None})})
        observed = replace(observed, job=forgot)
        outcome = _plan(observed, model, status, asked, now, taken=taken, profiling=profiling)
    else:
        outcome = _run(
            observed,
            model,
            status=status,
            planner=asked,
            catalog=catalog,
            now=now,
            config=effective_config(config or ReplanConfig(), job),
        )
    outcome = _with_planning(_with_profiling(outcome, profiling, now), asked.answer, now)
    return _resumed(observed, outcome, now)


def _suspended_unplanned(observed: Observed, status: TrainingJobStatus, now: datetime) -> Outcome:
    facts = Facts(observed.job.generation, suspension=api.REASON_JOB_SUSPENDED)
    status = status.model_copy(update={"phase": api.PHASE_SUSPENDED, "workers": WorkerCounts()})
    return _finish(observed, _concluded(status, facts, now))


def _resumed(observed: Observed, outcome: Outcome, now: datetime) -> Outcome:
    """Suspended turns False (reason JobResumed) on the first pass after spec.suspend was
    unset, whichever path the pass took. Not after a Kueue suspension (reconcile.kueue's
    reasons): the queue's gate sets Suspended itself."""
    was = find_condition(observed.job.status.conditions, api.COND_SUSPENDED)
    if observed.job.spec.suspend or was is None or was.status != "True":
        return outcome
    if was.reason not in (api.REASON_SUSPENDING, api.REASON_JOB_SUSPENDED):
        return outcome
    generation = observed.job.generation
    resumed = conditions(Facts(generation, spec_checked=False, suspension=api.REASON_JOB_RESUMED))
    status = _with_conditions(outcome.status, resumed, now)
    return replace(outcome, status=status, events=(*outcome.events, *_resume_event(status)))


def _resume_event(status: TrainingJobStatus) -> list[KubeEvent]:
    condition = find_condition(status.conditions, api.COND_SUSPENDED)
    return [KubeEvent("Normal", api.REASON_JOB_RESUMED, condition.message)] if condition else []


def _with_planning(outcome: Outcome, answer: PlannerAnswer | None, now: datetime) -> Outcome:
    """The Planning condition joins the status; while a search runs, the pass is repeated
    so its elapsed time stays current."""
    status = outcome.status
    previous = find_condition(status.conditions, api.COND_PLANNING)
    generation = status.observed_generation or 0
    condition = planning_condition(answer, previous, generation, now)
    if condition is None:
        return outcome
    requeue = outcome.requeue_after
    if isinstance(answer, Searching):
        requeue = (
            SEARCH_REFRESH_SECONDS if requeue is None else min(requeue, SEARCH_REFRESH_SECONDS)
        )
    return replace(
        outcome, status=_with_conditions(status, [condition], now), requeue_after=requeue
    )


def _profiling(
    observed: Observed, model: ModelSpec, status: TrainingJobStatus
) -> ProfilingStep | None:
    """The profiling side of this pass; None when the pools cannot be selected (the planning
    side reports that)."""
    try:
        selected = select_pools(observed.job.spec.pools, observed.pools)
    except PoolSelectionError:
        return None
    return profiling_step(
        observed.job,
        model,
        selected,
        observed.measured,
        jobs=observed.profiling_jobs,
        previous=find_condition(status.conditions, COND_PROFILING),
    )


def _with_profiling(outcome: Outcome, profiling: ProfilingStep | None, now: datetime) -> Outcome:
    """Profiling Jobs go first (the handler creates non-pods before pods anyway), and the
    Profiling condition joins the one status write."""
    if profiling is None or outcome.status.phase in (
        api.PHASE_SUSPENDED,
        api.PHASE_INVALID,
        api.PHASE_SUCCEEDED,
        api.PHASE_FAILED,
    ):
        return outcome
    status = outcome.status
    if profiling.condition is not None:
        status = _with_conditions(status, [profiling.condition], now)
    return replace(
        outcome,
        status=status,
        create=profiling.create + outcome.create,
        collect=profiling.collect,
        events=outcome.events + profiling.events,
    )


def _mine(observed: Observed) -> Observed:
    """Drop children of an earlier job of the same name that the garbage collector has not
    removed yet (their owner is another uid). Unowned plan ConfigMaps are kept: that is how
    a plan is handed to a job before it exists (see benchmarks/operator_scale.py)."""
    uid = observed.job.uid

    def ours(owner: str) -> bool:
        return owner in ("", uid)

    return replace(
        observed,
        plans=tuple(p for p in observed.plans if ours(p.owner_uid)),
        pods=tuple(p for p in observed.pods if ours(p.owner_uid)),
        profiling_jobs=tuple(j for j in observed.profiling_jobs if ours(j.owner_uid)),
    )


def _unschedulable(
    observed: Observed,
    status: TrainingJobStatus,
    reason: str,
    message: str,
    now: datetime,
    *,
    plan_result: str | None = None,
    memory: JobMemory | None = None,
) -> Outcome:
    facts = Facts(observed.job.generation, unschedulable=Problem(reason, message))
    status = _concluded(status.model_copy(update={"phase": api.PHASE_UNSCHEDULABLE}), facts, now)
    return _finish(observed, status, plan_result=plan_result, memory=memory)


def _plan(
    observed: Observed,
    model: ModelSpec,
    status: TrainingJobStatus,
    planner: Planner,
    now: datetime,
    *,
    taken: tuple[int, ...] = (),
    profiling: ProfilingStep | None = None,
) -> Outcome:
    job = observed.job
    generation = job.generation
    try:
        selected = select_pools(job.spec.pools, observed.pools)
    except PoolSelectionError as error:
        return _finish(
            observed, invalid_status(status, generation, api.REASON_NO_POOLS, str(error), now)
        )
    for pool in selected:
        resolved = find_condition(pool.status.conditions, GPU_TYPE_RESOLVED)
        if resolved is not None and resolved.reason == REASON_UNKNOWN_GPU_TYPE:
            message = f"GPUPool {pool.name}: {resolved.message}"
            return _finish(
                observed,
                invalid_status(status, generation, api.REASON_UNKNOWN_GPU_TYPE, message, now),
            )
    if not selected:
        return _unschedulable(
            observed, status, api.REASON_NO_POOLS, "no GPUPool matches spec.pools", now
        )
    if profiling is not None and not profiling.decision.may_plan:
        return _awaiting_profiles(observed, status, profiling, now)
    snapshot = triggers.capacity_snapshot(selected, (), observed.nodes)
    if not any(p.gpus for p in snapshot.pools):
        names = ", ".join(p.name for p in selected)
        return _unschedulable(
            observed, status, "NoCapacity", f"no free ready GPU nodes in GPUPools {names}", now
        )
    if profiling is not None and profiling.reserved_nodes:
        # Plan around the nodes profiling takes, or workers and profilers race for the same
        # GPUs; the replan machine gives them back once profiling is done.
        snapshot = reserve(snapshot, profiling.reserved_nodes)
        if not any(p.gpus for p in snapshot.pools):
            return _awaiting_profiles(
                observed,
                status,
                profiling,
                now,
                why="profiling Jobs take every free GPU node; planning when one finishes",
            )

    # An infeasible answer stands until the job or the cluster changes: the search is too
    # expensive to repeat on every resync.
    inputs = f"{job.generation}:{snapshot.content_hash()}"
    if status.phase == api.PHASE_UNSCHEDULABLE and job.memory.unschedulable_inputs == inputs:
        return _finish(observed, _concluded(status, Facts(generation), now))

    result = planner(plan_request(job, model, snapshot), observed.measured)
    # What the plan is judged against from now on (the replan machine's triggers).
    judged_cluster, judged_measured = snapshot, observed.measured
    if isinstance(result, Searching) and result.interim is not None:
        # A plan for the same spec made from other inputs still fits: start on it now (a
        # cluster that keeps moving may never let the exact search finish first), judged
        # against what it was made from, so new capacity or measurements replan.
        interim = result.interim
        result = interim.planned
        judged_cluster, judged_measured = interim.cluster, interim.measured
    if isinstance(result, Searching):
        # The Planning condition says what is searched; nothing else changes meanwhile.
        return _finish(observed, _concluded(status, Facts(generation), now))
    if isinstance(result, Infeasible | SearchFailed):
        code, reason = (
            (result.code, result.reason)
            if isinstance(result, Infeasible)
            else (api.REASON_SEARCH_FAILED, result.message)
        )
        memory = job.memory.model_copy(update={"unschedulable_inputs": inputs})
        return _unschedulable(
            observed, status, code, reason, now, plan_result="infeasible", memory=memory
        )

    plan = result.best.model_copy(update={"reason": "initial plan"})
    estimated = plan.inputs.estimated
    if estimated and job.spec.profiling.mode == "Required":
        message = (
            f"spec.profiling.mode is Required and {len(estimated)} profiles are not measured "
            f"(first: {estimated[0]}); store measured profiles to proceed"
        )
        facts = Facts(
            generation,
            awaiting_profiles=Problem(api.REASON_AWAITING_PROFILES, message),
            estimated_profiles=estimated,
        )
        status = _concluded(status.model_copy(update={"phase": api.PHASE_PENDING}), facts, now)
        return _finish(observed, status, plan_result="planned")

    plan_generation = _next_generation(job, observed, taken)
    pools = {p.name: p for p in observed.pools}
    children = desired_children(job, plan, plan_generation, 0, pools)
    summary = plan_summary(plan, plan_generation).model_copy(
        update={"config_map": naming.plan_configmap_name(job.name, plan_generation)}
    )
    history = (
        *status.history,
        PlanHistoryEntry(
            generation=plan_generation,
            time=now,
            reason=plan.reason,
            summary=summary.summary,
            predicted_samples_per_second=summary.predicted_samples_per_second,
        ),
    )[-api.MAX_HISTORY :]
    status = status.model_copy(
        update={
            "phase": api.PHASE_PENDING,
            "plan": summary,
            "history": history,
            "attempt": 0,
            "workers": WorkerCounts(desired=len(children.pods), pending=len(children.pods)),
        }
    )
    memory = JobMemory(
        replan=machine.initial_state(
            job, plan_generation, 0, plan, cluster=judged_cluster, measured=judged_measured
        )
    )
    facts = Facts(
        generation,
        estimated_profiles=estimated,
        plan=CurrentPlan(plan_generation, summary.summary, api.REASON_PLAN_CREATED),
        replan=memory.replan,
        workers=status.workers,
        overrides_ignored=children.ignored_overrides,
        overrides_reported=_overrides_reported(job, status),
    )
    status = _concluded(status, facts, now)
    create = children.in_creation_order()
    if observed.service_exists:
        create.remove(children.service)
    events = [
        KubeEvent(
            "Normal",
            "PodsCreated",
            f"created {len(children.pods)} worker pods for plan generation {plan_generation}",
        ),
        *_ignored_event(children),
    ]
    return _finish(
        observed,
        status,
        create=create,
        extra_events=events,
        plan_result="planned",
        memory=memory,
    )


def _awaiting_profiles(
    observed: Observed,
    status: TrainingJobStatus,
    profiling: ProfilingStep,
    now: datetime,
    why: str = "",
) -> Outcome:
    """No plan until profiling Jobs measured what is missing (policy Required), or until
    they leave a node to plan on (policy Auto, `why` says so)."""
    reason = profiling.condition.reason if profiling.failed and profiling.condition else ""
    facts = Facts(
        observed.job.generation,
        awaiting_profiles=Problem(
            reason or api.REASON_AWAITING_PROFILES, why or profiling.waiting_message
        ),
        profiles_missing=profiling.decision.message,
    )
    status = _concluded(status.model_copy(update={"phase": api.PHASE_PENDING}), facts, now)
    return _finish(observed, status)


def _bootstrap(
    observed: Observed, cluster: ClusterSnapshot, status: TrainingJobStatus
) -> tuple[ReplanState, ObservedPlan] | None:
    """The replan state of a job that has plans but no recorded state (the operator stopped
    between creating the first plan and writing the status): adopt the newest plan and the
    newest attempt of it that has pods."""
    if not observed.plans:
        return None
    current = max(observed.plans, key=lambda p: p.generation)
    status_attempt = (
        status.attempt if status.plan and status.plan.generation == current.generation else 0
    )
    attempt = max(
        [status_attempt] + [p.attempt for p in observed.pods if p.generation == current.generation]
    )
    state = machine.initial_state(
        observed.job,
        current.generation,
        attempt,
        current.plan,
        cluster=cluster,
        measured=observed.measured,
    )
    return state, current


@dataclass
class _Applied:
    """The machine's actions turned into what the handler does (and the status records)."""

    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    annotate: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    events: list[KubeEvent] = field(default_factory=list)
    created_plans: dict[int, Plan] = field(default_factory=dict)
    render_problem: str = ""


def _perform(
    observed: Observed, actions: tuple[machine.Action, ...], plans: Mapping[int, Plan]
) -> _Applied:
    job = observed.job
    pools = {p.name: p for p in observed.pools}
    existing = {p.name for p in observed.pods}
    done = _Applied()
    for action in actions:
        if isinstance(action, machine.RequestCheckpoint):
            value = {CHECKPOINT_REQUEST_ANNOTATION: str(action.generation)}
            done.annotate += [(pod, value) for pod in action.pods]
        elif isinstance(action, machine.DeletePods):
            done.delete += [p for p in action.pods if p not in done.delete]
        elif isinstance(action, machine.CreateChildren):
            try:
                children = desired_children(
                    job, action.plan, action.generation, action.attempt, pools
                )
            except RenderError as error:
                done.render_problem = str(error)
                continue
            if action.generation not in plans:
                done.create.append(children.configmap)
                done.created_plans[action.generation] = action.plan
            if not observed.service_exists:
                done.create.append(children.service)
            missing = [p for p in children.pods if p["metadata"]["name"] not in existing]
            done.create += missing
            if missing:
                done.events.append(
                    KubeEvent(
                        "Normal",
                        "PodsCreated",
                        f"created {len(missing)} worker pods for plan generation "
                        f"{action.generation} attempt {action.attempt}",
                    )
                )
                done.events += _ignored_event(children)
        elif isinstance(action, machine.EmitEvent):
            done.events.append(action.event)
    return done


def _with_switch_recorded(
    history: tuple[PlanHistoryEntry, ...], switch: SwitchRecord | None
) -> tuple[tuple[PlanHistoryEntry, ...], int]:
    """`history` with the switch the replan state holds, unless an entry already has its
    generation (each switch takes a new one), and how many preemptions that adds (0 or 1).
    The record comes from the job's memory, written before the status, so a crash between
    the two writes records it on the next pass instead of losing it."""
    if switch is None or any(h.generation == switch.to_generation for h in history):
        return history, 0
    preempted = switch.trigger in (triggers.WORKER_PREEMPTED, triggers.NODE_LOST)
    return (*history, machine.history_entry(switch)), int(preempted)


def _ignored_event(children: Children) -> list[KubeEvent]:
    """A Warning naming the spec.podTemplateOverrides entries the plan overruled."""
    if not children.ignored_overrides:
        return []
    message = "podTemplateOverrides entries ignored: " + "; ".join(children.ignored_overrides)
    return [KubeEvent("Warning", api.REASON_OVERRIDES_IGNORED, message)]


def _overrides_reported(job: TrainingJob, status: TrainingJobStatus) -> bool:
    """Whether the job's OverridesApplied condition is due even with nothing overruled."""
    reported = find_condition(status.conditions, api.COND_OVERRIDES_APPLIED) is not None
    return job.spec.pod_template_overrides is not None or reported


def _requeue_after(state: ReplanState, config: ReplanConfig, now: datetime) -> float | None:
    """When the next pass must run even if nothing in the cluster changes: the end of a
    restart backoff, or the drain timeout."""
    if state.phase == PHASE_SWITCHING and state.not_before is not None:
        return max(1.0, (state.not_before - now).total_seconds())
    if state.phase == PHASE_DRAINING and state.since is not None:
        deadline = state.since + timedelta(seconds=config.drain_timeout_seconds)
        return max(1.0, (deadline - now).total_seconds())
    return None


def _run(
    observed: Observed,
    model: ModelSpec,
    *,
    status: TrainingJobStatus,
    planner: Planner,
    catalog: Catalog,
    now: datetime,
    config: ReplanConfig,
) -> Outcome:
    """Keep the job on its plan through the replan state machine; report progress."""
    job = observed.job
    generation = job.generation
    try:
        selected = select_pools(job.spec.pools, observed.pools)
    except PoolSelectionError as error:
        return _finish(
            observed, invalid_status(status, generation, api.REASON_NO_POOLS, str(error), now)
        )
    workers = observed.pods
    cluster = triggers.capacity_snapshot(selected, workers, observed.nodes)
    plans = {p.generation: p.plan for p in observed.plans}
    adopted = False
    state = job.memory.replan
    if state is None:
        booted = _bootstrap(observed, cluster, status)
        if booted is None:  # unreachable: reconcile plans afresh when there is neither
            return _finish(observed, _concluded(status, Facts(generation), now))
        state, _ = booted
        adopted = True
    inputs = ReplanInputs(
        job=job,
        model=model,
        plan=plans.get(state.generation),
        pods=workers,
        nodes=observed.nodes,
        cluster=cluster,
        measured=observed.measured,
    )
    state, actions = machine.next_state(state, inputs, now, ReplanContext(planner, catalog, config))
    done = _perform(observed, actions, plans)

    current_plan = plans.get(state.generation) or done.created_plans.get(state.generation)
    mine = {
        p.worker_index: p
        for p in observed.pods
        if (p.generation, p.attempt) == (state.generation, state.attempt) and not p.deleting
    }
    history = status.history
    summary = status.plan
    if current_plan is not None:
        summary = plan_summary(current_plan, state.generation).model_copy(
            update={"config_map": naming.plan_configmap_name(job.name, state.generation)}
        )
    if (
        adopted
        and summary is not None
        and (status.plan is None or status.plan.generation != state.generation)
    ):
        history = (
            *history,
            PlanHistoryEntry(
                generation=state.generation,
                time=now,
                reason=(current_plan.reason if current_plan else "") or "adopted",
                summary=summary.summary,
                predicted_samples_per_second=summary.predicted_samples_per_second,
            ),
        )
    history, preempted = _with_switch_recorded(history, state.switch)
    history = history[-api.MAX_HISTORY :]

    desired = len(current_plan.workers()) if current_plan is not None else 0
    phases = [p.phase for p in mine.values()]
    counts = WorkerCounts(
        desired=desired,
        pending=max(0, desired - sum(ph in ("Running", "Succeeded", "Failed") for ph in phases)),
        running=phases.count("Running"),
        succeeded=phases.count("Succeeded"),
        failed=phases.count("Failed"),
    )
    suspension = None
    if job.spec.suspend:
        # Suspended once no pod of the job is left (deleting ones still hold their GPUs).
        gone = state.phase == PHASE_SUSPENDED and not observed.pods
        suspension = api.REASON_JOB_SUSPENDED if gone else api.REASON_SUSPENDING
    if state.phase == PHASE_SUSPENDED:
        counts = WorkerCounts()
    planned_reason = api.REASON_PLAN_ADOPTED if adopted else api.REASON_PLAN_CREATED
    previous = find_condition(status.conditions, api.COND_PLANNED)
    if not adopted and status.plan is not None and status.plan.generation != state.generation:
        planned_reason = machine.REASON_PLAN_SWITCHED
    elif not adopted and previous is not None and previous.status == "True":
        planned_reason = previous.reason
    facts = Facts(
        generation,
        plan=(
            CurrentPlan(state.generation, summary.summary, planned_reason)
            if summary is not None
            else None
        ),
        replan=state,
        workers=counts,
        workers_problem=done.render_problem,
        suspension=suspension,
        overrides_ignored=(
            tuple(dict.fromkeys(n for p in mine.values() for n in p.overrides_ignored))
            if mine
            else None
        ),
        overrides_reported=_overrides_reported(job, status),
    )

    progress = status.progress
    rank0 = mine.get(0)
    if rank0 is not None and rank0.progress is not None:
        reported = rank0.progress
        progress = Progress(
            step=reported.step,
            loss=reported.loss,
            samples_per_second=reported.samples_per_second,
            last_checkpoint_step=reported.last_checkpoint_step,
            joules_per_step=reported.joules_per_step,
            time=rank0.progress_time,
        )
    status = status.model_copy(
        update={
            "phase": phase_of(facts),
            "plan": summary,
            "history": history,
            "attempt": state.attempt,
            "restarts": state.failures.restarts,
            "preemptions": status.preemptions + preempted,
            "workers": counts,
            "progress": progress,
        }
    )
    status = _concluded(status, facts, now)
    outcome = _finish(
        observed,
        status,
        create=done.create,
        delete=done.delete,
        extra_events=done.events,
        memory=job.memory.model_copy(update={"replan": state}),
    )
    return replace(
        outcome,
        annotate_pods=tuple(done.annotate),
        requeue_after=_requeue_after(state, config, now),
    )


def pods_refused(status: TrainingJobStatus, message: str, now: datetime) -> TrainingJobStatus:
    """`status` after the API server refused to create worker pods (the handler found out
    while applying the pass): Running=False with reason PodCreateFailed and its message.
    The next pass creates the missing pods again."""
    refused = Condition(
        type=api.COND_RUNNING,
        status="False",
        reason=api.REASON_POD_CREATE_FAILED,
        message=message,
        observed_generation=status.observed_generation,
    )
    return _with_conditions(status, [refused], now)


def status_patch(status: TrainingJobStatus) -> dict[str, Any]:
    """The JSON body for the status subresource (round-trips through json for datetimes)."""
    patch: dict[str, Any] = json.loads(status.model_dump_json(by_alias=True, exclude_none=True))
    return patch


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch turning `old` into `new` (keys gone from `new` become null)."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif value != before:
            patch[key] = value
    return patch
