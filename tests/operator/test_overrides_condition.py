"""The OverridesApplied condition (pure reconcile passes): False with reason OverridesIgnored
and the overruled entries while the current workers run without some of
spec.podTemplateOverrides (the plan's placement wins), True once they carry all of it, and
absent from a job that never had overrides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from operator_builders import JOB_SPEC, RecordingPlanner
from test_reconcile_trainingjob import NOW, observe, refuse, with_status

from sailplan.operator.api.common import find_condition
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.overrides import IGNORED_ANNOTATION
from sailplan.operator.reconcile.trainingjob import reconcile
from sailplan.planner.api import Planned
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import Plan

ZONE = "topology.kubernetes.io/zone"
# Worker 0 of the builders' plan runs in us-central1-a: a selector for another zone cannot hold.
CONFLICTING = {"spec": {"nodeSelector": {ZONE: "europe-west4-a", "example.com/disk": "ssd"}}}


def _applied(status: Any) -> tuple[str, str, str] | None:
    condition = find_condition(status.conditions, "OverridesApplied")
    return (condition.status, condition.reason, condition.message) if condition else None


def test_overrides_the_plan_overrules_make_the_condition_false_until_workers_carry_all(
    make_job: Callable[..., TrainingJob],
    plan: Plan,
    pools: tuple[GPUPool, ...],
    catalog: Catalog,
) -> None:
    job = make_job(JOB_SPEC | {"podTemplateOverrides": CONFLICTING})
    first = reconcile(observe(job, pools, []), RecordingPlanner(Planned(best=plan)), catalog, NOW)
    said = _applied(first.status)
    assert said is not None and said[:2] == ("False", "OverridesIgnored")
    assert f"nodeSelector {ZONE}=europe-west4-a (the plan pins {ZONE}=us-central1-a)" in said[2]
    assert "example.com/disk" not in said[2]  # applied, so not named

    # The next pass reads it from the workers' annotation, not from the pass that made them.
    job = with_status(job, first)
    running = dict.fromkeys(range(4), "Running")
    second = reconcile(observe(job, pools, list(first.create), running), refuse, catalog, NOW)
    assert _applied(second.status) == said

    # Workers rendered without an overruled entry (the overrides fixed, the pods recreated).
    job = with_status(job, second)
    fixed = []
    for obj in first.create:
        obj = {**obj, "metadata": dict(obj["metadata"])}
        annotations = {
            k: v
            for k, v in obj["metadata"].get("annotations", {}).items()
            if k != IGNORED_ANNOTATION
        }
        obj["metadata"]["annotations"] = annotations
        fixed.append(obj)
    third = reconcile(observe(job, pools, fixed, running), refuse, catalog, NOW)
    assert _applied(third.status) == ("True", "AllApplied", "")


def test_overrides_that_all_apply_make_it_true_and_no_overrides_leave_it_out(
    make_job: Callable[..., TrainingJob],
    plan: Plan,
    pools: tuple[GPUPool, ...],
    catalog: Catalog,
) -> None:
    fitting = {"spec": {"nodeSelector": {"example.com/disk": "ssd"}}}
    for overrides, expected in ((fitting, ("True", "AllApplied", "")), (None, None)):
        spec = JOB_SPEC | ({"podTemplateOverrides": overrides} if overrides else {})
        job = make_job(spec)
        first = reconcile(
            observe(job, pools, []), RecordingPlanner(Planned(best=plan)), catalog, NOW
        )
        assert _applied(first.status) == expected
        job = with_status(job, first)
        second = reconcile(observe(job, pools, list(first.create)), refuse, catalog, NOW)
        assert _applied(second.status) == expected
