"""The SM clock of every worker of a Plan at Perseus' "no slowdown" point, for the agent.

The node agent reads a job's Plan from its plan ConfigMap (the operator writes it; a
generation's ConfigMap is immutable) and calls `plan_clocks` once per generation. Where
the Plan already carries an energy prediction with stage clocks (a plan made with energy
predictions), those are used; otherwise the planner's frequency plan is computed here
(planner/energy/plan_energy.py) from the Plan alone, with estimated compute profiles
for its GPU types (the agent does not read the operator's profile store).

A GPU can be locked to one clock only, while the frequency plan gives each stage two: the
steady-state clock of its M - 1 inner forward/backward passes and the clock of its
warm-up/cool-down pass. The agent locks the steady clock (switching clocks per pass needs
the trainer's cooperation, as Perseus' in-process client does); the fill pass then runs at
the steady clock too, which is the one difference from the prediction.

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
    """Steady SM clock per (stage, replica) and the predicted GPU energy of one iteration
    of the whole job (joules), at default clocks and with the clocks."""

    steady_mhz: dict[tuple[int, int], int]
    joules_per_iteration: float
    joules_per_iteration_default: float
    source: str  # "plan" when the Plan carried them, else "computed"

    def mhz(self, stage: int, replica: int) -> int | None:
        return self.steady_mhz.get((stage, replica))


def plan_clocks(plan: Plan, catalog: Catalog) -> ClockPlan:
    """No-slowdown clocks of every worker of `plan`; ClockPlanError if they cannot be had."""
    energy = plan.predictions.energy if plan.predictions is not None else None
    if energy is not None and len(energy.stage_clocks) == plan.pipeline_depth:
        steady = {
            (stage, replica): mhz
            for stage, clocks in enumerate(energy.stage_clocks)
            for replica, mhz in enumerate(clocks.steady_mhz)
        }
        return ClockPlan(
            steady_mhz=steady,
            joules_per_iteration=energy.joules_per_iteration,
            joules_per_iteration_default=energy.joules_per_iteration_default,
            source="plan",
        )
    try:
        context = plan_context(plan, cluster_of(plan, catalog), None, catalog)
        report = plan_energy(plan, context)
    except (EnergyError, MissingProfileError, CatalogError) as error:
        raise ClockPlanError(str(error).splitlines()[0]) from None
    steady = {
        (stage, replica): mhz
        for stage, per_replica in enumerate(report.no_slowdown.steady_mhz)
        for replica, mhz in enumerate(per_replica)
    }
    return ClockPlan(
        steady_mhz=steady,
        joules_per_iteration=report.no_slowdown.joules_per_iteration,
        joules_per_iteration_default=report.default.joules_per_iteration,
        source="computed",
    )
