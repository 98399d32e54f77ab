"""Energy of a Plan per iteration: at default clocks, at no slowdown, and the frontier.

Every point this module reports as a plan's clocks (no slowdown, the allowed slowdown,
the frontier, and so Predictions.energy, which the node agent applies) gives each stage
replica ONE SM clock for all its passes (frequency.solve_single): a GPU holds one locked
clock, so the time and joules predicted are those of what runs. Perseus' per-pass answer
(a second clock for the warm-up/cool-down pass, frequency.solve) needs clock switching
inside the trainer, which Sailplan does not do; `EnergyReport.per_pass` carries it, when
asked, as what per-pass switching would save, never as clocks to apply. With one clock a
stage cannot slow down at no slowdown without lengthening the fill chain, so the
no-slowdown saving is small or none; a small allowed slowdown buys most of Perseus' back.

A request may allow a slowdown (PlanRequest.energy_max_slowdown, TrainingJob
spec.energy.maxSlowdown): the clocks it gets are then the least energy the frequency
planner finds with the iteration at most (1 + max_slowdown) x the default-clock time (and
no slower than max_iteration_seconds, the throughput floor's time): `EnergyReport.planned`,
the point whose clocks and energy Predictions.energy carries. At 0 it is the no-slowdown
point.

Built on simulate(): the pipeline time it predicts is the deadline, its all-reduce + update
tail is added unchanged (the optimizer step runs at the default clock; the all-reduce is a
wait at blocking power). Every data-parallel pipeline r (replica r of every stage) is a
frequency problem of its own (frequency.py) with its own replicas' GPU types, links and
micro-batch count: pipelines meet only at the gradient all-reduce, so a pipeline faster
than the slowest (helper GPUs, an uneven data split) may slow down to it -- Perseus'
extrinsic bloat, here from the plan itself.

Energy of one iteration, over every GPU g of the plan:

    E = sum_g P_b(g) x T_iteration  +  sum_g [effective energy of its forward/backward passes]
        + sum_g (P(f_max) - P_b) x its optimizer step

A stage's passes are timed as the simulator times them, its recomputation included
(CostModel.stage_seconds); an offloaded optimizer step (Stage.optimizer_offload) runs on
the CPU, so its GPUs only wait through it (blocking power, inside T_iteration).

T_iteration = max(simulator's pipeline time, the slowest pipeline under the clocks) + tail,
so at every clock at its maximum E is the default-clock energy and T the simulator's time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sailplan.planner.energy.frequency import (
    PipelineClocks,
    PipelineProblem,
    StageOptions,
    default_clocks,
    solve,
    solve_single,
)
from sailplan.planner.energy.power import EnergyModel, clock_scaled_share
from sailplan.planner.plan import EnergyPrediction, Plan, Predictions, StageClocks
from sailplan.planner.profiles.types import PowerProfile
from sailplan.planner.simulator import PlanningContext, simulate

JOULES_PER_KWH = 3.6e6
FRONTIER_POINTS = 40
# Grid of the allowed-slowdown search (EnergyReport.planned), as a fraction of the
# iteration time: each step costs one frequency solve per pipeline for every plan the
# energy objective prices (about 20 ms each on a 14-layer pipeline), so 5 points per
# 25% of slowdown; the solve at the allowance itself is always made.
SLOWDOWN_STEP = 0.05


@dataclass(frozen=True)
class FrontierPoint:
    """One frequency plan: iteration time, GPU energy, and the clocks (stage x pipeline).
    One clock per GPU (fill == steady) except EnergyReport.per_pass."""

    iteration_seconds: float
    joules_per_iteration: float
    steady_mhz: tuple[tuple[int, ...], ...]  # [stage][pipeline]
    fill_mhz: tuple[tuple[int, ...], ...]

    def stage_clocks(self) -> tuple[StageClocks, ...]:
        return tuple(
            StageClocks(steady_mhz=s, fill_mhz=f)
            for s, f in zip(self.steady_mhz, self.fill_mhz, strict=True)
        )


@dataclass(frozen=True)
class EnergyReport:
    default: FrontierPoint  # every clock at its maximum
    no_slowdown: FrontierPoint
    frontier: tuple[FrontierPoint, ...]  # fastest first, energy strictly falling; may be ()
    source: str  # "datasheet" or "measured"
    planned: FrontierPoint | None = None  # at the allowed slowdown; None = no_slowdown
    max_slowdown: float = 0.0
    # Perseus' no-slowdown point with a second clock for each stage's warm-up/cool-down
    # pass: what per-pass clock switching would save; not applied (module docstring).
    per_pass: FrontierPoint | None = None

    @property
    def chosen(self) -> FrontierPoint:
        """The clocks a job runs with: the allowed slowdown's point."""
        return self.planned if self.planned is not None else self.no_slowdown

    @property
    def saved_joules(self) -> float:
        return self.default.joules_per_iteration - self.no_slowdown.joules_per_iteration

    @property
    def saved_fraction(self) -> float:
        total = self.default.joules_per_iteration
        return self.saved_joules / total if total > 0 else 0.0

    @property
    def per_pass_saved_fraction(self) -> float | None:
        """Energy the per-pass (two-clock) no-slowdown point saves against default clocks."""
        total = self.default.joules_per_iteration
        if self.per_pass is None or total <= 0:
            return None
        return 1.0 - self.per_pass.joules_per_iteration / total

    def prediction(self) -> EnergyPrediction:
        return EnergyPrediction(
            joules_per_iteration_default=self.default.joules_per_iteration,
            joules_per_iteration=self.chosen.joules_per_iteration,
            iteration_seconds=self.chosen.iteration_seconds,
            stage_clocks=self.chosen.stage_clocks(),
            source="measured" if self.source == "measured" else "datasheet",
            max_slowdown=self.max_slowdown,
        )


def usd_for(joules: float, usd_per_kwh: float) -> float:
    if usd_per_kwh < 0:
        raise ValueError(f"energy price {usd_per_kwh} USD/kWh is below zero")
    return joules / JOULES_PER_KWH * usd_per_kwh


@dataclass(frozen=True)
class _Pipeline:
    problem: PipelineProblem
    gpus: tuple[int, ...]  # GPUs per stage replica (TP)
    blocking_watts: float  # summed over the pipeline's GPUs
    update_joules: float  # (P(f_max) - P_b) x optimizer step, summed over its GPUs


class _PlanEnergy:
    """The plan's pipelines as frequency problems, and iteration energy of a solution."""

    def __init__(
        self,
        plan: Plan,
        context: PlanningContext,
        model: EnergyModel,
        predictions: Predictions,
    ) -> None:
        self.plan = plan
        self.predictions = predictions
        self.deadline = predictions.pipeline_seconds
        self.tail = predictions.iteration_seconds - predictions.pipeline_seconds
        costs = context.costs
        mbs = plan.micro_batch_size
        catalog = context.catalog
        flash = context.constants.flash_attention
        sources = set()
        share_cache: dict[tuple[str, int, int, int], float] = {}
        self.pipelines: list[_Pipeline] = []
        self._cache: dict[tuple[object, ...], int] = {}
        self.index: list[int] = []  # pipeline r -> unique problem index
        for r in range(plan.data_parallel):
            links = []
            for sender, receiver in zip(plan.stages, plan.stages[1:], strict=False):
                boundary = costs.boundary_bytes(mbs, receiver.layer_start)
                links.append(
                    costs.boundary_seconds(
                        boundary,
                        sender.replicas[r],
                        receiver.replicas[r],
                        sender.tensor_parallel,
                        receiver.tensor_parallel,
                    )
                )
            stages: list[StageOptions] = []
            gpus: list[int] = []
            blocking = 0.0
            update = 0.0
            for i, stage in enumerate(plan.stages):
                replica = stage.replicas[r]
                tp = stage.tensor_parallel
                a, b = stage.layer_start, stage.layer_end
                table = costs.require_table(replica.gpu_type, tp, mbs)
                curve = model.curve(replica.gpu_type)
                sources.add(curve.source)
                key = (replica.gpu_type, tp, a, b)
                share = share_cache.get(key)
                if share is None:
                    spec = catalog.gpu(replica.gpu_type)
                    share = clock_scaled_share(
                        plan.model, spec, a, b, tp=tp, mbs=mbs, flash_attention=flash
                    )
                    share_cache[key] = share
                # as the simulator times the stage: with its recomputation (Stage.recompute)
                base = costs.stage_seconds(table, a, b, stage.recompute)
                factors = curve.time_factors(share)
                seconds = [base * x for x in factors]
                joules = [
                    tp * (watts - curve.blocking_watts) * t
                    for watts, t in zip(curve.load_watts, seconds, strict=True)
                ]
                order = sorted(range(len(seconds)), key=lambda k: (seconds[k], -curve.mhz[k]))
                incoming = links[i - 1] if i > 0 else 0.0
                outgoing = links[i] if i < len(links) else 0.0
                stages.append(
                    StageOptions(
                        mhz=tuple(curve.mhz[k] for k in order),
                        seconds=tuple(seconds[k] for k in order),
                        effective_joules=tuple(joules[k] for k in order),
                        links=incoming + outgoing,
                    )
                )
                gpus.append(tp)
                blocking += tp * curve.blocking_watts
                if not stage.optimizer_offload:  # offloaded: the CPU steps, the GPU waits
                    step = costs.stage_update_seconds(table, a, b, False, plan.data_parallel)
                    update += tp * (curve.load_watts[0] - curve.blocking_watts) * step
            problem = PipelineProblem(
                stages=tuple(stages),
                micro_batches=plan.micro_batches_of(r),
                fill_links=2.0 * sum(links),
            )
            signature = (problem, tuple(gpus), blocking, update)
            found = self._cache.get(signature)
            if found is None:
                found = len(self.pipelines)
                self._cache[signature] = found
                self.pipelines.append(_Pipeline(problem, tuple(gpus), blocking, update))
            self.index.append(found)
        self.source = "measured" if sources == {"measured"} else "datasheet"

    def point(self, solutions: Sequence[PipelineClocks]) -> FrontierPoint:
        """Iteration time and energy with solution solutions[u] for unique pipeline u."""
        slowest = max(solutions[u].seconds for u in self.index)
        iteration = max(self.deadline, slowest) + self.tail
        joules = 0.0
        for u in self.index:
            pipe = self.pipelines[u]
            joules += solutions[u].effective_joules + pipe.update_joules
            joules += pipe.blocking_watts * iteration
        steady = []
        fill = []
        for i in range(self.plan.pipeline_depth):
            steady.append(
                tuple(
                    self.pipelines[u].problem.stages[i].mhz[solutions[u].steady[i]]
                    for u in self.index
                )
            )
            fill.append(
                tuple(
                    self.pipelines[u].problem.stages[i].mhz[solutions[u].fill[i]]
                    for u in self.index
                )
            )
        return FrontierPoint(
            iteration_seconds=iteration,
            joules_per_iteration=joules,
            steady_mhz=tuple(steady),
            fill_mhz=tuple(fill),
        )

    def at(self, deadline: float) -> FrontierPoint:
        """One clock per stage replica (what the node agent can apply)."""
        return self.point([solve_single(p.problem, deadline) for p in self.pipelines])

    def at_per_pass(self, deadline: float) -> FrontierPoint:
        """A fill and a steady clock per stage replica (per-pass switching; not applied)."""
        return self.point([solve(p.problem, deadline) for p in self.pipelines])

    def slowed(
        self, no_slowdown: FrontierPoint, max_slowdown: float, max_iteration_seconds: float | None
    ) -> FrontierPoint:
        """The least energy with the iteration at most (1 + max_slowdown) x the no-slowdown
        time and at most max_iteration_seconds (never below no slowdown).

        The iteration's energy is the pipelines' effective energy plus the blocking power
        of every GPU for as long as the iteration lasts, so a later limit can cost more.
        Candidate limits: for each pipeline, the time of its least effective + blocking
        energy within the allowance (solve_single with watts_of_time, exact: this makes
        the answer exact for a plan whose pipelines are all alike), and every
        SLOWDOWN_STEP of slowdown plus the allowance itself, for plans whose pipelines
        differ; each limit is solved for all pipelines and the least energy is kept."""
        base = no_slowdown.iteration_seconds
        longest = (1.0 + max_slowdown) * base
        if max_iteration_seconds is not None:
            longest = min(longest, max_iteration_seconds)
        steps = int(np.floor((longest / base - 1.0) / SLOWDOWN_STEP + 1e-9))
        limits = [base * (1.0 + SLOWDOWN_STEP * j) for j in range(1, steps + 1)] + [longest]
        if longest - self.tail > self.deadline:
            watts = sum(self.pipelines[u].blocking_watts for u in self.index)
            for u, pipe in enumerate(self.pipelines):
                alike = self.index.count(u)
                own = solve_single(pipe.problem, longest - self.tail, watts_of_time=watts / alike)
                limits.append(own.seconds + self.tail)
        best = no_slowdown
        for limit in sorted(set(limits)):
            if limit - self.tail <= self.deadline:
                continue
            point = self.at(limit - self.tail)
            if point.joules_per_iteration < best.joules_per_iteration:
                best = point
        return best

    def default(self) -> FrontierPoint:
        return self.point([default_clocks(p.problem) for p in self.pipelines])

    def frontier(self, points: int) -> tuple[FrontierPoint, ...]:
        unconstrained = [solve_single(p.problem, float("inf")) for p in self.pipelines]
        longest = max([self.deadline, *(s.seconds for s in unconstrained)])
        deadlines = {self.deadline, longest, *(s.seconds for s in unconstrained)}
        if longest > self.deadline and points > 2:
            deadlines.update(float(d) for d in np.linspace(self.deadline, longest, points))
        candidates = [self.at(d) for d in sorted(deadlines) if d >= self.deadline]
        candidates.append(self.point(unconstrained))
        candidates.sort(key=lambda p: (p.iteration_seconds, p.joules_per_iteration))
        kept: list[FrontierPoint] = []
        for point in candidates:
            if not kept or point.joules_per_iteration < kept[-1].joules_per_iteration * (1 - 1e-12):
                kept.append(point)
        return tuple(kept)


def plan_energy(
    plan: Plan,
    context: PlanningContext,
    *,
    profiles: Sequence[PowerProfile] | None = None,
    predictions: Predictions | None = None,
    frontier_points: int = 0,
    max_slowdown: float = 0.0,
    max_iteration_seconds: float | None = None,
    per_pass: bool = False,
) -> EnergyReport:
    """Energy per iteration of `plan` at default clocks, at no slowdown and at the allowed
    slowdown (module docstring), the time-energy frontier when frontier_points > 0, and
    with per_pass the two-clock no-slowdown point (EnergyReport.per_pass). Power curves:
    `profiles` where given, else the context's measured ones (ProfileSet.power), else the
    catalog's datasheet model. Raises EnergyError for a GPU type without power data,
    MissingProfileError like simulate(), ValueError for a negative max_slowdown."""
    if max_slowdown < 0:
        raise ValueError(f"max_slowdown {max_slowdown} is below zero")
    model = EnergyModel(
        context.catalog, context.profiles.power_profiles() if profiles is None else profiles
    )
    predictions = predictions or simulate(plan, context)
    energy = _PlanEnergy(plan, context, model, predictions)
    no_slowdown = energy.at(energy.deadline)
    planned = (
        energy.slowed(no_slowdown, max_slowdown, max_iteration_seconds) if max_slowdown else None
    )
    frontier = energy.frontier(frontier_points) if frontier_points > 0 else ()
    return EnergyReport(
        default=energy.default(),
        no_slowdown=no_slowdown,
        frontier=frontier,
        source=energy.source,
        planned=planned,
        max_slowdown=max_slowdown,
        per_pass=energy.at_per_pass(energy.deadline) if per_pass else None,
    )


def with_energy(
    plan: Plan, context: PlanningContext, *, profiles: Sequence[PowerProfile] | None = None
) -> Plan:
    """`plan` with its predictions simulated in `context`, energy fields included."""
    return plan.model_copy(
        update={"predictions": simulate_energy(plan, context, profiles=profiles)}
    )


def simulate_energy(
    plan: Plan,
    context: PlanningContext,
    *,
    profiles: Sequence[PowerProfile] | None = None,
    max_slowdown: float = 0.0,
    max_iteration_seconds: float | None = None,
) -> Predictions:
    """simulate() plus the energy fields: the simulator's energy report (at the allowed
    slowdown)."""
    predictions = simulate(plan, context)
    report = plan_energy(
        plan,
        context,
        profiles=profiles,
        predictions=predictions,
        max_slowdown=max_slowdown,
        max_iteration_seconds=max_iteration_seconds,
    )
    return predictions.model_copy(update={"energy": report.prediction()})
