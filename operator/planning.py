"""Binds the planner's front door to the operator's reconcile.

`make_plan(request, measured_profiles, catalog)` is the planner's one entry point
(sailplan.planner.api); the reconcile functions take a two-argument `Planner`, so tests can
hand them a planner of their own and the handler binds the catalog once here.
"""

from __future__ import annotations

from sailplan.operator.reconcile.trainingjob import Planner
from sailplan.planner.api import PlanRequest, PlanResult, make_plan
from sailplan.planner.catalog import Catalog
from sailplan.planner.profiles.types import ProfileSet


def planner_for(catalog: Catalog) -> Planner:
    def plan(request: PlanRequest, measured: ProfileSet) -> PlanResult:
        return make_plan(request, measured, catalog)

    return plan
