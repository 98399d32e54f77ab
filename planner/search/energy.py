"""The search's energy terms: the energy objective's exact bound, and energy prices.

Called by engine.py.

Energy objective (api.Objective kind `energy`): the least GPU joules per iteration at each
plan's own clocks (planner/energy: one clock per stage replica, as the node agent locks
it, with the least energy at no slowdown or within the request's allowed slowdown,
PlanRequest.energy_max_slowdown), among plans that reach the throughput floor.
The search ranks every plan it prices by that energy (one frequency solve,
planner.energy.plan_energy) and prunes with a LOWER bound of it, so it is exact like the
other objectives: it drops a plan or a whole part of the search only when the bound
already exceeds the k-th best exact energy. A plan of iteration time T draws, whatever its
clocks (planner/energy/plan_energy.py's accounting):

    E >= T x sum over its GPUs of P_b  +  J_lower(micro-batch, DP)

- every GPU draws at least its blocking power P_b all iteration, and the iteration never
  gets shorter than the simulator's time at default clocks; the stage DP knows T's lower
  bound and, per usage slot, the least P_b of a pool that may serve it (slot_watts);
- J_lower: each forward/backward pass of a layer costs at least its time x the least
  effective power x time factor over the clock levels it may run at, (P(f) - P_b) t(f) /
  t(f_max), at the least clock-scaled share any stage holding that layer can have (the
  share of a range is a mediant of its layers', and the effective energy grows with the
  share), on the GPU type and TP degree that make it smallest; global batch / micro-batch
  passes of every layer; plus every replica's optimizer step at the maximum clock's power
  above P_b (left out where the search may offload a stage's step to the CPU: the GPU
  then only waits).

Which clock levels a pass may run at: with one clock per GPU, a stage's every pass runs at
its GPU's one clock, so slowing a stage by d seconds a pass lengthens its pipeline's
warm-up/cool-down chain by d and, past its cycle's slack, every steady cycle too (the
simulator's 1F1B time, planner/energy/frequency.py). At no slowdown a plan's deadline is
its own default-clock pipeline time; a single pipeline (DP 1, each send paired with a
receive as the simulator's default prices it: SimulatorConstants.blocking_p2p False) is
then its own critical path and no stage may slow at all: every pass runs at a level as
fast as the maximum clock (within the frequency solver's tolerance, 1e-12 of the pipeline
time, which is below 2e-12 of the floor's iteration time), and J_lower, the stage DP's
Kind.joules and the triple and per-usage limits take that level's energy ("full speed").
Where pipelines may differ (DP > 1: helper GPUs, links of other classes) or time may be
traded (an allowed slowdown), a pipeline may have slack, and they take the least energy
over every level.

Per plan (`placed`, after the plan is placed on pools, before it is simulated): the
pipelines, their stage times and links are known, so the slack of each is too: pipeline r
of default-clock time T_r may use up to S_r = D - T_r, D being the deadline the frequency
planner may give the plan (its simulated pipeline time at no slowdown; the floor's, or the
allowed slowdown's, limit otherwise), and a stage's level is possible only where
d + (M - 1) max(0, t(f) + its links - C_r) <= S_r (d: its slowing, C_r: the pipeline's
cycle; the other stages at their fastest). Each stage replica takes its least energy over
the possible levels. This is the bound that spares most plans their simulation and
frequency solve, at no slowdown often equal to the plan's exact energy.

The bound holds for the clocks the frequency planner may choose: one clock per GPU, at no
slowdown or at any allowed slowdown.

Exactness is relative to the frequency planner: the energy ranked is plan_energy's, whose
per-pipeline one-clock solve is exact but whose choice of the iteration's time limit under
an allowed slowdown is exact only for plans whose pipelines are alike
(planner/energy/plan_energy.py, _PlanEnergy.slowed).

Energy prices (Pool.usd_per_kwh) in the cost objectives: a pool's GPU costs at least its
blocking power at that price on top of its GPU-hour price whatever the plan does, so the
search's price lower bounds add it (`price_floors`); simulate() prices the exact energy.

Pure.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sailplan.planner.api import PlanRequest
from sailplan.planner.catalog import Catalog
from sailplan.planner.cluster import Pool
from sailplan.planner.energy import EnergyError, EnergyModel, plan_energy
from sailplan.planner.energy.power import roofline_parts
from sailplan.planner.plan import Plan, Predictions, Stage
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.search.capacity import TypeServers
from sailplan.planner.simulator import PlanningContext
from sailplan.planner.simulator.costs import CostModel, one_f_one_b_seconds

FloatArray = npt.NDArray[np.float64]


def input_problem(
    request: PlanRequest, catalog: Catalog, profiles: ProfileSet | None = None
) -> str | None:
    """One line when the request needs power data a GPU type of the cluster lacks (or a
    PowerProfile names a GPU type the catalog does not know): the energy objective and
    energy predictions need it for every type, an energy price for its pools' types.
    Power data: the profiles' PowerProfiles, else the catalog's power fields."""
    every = request.objective.kind == "energy" or request.energy_predictions
    if not every and not any(p.usd_per_kwh is not None for p in request.cluster.pools):
        return None
    try:
        model = EnergyModel(catalog, profiles.power_profiles() if profiles is not None else ())
    except EnergyError as error:
        return str(error)
    for pool in sorted(request.cluster.pools, key=lambda p: p.name):
        if not (every or pool.usd_per_kwh is not None) or not pool.gpus:
            continue
        try:
            model.curve(pool.gpu_type)
        except EnergyError as error:
            why = "energy predictions" if every else "its energy price"
            return f"pool {pool.name}: {error} (needed for {why})"
    return None


def price_floors(costs: CostModel, pools: Sequence[Pool]) -> tuple[float, ...]:
    """USD per GPU-hour each pool costs at least: its GPU price plus, where its energy is
    priced, its blocking power at that price (a GPU draws at least that all the time)."""
    floors = []
    for pool in pools:
        price = costs.price_per_gpu_hour(pool.name)
        per_joule = costs.usd_per_joule(pool.name)
        if per_joule > 0.0:
            price += costs.gpu_watts(pool.gpu_type)[1] * per_joule * 3600.0
        floors.append(price)
    return tuple(floors)


# Time a stage at "full speed" may lose and still be at it, as a share of the floor's
# iteration time: the frequency solver accepts any pipeline time within 1e-12 of its
# deadline (frequency.solve_single), which at no slowdown is at most the floor's time.
FULL_SPEED_TOLERANCE = 2e-12
# Margin on the deadline of the per-plan bound (floating-point sums in another order).
DEADLINE_MARGIN = 1e-9


class EnergyBound:
    """The energy objective's lower bounds and exact energies, for one search."""

    def __init__(
        self,
        context: PlanningContext,
        pools: Sequence[Pool],
        global_batch: int,
        *,
        max_slowdown: float = 0.0,
        max_iteration_seconds: float | None = None,
        tensor_parallel_degrees: Callable[[str], Sequence[int]] | None = None,
    ) -> None:
        self.context = context
        self.global_batch = global_batch
        # measured power curves (ProfileSet.power) where the profiles carry them
        self.model = EnergyModel(context.catalog, context.profiles.power_profiles())
        self.max_slowdown = max_slowdown
        self.max_iteration_seconds = max_iteration_seconds
        self.pool_watts = [self.model.curve(p.gpu_type).blocking_watts for p in pools]
        self.least_watts = min(self.pool_watts, default=0.0)
        self.blocking = {p.gpu_type: self.model.curve(p.gpu_type).blocking_watts for p in pools}
        self.gpu_types = sorted({p.gpu_type for p in pools})
        self._degrees = tensor_parallel_degrees or (lambda _: (1,))
        # a single pipeline runs at full speed (module docstring) at no slowdown, with a
        # floor to size the solver's tolerance and the simulator's paired sends
        self._full_tolerance = (
            FULL_SPEED_TOLERANCE * max_iteration_seconds
            if max_slowdown == 0.0
            and max_iteration_seconds is not None
            and not context.constants.blocking_p2p
            else None
        )
        self._layer_joules: dict[tuple[int, bool], tuple[float, float]] = {}
        self._parts: dict[tuple[str, int, int], tuple[FloatArray, FloatArray]] = {}
        self._stage_joules: dict[tuple[str, int, int, bool], tuple[FloatArray, FloatArray]] = {}
        self._replicas: dict[tuple[str, int, int, int, int, str, bool, int], _Replica] = {}

    def full_speed(self, dp: int) -> bool:
        """Do plans of DP degree dp run every pass at full speed (module docstring)?"""
        return dp == 1 and self._full_tolerance is not None

    def slot_watts(self, servers: Sequence[TypeServers]) -> list[float]:
        """Per usage slot: the least blocking power of a GPU that may serve it."""
        return [min((self.pool_watts[i] for i in s.pools), default=0.0) for s in servers]

    def plan_watts(self, plan: Plan) -> float:
        """Blocking power of all the plan's GPUs."""
        return sum(w.tensor_parallel * self.blocking[w.gpu_type] for w in plan.workers())

    def joules_lower(self, mbs: int, dp: int, *, updates: bool = True) -> float:
        """J_lower of the module docstring for micro-batch size mbs and DP degree dp;
        without the optimizer steps when `updates` is False (a stage may offload them)."""
        key = (mbs, self.full_speed(dp))
        cached = self._layer_joules.get(key)
        if cached is None:
            cached = self._per_pass_and_update(mbs, full=key[1])
            self._layer_joules[key] = cached
        per_pass, update = cached
        return self.global_batch // mbs * per_pass + (dp * update if updates else 0.0)

    def _allowed(
        self, seconds: FloatArray, factors: FloatArray, full: bool
    ) -> npt.NDArray[np.bool_]:
        """Levels (last axis of factors) a pass of `seconds` (broadcast) may run at: every
        one, or at full speed only those that lose no more than the solver's tolerance."""
        if not full:
            return np.ones(np.broadcast_shapes(np.shape(seconds), factors.shape), dtype=bool)
        assert self._full_tolerance is not None
        allowed: npt.NDArray[np.bool_] = seconds * (factors - 1.0) <= self._full_tolerance
        return allowed

    def _per_pass_and_update(self, mbs: int, *, full: bool) -> tuple[float, float]:
        """(sum over layers of the least effective joules of one pass, sum over layers of
        the least optimizer-step joules of one replica), over every GPU type and TP; with
        `full`, each pass at the levels full speed allows."""
        layers = self.context.model.num_layers
        best_pass = np.full(layers, np.inf)
        best_update = np.full(layers, np.inf)
        for gpu_type in self.gpu_types:
            curve = self.model.curve(gpu_type)
            watts = np.asarray(curve.load_watts, dtype=np.float64) - curve.blocking_watts
            for tp in self._degrees(gpu_type):
                table = self.context.costs.table(gpu_type, tp, mbs)
                if table is None:
                    continue
                seconds = np.diff(table.forward) + np.diff(table.backward)
                update = np.diff(table.update)
                compute, other = self._roofline(gpu_type, tp, mbs)
                shares = least_shares(list(zip(compute.tolist(), other.tolist(), strict=True)))
                # each level's (P - P_b) x time factor grows with the share, and the levels
                # full speed allows shrink with it: the least is at the layer's least share
                factors = np.array([curve.time_factors(s) for s in shares], dtype=np.float64)
                allowed = self._allowed(seconds[:, None], factors, full)
                per_second = np.where(allowed, watts[None, :] * factors, np.inf).min(axis=1)
                best_pass = np.minimum(best_pass, tp * seconds * per_second)
                best_update = np.minimum(best_update, tp * update * float(watts[0]))
        if not np.all(np.isfinite(best_pass)):
            return 0.0, 0.0  # a layer no kind can hold: no plan, nothing to bound
        return float(best_pass.sum()), float(best_update.sum())

    def _roofline(self, gpu_type: str, tp: int, mbs: int) -> tuple[FloatArray, FloatArray]:
        """Per layer: (clock-scaled, other) roofline seconds (power.roofline_parts)."""
        key = (gpu_type, tp, mbs)
        cached = self._parts.get(key)
        if cached is None:
            gpu = self.context.catalog.gpu(gpu_type)
            flash = self.context.constants.flash_attention
            parts = [
                roofline_parts(
                    self.context.model, gpu, layer, tp=tp, mbs=mbs, flash_attention=flash
                )
                for layer in range(self.context.model.num_layers)
            ]
            cached = (
                np.array([c for c, _ in parts], dtype=np.float64),
                np.array([o for _, o in parts], dtype=np.float64),
            )
            self._parts[key] = cached
        return cached

    def _share(self, gpu_type: str, tp: int, mbs: int, a: int, b: int) -> float:
        """power.clock_scaled_share of layers [a, b) from the cached roofline."""
        compute, other = self._roofline(gpu_type, tp, mbs)
        c = float(compute[a:b].sum())
        total = c + float(other[a:b].sum())
        return c / total if total > 0 else 0.0

    def stage_joules(
        self,
        gpu_types: Sequence[str],
        tp: int,
        mbs: int,
        dp: int,
        update_mask: npt.NDArray[np.bool_] | None = None,
    ) -> list[list[float]]:
        """[a][b] = least joules beyond blocking power of a stage of layers [a, b) at TP tp
        with dp replicas, each on one of gpu_types (the DP's Kind.joules): every pass at
        the least-energy clock level for its range's own clock-scaled share that the
        stage may run at (full speed for a single pipeline at no slowdown), and every
        replica's optimizer step at the maximum clock where update_mask (None: every
        range) says the stage keeps its step on the GPU."""
        layers = self.context.model.num_layers
        full = self.full_speed(dp)
        best = np.full((layers + 1, layers + 1), np.inf)
        for gpu_type in gpu_types:
            key = (gpu_type, tp, mbs, full)
            cached = self._stage_joules.get(key)
            if cached is None:
                cached = self._type_stage_joules(gpu_type, tp, mbs, full)
                self._stage_joules[key] = cached
            per_pass, update = cached
            if update_mask is not None:
                update = np.where(update_mask, update, 0.0)
            best = np.minimum(best, self.global_batch // mbs * per_pass + dp * update)
        rows: list[list[float]] = np.where(np.isfinite(best), best, 0.0).tolist()
        return rows

    def _type_stage_joules(
        self, gpu_type: str, tp: int, mbs: int, full: bool
    ) -> tuple[FloatArray, FloatArray]:
        """Per range of one GPU type: (least effective joules of one pass, joules of one
        replica's optimizer step); inf where the type has no profile or the range is empty."""
        layers = self.context.model.num_layers
        table = self.context.costs.table(gpu_type, tp, mbs)
        if table is None:
            empty = np.full((layers + 1, layers + 1), np.inf)
            return empty, empty
        curve = self.model.curve(gpu_type)
        watts = np.asarray(curve.load_watts, dtype=np.float64) - curve.blocking_watts
        seconds = np.asarray(table.forward + table.backward, dtype=np.float64)
        span = seconds[None, :] - seconds[:, None]  # [a, b] = layers [a, b)
        update = np.asarray(table.update, dtype=np.float64)
        update_span = update[None, :] - update[:, None]
        compute, other = self._roofline(gpu_type, tp, mbs)
        pc = np.concatenate([[0.0], np.cumsum(compute)])
        pt = np.concatenate([[0.0], np.cumsum(compute + other)])
        span_c = pc[None, :] - pc[:, None]
        span_t = pt[None, :] - pt[:, None]
        positive = span_t > 0
        share = np.clip(np.where(positive, span_c / np.where(positive, span_t, 1.0), 0.0), 0, 1)
        per_second = np.full_like(share, np.inf)
        top = curve.mhz[0]
        for level, (w, mhz) in enumerate(zip(watts.tolist(), curve.mhz, strict=True)):
            # (P(f) - P_b) x t(f) / t(f_max) at this level (power.time_factors)
            if curve.time_factor is not None:
                factor = np.full_like(share, curve.time_factor[level])
            else:
                factor = (1.0 - share) + share * top / mhz
            allowed = self._allowed(span, factor, full)
            per_second = np.where(allowed, np.minimum(per_second, w * factor), per_second)
        upper = np.triu(np.ones(span.shape, dtype=bool), k=1)
        per_pass = np.where(upper, tp * span * per_second, np.inf)
        steps = np.where(upper, tp * float(watts[0]) * update_span, np.inf)
        return per_pass, steps

    def placed(self, plan: Plan) -> PlacedBound:
        """The per-plan bound of the module docstring, for a plan placed on pools."""
        return PlacedBound(self, plan)

    def _replica(self, stage: Stage, gpu_type: str, mbs: int, dp: int) -> _Replica:
        tp, a, b = stage.tensor_parallel, stage.layer_start, stage.layer_end
        recompute, offload = stage.recompute, stage.optimizer_offload
        key = (gpu_type, tp, mbs, a, b, recompute, offload, dp)
        cached = self._replicas.get(key)
        if cached is None:
            costs = self.context.costs
            table = costs.require_table(gpu_type, tp, mbs)
            curve = self.model.curve(gpu_type)
            # as plan_energy prices the stage: its time with recomputation at each level
            base = costs.stage_seconds(table, a, b, recompute)
            factors = np.asarray(
                curve.time_factors(self._share(gpu_type, tp, mbs, a, b)), dtype=np.float64
            )
            watts = np.asarray(curve.load_watts, dtype=np.float64) - curve.blocking_watts
            seconds = base * factors
            update_seconds = costs.stage_update_seconds(table, a, b, offload, dp)
            cached = _Replica(
                seconds=seconds,
                joules=tp * watts * seconds,
                update_seconds=update_seconds,
                # an offloaded step runs on the CPU: the GPU only waits
                update_joules=0.0 if offload else tp * float(watts[0]) * update_seconds,
            )
            self._replicas[key] = cached
        return cached

    def exact(self, plan: Plan, predictions: Predictions) -> Predictions:
        """The predictions with the plan's energy at default clocks and at its clocks."""
        report = plan_energy(
            plan,
            self.context,
            predictions=predictions,
            max_slowdown=self.max_slowdown,
            max_iteration_seconds=self.max_iteration_seconds,
        )
        return predictions.model_copy(update={"energy": report.prediction()})


@dataclass(frozen=True)
class _Replica:
    """One stage replica's passes at every clock level, and its optimizer step."""

    seconds: FloatArray  # one forward + backward at each level (level 0: the maximum clock)
    joules: FloatArray  # effective joules of that pass, all its TP GPUs
    update_seconds: float  # its optimizer step (on the CPU when offloaded)
    update_joules: float  # effective joules of the step (0 when offloaded)


class PlacedBound:
    """The per-plan lower bound (module docstring) of a plan placed on pools: built before
    the plan is simulated, evaluated then and, with its predictions, after."""

    def __init__(self, bound: EnergyBound, plan: Plan) -> None:
        self.bound = bound
        self.plan = plan
        costs = bound.context.costs
        mbs = plan.micro_batch_size
        dp = plan.data_parallel
        self.watts = bound.plan_watts(plan)
        self.even = plan.pipeline_micro_batches is None
        replicas = [
            [bound._replica(s, r.gpu_type, mbs, dp) for r in s.replicas] for s in plan.stages
        ]
        links = []  # [boundary][pipeline]
        for sender, receiver in itertools.pairwise(plan.stages):
            nbytes = costs.boundary_bytes(mbs, receiver.layer_start)
            links.append(
                [
                    costs.boundary_seconds(
                        nbytes, x, y, sender.tensor_parallel, receiver.tensor_parallel
                    )
                    for x, y in zip(sender.replicas, receiver.replicas, strict=True)
                ]
            )
        # as simulate() times the plan: each stage's slowest replica, each boundary's
        # slowest link (the pipeline time the frequency planner gets as its deadline)
        stage_max = [max(float(x.seconds[0]) for x in row) for row in replicas]
        link_max = [max(row) for row in links]
        self.pipeline_seconds = one_f_one_b_seconds(
            stage_max,
            link_max,
            plan.num_micro_batches,
            blocking_p2p=bound.context.constants.blocking_p2p,
        )
        # the iteration's tail is at least the slowest optimizer step
        self.tail_lower = max(x.update_seconds for row in replicas for x in row)
        self.update_joules = sum(x.update_joules for row in replicas for x in row)
        self.pipelines: list[tuple[list[_Replica], list[float], int]] = []
        for r in range(dp):
            stages = [row[r] for row in replicas]
            hops = [row[r] for row in links]
            self.pipelines.append((stages, hops, plan.micro_batches_of(r)))

    def lower(self, predictions: Predictions | None = None) -> float:
        """No clocks the frequency planner may choose give the plan less energy than this;
        `predictions`: the plan's simulated ones (exact deadline and tail), else before
        simulating (the pipeline time computed as simulate() does, the tail at least the
        slowest optimizer step)."""
        bound = self.bound
        if not self.even:
            return 0.0  # an uneven split's pipelines are timed one by one (not here)
        if predictions is None:
            pipeline = self.pipeline_seconds
            iteration = pipeline + self.tail_lower
            tail = None
        else:
            pipeline = predictions.pipeline_seconds
            iteration = predictions.iteration_seconds
            tail = iteration - pipeline
        deadline = pipeline
        if bound.max_slowdown > 0.0:
            floor_time = bound.max_iteration_seconds
            if tail is None:
                # the tail is unknown: the floor's time is the limit (none: no limit)
                longest = floor_time if floor_time is not None else float("inf")
            else:
                longest = (1.0 + bound.max_slowdown) * iteration
                if floor_time is not None:
                    longest = min(longest, floor_time)
                longest -= tail
            deadline = max(deadline, longest)
        deadline *= 1.0 + DEADLINE_MARGIN
        joules = self.update_joules
        for stages, hops, micro in self.pipelines:
            joules += micro * _least_pipeline_joules(stages, hops, micro, deadline)
        return iteration * self.watts + joules


def _least_pipeline_joules(
    stages: Sequence[_Replica], hops: Sequence[float], micro: int, deadline: float
) -> float:
    """Sum over one pipeline's stages of the least effective joules of one pass over the
    levels that stage may take within `deadline` (the others at their fastest)."""
    fastest = [float(s.seconds[0]) for s in stages]
    around = [
        (hops[i - 1] if i > 0 else 0.0) + (hops[i] if i < len(hops) else 0.0)
        for i in range(len(stages))
    ]
    cycle = max(t + x for t, x in zip(fastest, around, strict=True))
    slack = deadline - (sum(fastest) + 2.0 * sum(hops) + (micro - 1) * cycle)
    if not np.isfinite(slack):
        return sum(float(s.joules.min()) for s in stages)
    total = 0.0
    for stage, t, x in zip(stages, fastest, around, strict=True):
        lost = (stage.seconds - t) + (micro - 1) * np.maximum(0.0, stage.seconds + x - cycle)
        possible = lost <= slack
        possible[0] = True
        total += float(stage.joules[possible].min())
    return total


def least_shares(parts: Sequence[tuple[float, float]]) -> list[float]:
    """Per layer: the least clock-scaled share (power.clock_scaled_share) of any contiguous
    range of layers that holds it."""
    compute = np.concatenate([[0.0], np.cumsum([c for c, _ in parts])])
    total = np.concatenate([[0.0], np.cumsum([c + o for c, o in parts])])
    n = len(parts)
    span_c = compute[None, :] - compute[:, None]  # [a, b] = layers [a, b)
    span_t = total[None, :] - total[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(span_t > 0, span_c / np.where(span_t > 0, span_t, 1.0), 0.0)
    upper = np.triu(np.ones((n + 1, n + 1), dtype=bool), k=1)
    share = np.where(upper, share, np.inf)
    return [float(share[: layer + 1, layer + 1 :].min()) for layer in range(n)]


def with_energy(
    plan: Plan,
    predictions: Predictions,
    context: PlanningContext,
    *,
    max_slowdown: float = 0.0,
    max_iteration_seconds: float | None = None,
) -> Predictions:
    """The predictions with the plan's energy at default clocks and at its clocks (at the
    allowed slowdown)."""
    report = plan_energy(
        plan,
        context,
        predictions=predictions,
        max_slowdown=max_slowdown,
        max_iteration_seconds=max_iteration_seconds,
    )
    return predictions.model_copy(update={"energy": report.prediction()})
