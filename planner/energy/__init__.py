"""Energy-aware plans (Perseus, SOSP'24): GPU power against SM clock and per-stage clocks.

- power.py: the energy model per GPU type (catalog power fields or a measured
  PowerProfile) and a stage's time at a lowered clock;
- frequency.py: the clocks of one pipeline under the simulator's 1F1B schedule that use the
  least energy within a deadline: one clock per stage (solve_single, what the node agent
  applies) or a clock per pass kind (solve, Perseus' per-pass answer, reported only);
- plan_energy.py: a Plan's energy per iteration at default clocks and at no slowdown, and
  its iteration time-energy frontier.

Pure like the rest of the planner: no I/O, no plotting (the CLI draws the frontier).
"""

from sailplan.planner.energy.frequency import (
    PipelineClocks,
    PipelineProblem,
    StageOptions,
    default_clocks,
    pipeline_seconds,
    solve,
    solve_single,
)
from sailplan.planner.energy.plan_energy import (
    JOULES_PER_KWH,
    EnergyReport,
    FrontierPoint,
    plan_energy,
    simulate_energy,
    usd_for,
    with_energy,
)
from sailplan.planner.energy.power import (
    EnergyError,
    EnergyModel,
    PowerCurve,
    clock_scaled_share,
    modelled_watts,
)
from sailplan.planner.profiles.types import PowerPoint, PowerProfile

__all__ = [
    "JOULES_PER_KWH",
    "EnergyError",
    "EnergyModel",
    "EnergyReport",
    "FrontierPoint",
    "PipelineClocks",
    "PipelineProblem",
    "PowerCurve",
    "PowerPoint",
    "PowerProfile",
    "StageOptions",
    "clock_scaled_share",
    "default_clocks",
    "modelled_watts",
    "pipeline_seconds",
    "plan_energy",
    "simulate_energy",
    "solve",
    "solve_single",
    "usd_for",
    "with_energy",
]
