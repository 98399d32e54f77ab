"""What "better" means for a request: the ranking key, the constraints, and the top-k list.

Throughput: lower iteration time is better (the global batch is fixed, so this is higher
samples/s). Cost: lower USD per iteration is better (USD per sample at a fixed batch).
Energy: lower GPU joules per iteration at the plan's no-slowdown clocks is better; the
search prunes with an envelope of it (search/energy.py: time x watts, joules_lower = 0).
Constraints (throughput floor, USD/hour and USD/iteration budgets) apply to every kind.
Ties are broken by a stable order (fewer GPUs, shallower pipeline, smaller DP, then the
plan's own layout), so the same input always gives the same output.

Called by engine.py; pure.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from sailplan.planner.api import Objective
from sailplan.planner.plan import Plan, Predictions

_EPS = 1e-12


def layout_key(plan: Plan) -> tuple[object, ...]:
    return (
        plan.world_size,
        plan.pipeline_depth,
        plan.data_parallel,
        plan.micro_batch_size,
        tuple(
            (s.layer_end, s.tensor_parallel, tuple((r.pool, r.zone) for r in s.replicas))
            for s in plan.stages
        ),
    )


@dataclass(frozen=True)
class Goal:
    objective: Objective
    global_batch: int

    def value(self, predictions: Predictions) -> float:
        if self.objective.kind == "cost":
            return predictions.usd_per_iteration
        if self.objective.kind == "energy":
            energy = predictions.energy
            return float("inf") if energy is None else energy.joules_per_iteration
        return predictions.iteration_seconds

    def satisfied(self, predictions: Predictions) -> bool:
        o = self.objective
        if o.min_samples_per_second is not None and (
            predictions.samples_per_second < o.min_samples_per_second * (1 - _EPS)
        ):
            return False
        if o.max_usd_per_hour is not None and predictions.usd_per_hour > o.max_usd_per_hour * (
            1 + _EPS
        ):
            return False
        return not (
            o.max_usd_per_iteration is not None
            and predictions.usd_per_iteration > o.max_usd_per_iteration * (1 + _EPS)
        )

    def time_limit(
        self,
        kth_value: float,
        usd_per_hour_lower: float,
        watts_lower: float = 0.0,
        joules_lower: float = 0.0,
    ) -> float:
        """Largest iteration time a plan with this price floor may have and still matter.
        Energy: a plan draws at least watts_lower all iteration and joules_lower more."""
        o = self.objective
        limit = float("inf")
        if o.kind == "cost":
            if usd_per_hour_lower > 0:
                limit = kth_value * 3600.0 / usd_per_hour_lower
        elif o.kind == "energy":
            if watts_lower > 0:
                limit = (kth_value - joules_lower) / watts_lower
        else:
            limit = kth_value
        if o.min_samples_per_second is not None:
            limit = min(limit, self.global_batch / o.min_samples_per_second)
        if o.max_usd_per_iteration is not None and usd_per_hour_lower > 0:
            limit = min(limit, o.max_usd_per_iteration * 3600.0 / usd_per_hour_lower)
        if o.max_usd_per_hour is not None and usd_per_hour_lower > o.max_usd_per_hour * (1 + _EPS):
            return -1.0
        return limit * (1 + 1e-9)  # keep exact ties: the stable order decides them

    def value_lower(
        self,
        time_lower: float,
        usd_per_hour_lower: float,
        watts_lower: float = 0.0,
        joules_lower: float = 0.0,
    ) -> float:
        if self.objective.kind == "cost":
            return time_lower * usd_per_hour_lower / 3600.0
        if self.objective.kind == "energy":
            return time_lower * watts_lower + joules_lower
        return time_lower


@dataclass
class TopK:
    """The k best plans so far, best first, by (value, stable layout key)."""

    k: int
    entries: list[tuple[float, tuple[object, ...], Plan]] = field(default_factory=list)

    def kth(self) -> float:
        return self.entries[-1][0] if len(self.entries) >= self.k else float("inf")

    def offer(self, value: float, plan: Plan) -> None:
        key = layout_key(plan)
        for index, (existing_value, existing_key, _) in enumerate(self.entries):
            if existing_key == key:
                # the same layout scores the same, unless it comes again with an uneven
                # data split (search/uneven.py), which is kept only when it is better
                if value >= existing_value:
                    return
                del self.entries[index]
                break
        bisect.insort(self.entries, (value, key, plan), key=lambda e: (e[0], e[1]))
        del self.entries[self.k :]

    def plans(self) -> list[Plan]:
        return [plan for _, _, plan in self.entries]
