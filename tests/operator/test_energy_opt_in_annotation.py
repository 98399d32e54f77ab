"""A job opted into clocks by the deprecated annotation plans as one opted in by the spec.

The node agent honours `sailplan.dev/energy-clocks: no-slowdown` as it honours
`spec.energy.clocks: NoSlowdown` (nodeagent.assignment.opt_in); the operator reads the job
through controller.observation.parse_job, which must give the planner the same request, so
both paths get plans that carry the clocks the agent locks.
"""

from __future__ import annotations

from typing import Any

from operator_builders import JOB_SPEC, pool

from sailplan.operator.controller.observation import parse_job
from sailplan.operator.nodeagent.assignment import opt_in
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.operator.replan.decision import plan_request, wants_energy
from sailplan.planner.api import Planned, make_plan
from sailplan.planner.catalog import default_catalog

ZONE = "us-central1-a"
SPEC = JOB_SPEC | {"training": {"globalBatchSize": 32, "steps": 1000}}
ANNOTATION = {"sailplan.dev/energy-clocks": "no-slowdown"}


def body(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "opt", "namespace": "team-a", "uid": "u", "generation": 1}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": spec}


def test_the_annotation_and_the_spec_give_the_same_plan_with_clocks() -> None:
    catalog = default_catalog()
    cluster = build_snapshot([pool("a100", "a100-ondemand", {ZONE: 1})])
    model = catalog.model("OPT-350M")
    by_spec = parse_job("team-a", "opt", body(SPEC | {"energy": {"clocks": "NoSlowdown"}})).job
    by_annotation = parse_job("team-a", "opt", body(SPEC, ANNOTATION)).job
    assert by_spec is not None and by_annotation is not None
    # the agent sees the second as opted in by the annotation, the operator as opted in
    assert opt_in(body(SPEC, ANNOTATION)) == (True, True)
    assert wants_energy(by_annotation)
    request = plan_request(by_annotation, model, cluster)
    assert request == plan_request(by_spec, model, cluster)
    result = make_plan(request, catalog=catalog)
    assert isinstance(result, Planned)
    energy = result.best.predictions.energy if result.best.predictions else None
    assert energy is not None
    assert len(energy.stage_clocks) == result.best.pipeline_depth


def test_without_the_annotation_or_with_another_value_nothing_changes() -> None:
    for given in (None, {}, {"sailplan.dev/energy-clocks": "default"}):
        parsed = parse_job("team-a", "opt", body(SPEC, given)).job
        assert parsed is not None
        assert parsed.spec.energy.clocks == "Default"
        assert not wants_energy(parsed)


def test_the_annotation_overrides_an_explicit_default_as_the_agent_does() -> None:
    spec = SPEC | {"energy": {"clocks": "Default"}}
    assert opt_in(body(spec, ANNOTATION)) == (True, True)
    parsed = parse_job("team-a", "opt", body(spec, ANNOTATION)).job
    assert parsed is not None and parsed.spec.energy.clocks == "NoSlowdown"
