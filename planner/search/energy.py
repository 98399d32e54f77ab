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
  effective power x time factor over the clock levels, (P(f) - P_b) t(f) / t(f_max), at
  the least clock-scaled share any stage holding that layer can have (the share of a
  range is a mediant of its layers', and the effective energy grows with the share), on
  the GPU type and TP degree that make it smallest; global batch / micro-batch passes of
  every layer; plus every replica's optimizer step at the maximum clock's power above P_b.
  The bound holds for any clocks, at no slowdown and at any allowed slowdown.

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

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from sailplan.planner.api import PlanRequest
from sailplan.planner.catalog import Catalog
from sailplan.planner.cluster import Pool
from sailplan.planner.energy import EnergyError, EnergyModel, plan_energy
from sailplan.planner.energy.power import roofline_parts
from sailplan.planner.plan import Plan, Predictions
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.search.capacity import TypeServers
from sailplan.planner.simulator import PlanningContext
from sailplan.planner.simulator.costs import CostModel

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
        self._layer_joules: dict[int, tuple[float, float]] = {}
        self._parts: dict[tuple[str, int, int], tuple[FloatArray, FloatArray]] = {}
        self._stage_joules: dict[tuple[str, int, int, int], FloatArray] = {}

    def slot_watts(self, servers: Sequence[TypeServers]) -> list[float]:
        """Per usage slot: the least blocking power of a GPU that may serve it."""
        return [min((self.pool_watts[i] for i in s.pools), default=0.0) for s in servers]

    def plan_watts(self, plan: Plan) -> float:
        """Blocking power of all the plan's GPUs."""
        return sum(w.tensor_parallel * self.blocking[w.gpu_type] for w in plan.workers())

    def joules_lower(self, mbs: int, dp: int) -> float:
        """J_lower of the module docstring for micro-batch size mbs and DP degree dp."""
        cached = self._layer_joules.get(mbs)
        if cached is None:
            cached = self._per_pass_and_update(mbs)
            self._layer_joules[mbs] = cached
        per_pass, update = cached
        return self.global_batch // mbs * per_pass + dp * update

    def _per_pass_and_update(self, mbs: int) -> tuple[float, float]:
        """(sum over layers of the least effective joules of one pass, sum over layers of
        the least optimizer-step joules of one replica), over every GPU type and TP."""
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
                # linear in the share at each level: its least over [share, 1] is at an end
                per_second = np.array(
                    [
                        min(
                            float(np.min(watts * np.asarray(curve.time_factors(s)))),
                            float(np.min(watts * np.asarray(curve.time_factors(1.0)))),
                        )
                        for s in shares
                    ]
                )
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

    def stage_joules(
        self, gpu_types: Sequence[str], tp: int, mbs: int, dp: int
    ) -> list[list[float]]:
        """[a][b] = least joules beyond blocking power of a stage of layers [a, b) at TP tp
        with dp replicas, each on one of gpu_types (the DP's Kind.joules): every pass at
        the least-energy clock level for its range's own clock-scaled share, and every
        replica's optimizer step at the maximum clock."""
        layers = self.context.model.num_layers
        best = np.full((layers + 1, layers + 1), np.inf)
        for gpu_type in gpu_types:
            key = (gpu_type, tp, mbs, dp)
            matrix = self._stage_joules.get(key)
            if matrix is None:
                matrix = self._type_stage_joules(gpu_type, tp, mbs, dp)
                self._stage_joules[key] = matrix
            best = np.minimum(best, matrix)
        rows: list[list[float]] = np.where(np.isfinite(best), best, 0.0).tolist()
        return rows

    def _type_stage_joules(self, gpu_type: str, tp: int, mbs: int, dp: int) -> FloatArray:
        layers = self.context.model.num_layers
        table = self.context.costs.table(gpu_type, tp, mbs)
        if table is None:
            return np.full((layers + 1, layers + 1), np.inf)
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
        if curve.time_factor is not None:
            least = float(np.min(watts * np.asarray(curve.time_factor)))
            per_second = np.full_like(share, least)
        else:
            top = curve.mhz[0]
            per_second = np.full_like(share, np.inf)
            for w, mhz in zip(watts.tolist(), curve.mhz, strict=True):
                # (P(f) - P_b) x t(f) / t(f_max) at this level (power.time_factors)
                per_second = np.minimum(per_second, w * ((1.0 - share) + share * top / mhz))
        passes = self.global_batch // mbs
        joules = passes * tp * span * per_second + dp * tp * float(watts[0]) * update_span
        upper = np.triu(np.ones(joules.shape, dtype=bool), k=1)
        return np.where(upper, joules, np.inf)

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
