"""Should the job switch plans, and to which: one decision per trigger.

Lost capacity (involuntary) switches at once to the best plan for what remains, or waits
when nothing remains. A voluntary trigger (new capacity, a price change, an objective
edit) plans anew and switches only when replan.cost says the predicted gain, after the
restart cost, is worth it. The current plan is re-priced with simulate() on the NEW
snapshot and the same profiles as the candidate, so both are judged on the same prices
and the same measurements. A current plan that breaks the (edited) constraints is
switched away from whatever the gain.

Called by replan.machine with the planner the operator uses (planner.api.make_plan).
effective_config folds one job's spec.replan and spec.failure overrides into the
operator-wide ReplanConfig; the TrainingJob reconcile applies it on every pass, so an edit
to those fields takes effect at the next decision, drain deadline or restart delay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.nodes import NodeInfo
from sailplan.operator.replan.cost import (
    Evaluation,
    RestartCostModel,
    evaluate,
    fastest_to_finish,
    node_wait_seconds,
)
from sailplan.operator.replan.defaults import (
    BACKOFF_SECONDS,
    DRAIN_TIMEOUT_SECONDS,
    HORIZON_SECONDS,
    MAX_BACKOFF_SECONDS,
)
from sailplan.operator.replan.triggers import Trigger, WorkerPod, plan_shortfall
from sailplan.operator.search import Interim, Planner, SearchFailed, Searching
from sailplan.planner.api import Infeasible, Objective, PlanRequest
from sailplan.planner.catalog import Catalog
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.energy import EnergyError, simulate_energy
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Predictions
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator import MissingProfileError, PlanningContext, simulate


@dataclass(frozen=True)
class ReplanConfig:
    """Replan and restart settings: the operator's defaults (replan.defaults, restart cost
    flags of `sailplan operator run`), or one job's view of them (effective_config)."""

    restart: RestartCostModel = field(default_factory=RestartCostModel)
    horizon_seconds: float = float(HORIZON_SECONDS)
    drain_timeout_seconds: float = float(DRAIN_TIMEOUT_SECONDS)
    backoff_base_seconds: float = float(BACKOFF_SECONDS)
    backoff_cap_seconds: float = float(MAX_BACKOFF_SECONDS)


def effective_config(defaults: ReplanConfig, job: TrainingJob) -> ReplanConfig:
    """`defaults` with the job's spec.replan and spec.failure overrides: a field the job
    sets wins, an unset one keeps the operator's value.

    A job that raises backoffSeconds above the operator's cap without setting its own
    maxBackoffSeconds asked for at least that delay; the cap is raised to it rather than
    silently cutting the delay the user wrote.
    """
    replan, failure = job.spec.replan, job.spec.failure
    restart = defaults.restart
    if replan.checkpoint_bandwidth_bytes_per_second is not None:
        restart = dataclasses.replace(
            restart, storage_bytes_per_second=float(replan.checkpoint_bandwidth_bytes_per_second)
        )
    base = _or(failure.backoff_seconds, defaults.backoff_base_seconds)
    cap = (
        float(failure.max_backoff_seconds)
        if failure.max_backoff_seconds is not None
        else max(defaults.backoff_cap_seconds, base)
    )
    return dataclasses.replace(
        defaults,
        restart=restart,
        horizon_seconds=_or(replan.horizon_seconds, defaults.horizon_seconds),
        drain_timeout_seconds=_or(replan.drain_timeout_seconds, defaults.drain_timeout_seconds),
        backoff_base_seconds=base,
        backoff_cap_seconds=cap,
    )


def _or(value: int | None, default: float) -> float:
    return default if value is None else float(value)


@dataclass(frozen=True)
class ReplanContext:
    planner: Planner
    catalog: Catalog
    config: ReplanConfig = field(default_factory=ReplanConfig)


@dataclass(frozen=True)
class ReplanInputs:
    """What one pass observes, in the operator's existing types.

    `plan` is the plan of the state's current generation (the reconcile's ObservedPlan),
    `cluster` is triggers.capacity_snapshot(selected GPUPools, pods, nodes).
    """

    job: TrainingJob
    model: ModelSpec
    plan: Plan | None
    pods: tuple[WorkerPod, ...]
    nodes: Mapping[str, NodeInfo]
    cluster: ClusterSnapshot
    measured: ProfileSet = field(default_factory=ProfileSet)

    @property
    def step(self) -> int:
        steps = [p.progress.step for p in self.pods if p.progress is not None]
        if self.job.status.progress is not None:
            steps.append(self.job.status.progress.step)
        return max(steps, default=0)

    @property
    def last_checkpoint_step(self) -> int | None:
        found = [
            p.progress.last_checkpoint_step
            for p in self.pods
            if p.progress is not None and p.progress.last_checkpoint_step is not None
        ]
        progress = self.job.status.progress
        if progress is not None and progress.last_checkpoint_step is not None:
            found.append(progress.last_checkpoint_step)
        return max(found, default=None)


@dataclass(frozen=True)
class Keep:
    reason: str
    evaluation: Evaluation | None = None


@dataclass(frozen=True)
class Switch:
    plan: Plan
    reason: str
    evaluation: Evaluation | None = None
    # Set when `plan` is the planning service's interim plan: made from other inputs than
    # this pass's, which the new state records as judged so their triggers still fire.
    interim: Interim | None = None


@dataclass(frozen=True)
class Wait:
    code: str
    message: str


# Searching: the planner's search for this decision still runs; the pass changes nothing
# and the next one (when the search ends) decides.
Decision = Keep | Switch | Wait | Searching


OBJECTIVE_KINDS: Final[dict[str, Literal["throughput", "cost", "energy"]]] = {
    "Throughput": "throughput",
    "Cost": "cost",
    "Energy": "energy",
}


def wants_energy(job: TrainingJob) -> bool:
    """Whether the job's plans carry energy predictions and no-slowdown clocks: for the
    Energy objective, and for the node agent when the job opts into clocks."""
    return job.spec.objective.kind == "Energy" or job.spec.energy.clocks == "NoSlowdown"


def plan_request(job: TrainingJob, model: ModelSpec, cluster: ClusterSnapshot) -> PlanRequest:
    """The PlanRequest the job's spec asks for, on `cluster` (as the first plan was made)."""
    spec = job.spec
    return PlanRequest(
        model=model,
        global_batch_size=spec.training.global_batch_size,
        optimizer=spec.training.optimizer,
        precision=spec.training.precision_choice(),
        zero_stage=spec.training.zero_stage,
        cluster=cluster,
        objective=Objective(
            kind=OBJECTIVE_KINDS[spec.objective.kind],
            min_samples_per_second=spec.objective.min_samples_per_second,
            max_usd_per_hour=spec.objective.max_usd_per_hour,
            max_usd_per_iteration=spec.objective.max_usd_per_iteration,
        ),
        max_pipeline_depth=spec.objective.max_pipeline_depth,
        energy_predictions=wants_energy(job),
        energy_max_slowdown=spec.energy.max_slowdown if wants_energy(job) else 0.0,
        # under its deadline the search seeds itself with the plans it finds without the
        # options (engine.Search._seed_without_options), so they cost no first plan
        memory_options=True,
        deadline_seconds=(
            float(spec.planning.deadline_seconds)
            if spec.planning.deadline_seconds is not None
            else None
        ),
    )


def same_layout(a: Plan, b: Plan) -> bool:
    """Same stages, degrees, placement and batch split: switching would change nothing."""
    return (a.stages, a.micro_batch_size, a.num_micro_batches, a.pipeline_micro_batches) == (
        b.stages,
        b.micro_batch_size,
        b.num_micro_batches,
        b.pipeline_micro_batches,
    )


def reprice(
    plan: Plan,
    model: ModelSpec,
    cluster: ClusterSnapshot,
    measured: ProfileSet,
    catalog: Catalog,
    *,
    energy: bool = False,
    max_slowdown: float = 0.0,
    min_samples_per_second: float | None = None,
) -> Predictions:
    """Predictions of `plan` on `cluster`, with measured profiles and estimates elsewhere
    (the same completion planner.api.make_plan applies to the candidate); with its energy
    (planner.energy) when asked, at the clocks of the allowed slowdown as the planner
    prices them (within the throughput floor)."""
    tps = sorted({s.tensor_parallel for s in plan.stages})
    gpus = sorted({w.gpu_type for w in plan.workers()})
    profiles = complete_profiles(
        model,
        gpus,
        tps,
        [plan.micro_batch_size],
        measured=measured,
        catalog=catalog,
        optimizer=plan.optimizer,
    )
    profiles = complete_profiles(
        model, cluster.gpu_types, [], [], measured=profiles, catalog=catalog
    )
    context = PlanningContext(
        model=model, cluster=cluster, profiles=profiles, catalog=catalog, optimizer=plan.optimizer
    )
    if not energy:
        return simulate(plan, context)
    floor = min_samples_per_second
    return simulate_energy(
        plan,
        context,
        max_slowdown=max_slowdown,
        max_iteration_seconds=plan.global_batch_size / floor if floor else None,
    )


def constraint_violations(job: TrainingJob, predicted: Predictions) -> list[str]:
    objective = job.spec.objective
    problems = []
    if (
        objective.max_usd_per_hour is not None
        and predicted.usd_per_hour > objective.max_usd_per_hour
    ):
        problems.append(
            f"costs ${predicted.usd_per_hour:.2f}/h, above maxUsdPerHour {objective.max_usd_per_hour}"
        )
    if (
        objective.max_usd_per_iteration is not None
        and predicted.usd_per_iteration > objective.max_usd_per_iteration
    ):
        problems.append(
            f"costs ${predicted.usd_per_iteration:.4f}/iteration, above maxUsdPerIteration "
            f"{objective.max_usd_per_iteration}"
        )
    if (
        objective.min_samples_per_second is not None
        and predicted.samples_per_second < objective.min_samples_per_second
    ):
        problems.append(
            f"runs {predicted.samples_per_second:.1f} samples/s, below minSamplesPerSecond "
            f"{objective.min_samples_per_second}"
        )
    return problems


def decide(
    inputs: ReplanInputs,
    context: ReplanContext,
    trigger: Trigger,
    measured_drain_seconds: float | None = None,
) -> Decision:
    job, current = inputs.job, inputs.plan
    if not any(p.gpus for p in inputs.cluster.pools):
        return Wait("NoCapacity", "no free or obtainable GPU nodes in the selected GPUPools")
    result = context.planner(plan_request(job, inputs.model, inputs.cluster), inputs.measured)
    if isinstance(result, Searching):
        interim = result.interim
        if interim is not None and (trigger.involuntary or current is None):
            # Capacity is lost (or nothing runs): the best known plan that fits now beats
            # waiting for a search a moving cluster may keep re-running.
            return Switch(interim.planned.best, trigger.message, interim=interim)
        # A voluntary change is judged on the answer to exactly what was asked: Searching
        # leaves the trigger unjudged, and the pass after the search ends asks again.
        return result
    if isinstance(result, Infeasible | SearchFailed):
        code, reason = (
            (result.code, result.reason)
            if isinstance(result, Infeasible)
            else ("SearchFailed", result.message)
        )
        if trigger.involuntary or current is None:
            return Wait(code, reason)
        return Keep(f"no feasible plan on the changed cluster ({code}): {reason}")
    candidate = result.best
    remaining = max(0, job.spec.training.steps - inputs.step) * job.spec.training.global_batch_size
    if trigger.involuntary or current is None:
        if job.spec.objective.kind != "Throughput":
            return Switch(candidate, trigger.message)
        # Nodes that still have to be added are time the job does not train.
        chosen, why = fastest_to_finish(
            (candidate, *result.alternatives),
            inputs.cluster,
            remaining_samples=remaining,
            horizon_seconds=context.config.horizon_seconds,
        )
        return Switch(chosen, trigger.message if why is None else f"{trigger.message}; {why}")
    shortfall = plan_shortfall(current, inputs.cluster)
    if shortfall:
        return Switch(candidate, "the current plan no longer fits: " + "; ".join(shortfall))
    if same_layout(current, candidate):
        return Keep("the current plan is still the best plan")
    try:
        now_predicted = reprice(
            current,
            inputs.model,
            inputs.cluster,
            inputs.measured,
            context.catalog,
            energy=job.spec.objective.kind == "Energy",
            max_slowdown=job.spec.energy.max_slowdown,
            min_samples_per_second=job.spec.objective.min_samples_per_second,
        )
    except (MissingProfileError, EnergyError, KeyError, ValueError) as error:
        return Keep(f"the current plan cannot be re-priced on the new cluster: {error}")
    violations = constraint_violations(job, now_predicted)
    if violations:
        return Switch(
            candidate, "the current plan breaks the constraints: " + "; ".join(violations)
        )
    assert candidate.predictions is not None  # the planner always predicts what it returns
    evaluation = evaluate(
        job.spec.objective.kind,
        now_predicted,
        candidate.predictions,
        global_batch_size=job.spec.training.global_batch_size,
        remaining_samples=remaining,
        horizon_seconds=context.config.horizon_seconds,
        # A candidate on nodes the autoscaler must add first stands still until they come.
        restart_seconds=context.config.restart.restart_seconds(
            inputs.model, job.spec.training.optimizer, measured_drain_seconds
        )
        + node_wait_seconds(candidate, inputs.cluster),
        min_gain=job.spec.replan.min_predicted_gain,
    )
    if evaluation.worth_it:
        return Switch(candidate, evaluation.explain(), evaluation)
    return Keep(evaluation.explain(), evaluation)
