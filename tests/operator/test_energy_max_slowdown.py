"""spec.energy.maxSlowdown: a point on the time-energy frontier, from the TrainingJob to the
frequency planner, bounded by the schema.

The CRD's schema refuses a value outside [0, MAX_ENERGY_SLOWDOWN] (the API server checks
minimum/maximum; the model the operator parses with refuses the same), the request the
operator plans with carries it where the job plans with energy, and the plan that comes
back carries clocks for it.
"""

from __future__ import annotations

from typing import Any

import pytest
from operator_builders import JOB_SPEC, pool
from pydantic import ValidationError

from sailplan.operator.api import crd
from sailplan.operator.api.schema import walk
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.operator.replan.decision import plan_request, reprice
from sailplan.planner.api import MAX_ENERGY_SLOWDOWN, Planned, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.profiles.types import ProfileSet

ZONE = "us-central1-a"
SPEC = JOB_SPEC | {"training": {"globalBatchSize": 32, "steps": 1000}}


def job(energy: dict[str, Any], objective: dict[str, Any] | None = None) -> TrainingJob:
    spec = SPEC | {"energy": energy}
    if objective is not None:
        spec = spec | {"objective": objective}
    return TrainingJob.model_validate({"name": "opt", "namespace": "team-a", "spec": spec})


def test_the_schema_bounds_the_slowdown() -> None:
    versions = crd.trainingjob_crd()["spec"]["versions"]
    for version in versions:
        schema = version["schema"]["openAPIV3Schema"]
        node = dict(walk(schema))[".spec.energy.maxSlowdown"]
        assert (node["type"], node["minimum"], node["maximum"]) == (
            "number",
            0.0,
            MAX_ENERGY_SLOWDOWN,
        )
        assert node["default"] == 0.0
    for bad in (-0.01, MAX_ENERGY_SLOWDOWN + 0.5, 5):
        with pytest.raises(ValidationError, match=r"max_slowdown|maxSlowdown"):
            job({"clocks": "NoSlowdown", "maxSlowdown": bad})


def test_the_slowdown_reaches_the_planner_where_the_job_plans_with_energy() -> None:
    catalog = default_catalog()
    model = catalog.model("OPT-350M")
    cluster = build_snapshot([pool("a100", "a100-ondemand", {ZONE: 1})])
    clocks = plan_request(job({"clocks": "NoSlowdown", "maxSlowdown": 0.1}), model, cluster)
    assert clocks.energy_max_slowdown == 0.1
    energy = plan_request(
        job({"maxSlowdown": 0.2}, {"kind": "Energy", "minSamplesPerSecond": 5.0}), model, cluster
    )
    assert energy.energy_max_slowdown == 0.2
    # a job that plans without energy has no clocks to slow
    plain = plan_request(job({"maxSlowdown": 0.2}), model, cluster)
    assert (plain.energy_predictions, plain.energy_max_slowdown) == (False, 0.0)
    result = make_plan(clocks, catalog=catalog)
    assert isinstance(result, Planned)
    predicted = result.best.predictions
    assert predicted is not None and predicted.energy is not None
    assert predicted.energy.max_slowdown == 0.1
    assert predicted.energy.iteration_seconds <= 1.1 * predicted.iteration_seconds * (1 + 1e-9)
    assert len(predicted.energy.stage_clocks) == result.best.pipeline_depth
    # the replan decision re-prices the current plan at the same point (its profile
    # completion is the plan's own, so the numbers agree to a fraction of a percent), which
    # uses no more energy than the no-slowdown point
    again = reprice(
        result.best, model, cluster, ProfileSet(), catalog, energy=True, max_slowdown=0.1
    )
    assert again.energy is not None and again.energy.max_slowdown == 0.1
    assert again.energy.joules_per_iteration == pytest.approx(
        predicted.energy.joules_per_iteration, rel=1e-2
    )
    no_slowdown = reprice(result.best, model, cluster, ProfileSet(), catalog, energy=True)
    assert no_slowdown.energy is not None and no_slowdown.energy.max_slowdown == 0.0
    assert again.energy.joules_per_iteration <= no_slowdown.energy.joules_per_iteration
