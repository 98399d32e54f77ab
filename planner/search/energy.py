"""The search's energy terms: the energy objective's candidates, and energy prices.

Called by engine.py.

Energy objective (api.Objective kind `energy`): the least GPU joules per iteration at each
plan's own no-slowdown clocks (planner/energy: every stage off the critical path slowed
until it just keeps up), among plans that reach the throughput floor. The no-slowdown
energy of a plan is a frequency problem per pipeline, far too costly to solve inside the
stage DP, and no cheap lower bound of it prunes well: most of a plan's energy is its
forward/backward work, nearly the same for every plan on the same GPU type, so bounds
differ from the optimum by less than the plans differ from each other. The search
therefore runs in two steps:

1. branch and bound, exact like the other objectives, on the energy's upper envelope at
   default clocks: iteration time x the board power (TDP) of every GPU the plan holds,
   priced per GPU like the cost objective's USD/hour (a GPU never draws more than its TDP,
   so this is >= the plan's energy at default clocks, which is >= its energy at no
   slowdown). It keeps the CANDIDATES_PER_PLAN x top_k best plans above the floor;
2. each candidate's frequency plan is solved (planner.energy.plan_energy) and the
   candidates are ranked by their no-slowdown joules per iteration (ties: the search's
   stable layout order).

The answer is the least-energy plan among those candidates, not a proof that no other plan
uses less; step 1's envelope favours few GPU-seconds on low-power GPUs, which is where the
energy optimum lies when most of the power is drawn while computing.

Energy prices (Pool.usd_per_kwh) in the cost objectives: a pool's GPU costs at least its
blocking power at that price on top of its GPU-hour price whatever the plan does, so the
search's price lower bounds add it (`price_floors`); simulate() prices the exact energy.

Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from sailplan.planner.api import PlanRequest
from sailplan.planner.catalog import Catalog
from sailplan.planner.cluster import Pool
from sailplan.planner.energy import EnergyError, EnergyModel, plan_energy
from sailplan.planner.plan import Plan, Predictions
from sailplan.planner.search.capacity import TypeServers
from sailplan.planner.simulator import PlanningContext
from sailplan.planner.simulator.costs import CostModel

# Candidates step 1 keeps per plan the request asks for (top_k). More candidates cost one
# frequency solve each (milliseconds) and loosen step 1's pruning bar (its k-th best).
CANDIDATES_PER_PLAN = 4
MIN_CANDIDATES = 12


def input_problem(request: PlanRequest, catalog: Catalog) -> str | None:
    """One line when the request needs power data a GPU type of the cluster lacks: the
    energy objective and energy predictions need it for every type, an energy price for
    its pools' types."""
    model = EnergyModel(catalog)
    every = request.objective.kind == "energy" or request.energy_predictions
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


def candidates(top_k: int) -> int:
    return max(MIN_CANDIDATES, CANDIDATES_PER_PLAN * top_k)


class EnergyEnvelope:
    """Step 1's envelope (TDP x time) and step 2's ranking, for one search."""

    def __init__(self, catalog: Catalog, pools: Sequence[Pool]) -> None:
        model = EnergyModel(catalog)
        # the board power is the curve's load power at the maximum clock (power.py)
        self.tdp = {p.gpu_type: model.curve(p.gpu_type).load_watts[0] for p in pools}
        self.pool_watts = [self.tdp[p.gpu_type] for p in pools]
        self.least_watts = min(self.pool_watts)

    def slot_watts(self, servers: Sequence[TypeServers]) -> list[float]:
        """Per usage slot: the least TDP of a GPU that may serve it."""
        return [min((self.pool_watts[i] for i in s.pools), default=0.0) for s in servers]

    def envelope(self, plan: Plan, predictions: Predictions) -> float:
        """Joules: iteration time x the TDP of every GPU of the plan."""
        watts = sum(w.tensor_parallel * self.tdp[w.gpu_type] for w in plan.workers())
        return predictions.iteration_seconds * watts

    @staticmethod
    def with_energy(plan: Plan, predictions: Predictions, context: PlanningContext) -> Predictions:
        """The predictions with the plan's energy at default clocks and at no slowdown."""
        report = plan_energy(plan, context, predictions=predictions)
        return predictions.model_copy(update={"energy": report.prediction()})
