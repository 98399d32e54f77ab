"""The SM clock of every worker of a Plan, for the node agent to lock.

The node agent reads a job's Plan from its plan ConfigMap (the operator writes it; a
generation's ConfigMap is immutable) and calls `plan_clocks` once per generation. A GPU
holds one locked clock, and the planner's clocks are one clock per stage replica for all
its passes (planner/energy/plan_energy.py: StageClocks with fill_mhz == steady_mhz), so
the agent locks exactly the clock the plan's predicted time and joules were computed with.

Where the Plan carries such clocks (a plan made with energy predictions) they are used.
Otherwise the planner's one-clock frequency plan is computed here from the Plan alone,
with estimated compute profiles for its GPU types (the agent does not read the operator's
profile store): for a plan stored without clocks (made before its job opted in), at no
slowdown; for a plan whose stored clocks differ between a stage's warm-up/cool-down pass
and its other passes (made by a planner that gave per-pass clocks, which one locked clock
cannot apply), at the slowdown that plan was allowed.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from sailplan.planner.catalog import Catalog, CatalogError
from sailplan.planner.cli_sources import cluster_of, plan_context
from sailplan.planner.energy import EnergyError, plan_energy
from sailplan.planner.plan import Plan
from sailplan.planner.simulator import MissingProfileError


class ClockPlanError(ValueError):
    """No clocks for this plan (a GPU type without power data, a plan the simulator cannot
    price). One line."""


@dataclass(frozen=True)
class ClockPlan:
    """The SM clock per (stage, replica) and the predicted GPU energy of one iteration of
    the whole job (joules), at default clocks and with the clocks."""

    locked_mhz: dict[tuple[int, int], int]
    joules_per_iteration: float
    joules_per_iteration_default: float
    source: str  # "plan" when the Plan carried them, else "computed"

    def mhz(self, stage: int, replica: int) -> int | None:
        return self.locked_mhz.get((stage, replica))


def plan_clocks(plan: Plan, catalog: Catalog) -> ClockPlan:
    """The clocks of every worker of `plan` (module docstring); ClockPlanError if they
    cannot be had."""
    energy = plan.predictions.energy if plan.predictions is not None else None
    one_clock = energy is not None and all(c.fill_mhz == c.steady_mhz for c in energy.stage_clocks)
    if energy is not None and one_clock and len(energy.stage_clocks) == plan.pipeline_depth:
        return ClockPlan(
            locked_mhz={
                (stage, replica): mhz
                for stage, clocks in enumerate(energy.stage_clocks)
                for replica, mhz in enumerate(clocks.steady_mhz)
            },
            joules_per_iteration=energy.joules_per_iteration,
            joules_per_iteration_default=energy.joules_per_iteration_default,
            source="plan",
        )
    max_slowdown = energy.max_slowdown if energy is not None else 0.0
    try:
        context = plan_context(plan, cluster_of(plan, catalog), None, catalog)
        report = plan_energy(plan, context, max_slowdown=max_slowdown)
    except (EnergyError, MissingProfileError, CatalogError) as error:
        raise ClockPlanError(str(error).splitlines()[0]) from None
    chosen = report.chosen
    return ClockPlan(
        locked_mhz={
            (stage, replica): mhz
            for stage, per_replica in enumerate(chosen.steady_mhz)
            for replica, mhz in enumerate(per_replica)
        },
        joules_per_iteration=chosen.joules_per_iteration,
        joules_per_iteration_default=report.default.joules_per_iteration,
        source="computed",
    )
