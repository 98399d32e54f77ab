"""The simulator: predicts iteration time, peak memory, cost and egress of a Plan.

`simulate(plan, context)` is the reference; `context.costs` (a CostModel) is the fast,
cached API the search calls with the same arithmetic. Both are pure.
"""

from sailplan.planner.simulator.context import (
    DEEPSPEED_PIPELINE_CONSTANTS,
    DEFAULT_CONSTANTS,
    PlanningContext,
    SimulatorConstants,
)
from sailplan.planner.simulator.costs import (
    CostModel,
    Endpoint,
    MissingProfileError,
    StageTable,
    in_flight_micro_batches,
    one_f_one_b_seconds,
)
from sailplan.planner.simulator.simulate import profile_refs, simulate, zone_links

__all__ = [
    "DEEPSPEED_PIPELINE_CONSTANTS",
    "DEFAULT_CONSTANTS",
    "CostModel",
    "Endpoint",
    "MissingProfileError",
    "PlanningContext",
    "SimulatorConstants",
    "StageTable",
    "in_flight_micro_batches",
    "one_f_one_b_seconds",
    "profile_refs",
    "simulate",
    "zone_links",
]
