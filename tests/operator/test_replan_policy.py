"""Per-job replan and failure settings: spec.replan / spec.failure over the operator defaults.

effective_config is checked field by field; the reconcile is checked to hand the job's view
to the state machine (a failed worker's restart is scheduled after the job's backoff).
How each setting changes a decision is tested beside the decision and the state machine
(test_replan_decision.py, test_replan_machine.py); the API server's bounds in
test_replan_policy_apiserver.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from operator_builders import JOB_SPEC
from pydantic import ValidationError
from test_reconcile_trainingjob import with_status

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.trainingjob import (
    Observed,
    observed_plan,
    observed_pod,
    reconcile,
)
from sailplan.operator.replan.cost import RestartCostModel
from sailplan.operator.replan.decision import ReplanConfig, effective_config
from sailplan.planner.api import Planned, PlanRequest, PlanResult
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.types import ProfileSet

NOW = datetime(2026, 1, 1, tzinfo=UTC)
# An operator started with non-default restart flags, so "kept the operator's value" cannot
# pass by coincidence with the dataclass defaults.
OPERATOR = ReplanConfig(
    restart=RestartCostModel(teardown_seconds=1.0, pod_start_seconds=2.0),
    horizon_seconds=1000.0,
    drain_timeout_seconds=20.0,
    backoff_base_seconds=5.0,
    backoff_cap_seconds=50.0,
)


def job_with(**spec: Any) -> TrainingJob:
    return TrainingJob.model_validate(
        {"name": "opt", "namespace": "team-a", "spec": JOB_SPEC | spec}
    )


def test_unset_fields_keep_the_operator_settings() -> None:
    assert effective_config(OPERATOR, job_with()) == OPERATOR
    assert effective_config(ReplanConfig(), job_with()) == ReplanConfig()


def test_every_set_field_overrides_its_setting() -> None:
    job = job_with(
        replan={
            "horizonSeconds": 86400,
            "drainTimeoutSeconds": 900,
            "checkpointBandwidthBytesPerSecond": 250_000_000,
        },
        failure={"backoffSeconds": 30, "maxBackoffSeconds": 3600},
    )
    assert effective_config(OPERATOR, job) == ReplanConfig(
        # Only the bandwidth is the job's; the operator's teardown and pod start stay.
        restart=RestartCostModel(
            storage_bytes_per_second=250e6, teardown_seconds=1.0, pod_start_seconds=2.0
        ),
        horizon_seconds=86400.0,
        drain_timeout_seconds=900.0,
        backoff_base_seconds=30.0,
        backoff_cap_seconds=3600.0,
    )


def test_a_base_above_the_operator_cap_raises_the_cap() -> None:
    # The user asked for at least 120 s between restarts; the operator's 50 s cap must not
    # silently shorten that.
    config = effective_config(OPERATOR, job_with(failure={"backoffSeconds": 120}))
    assert (config.backoff_base_seconds, config.backoff_cap_seconds) == (120.0, 120.0)
    # A base below the cap leaves the operator's cap alone.
    config = effective_config(OPERATOR, job_with(failure={"backoffSeconds": 7}))
    assert (config.backoff_base_seconds, config.backoff_cap_seconds) == (7.0, 50.0)
    # A cap alone below the operator's base: the cap wins (every delay is min(cap, ...)).
    config = effective_config(OPERATOR, job_with(failure={"maxBackoffSeconds": 2}))
    assert (config.backoff_base_seconds, config.backoff_cap_seconds) == (5.0, 2.0)


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("replan", "horizonSeconds", 59),
        ("replan", "horizonSeconds", 30 * 86400 + 1),
        ("replan", "drainTimeoutSeconds", 9),
        ("replan", "checkpointBandwidthBytesPerSecond", 999_999),
        ("failure", "backoffSeconds", 0),
        ("failure", "maxBackoffSeconds", 86401),
    ],
)
def test_out_of_bounds_values_are_refused(section: str, field: str, value: int) -> None:
    with pytest.raises(ValidationError, match=field):
        job_with(**{section: {field: value}})


def test_a_cap_below_the_base_is_refused() -> None:
    with pytest.raises(ValidationError, match="maxBackoffSeconds must be at least backoffSeconds"):
        job_with(failure={"backoffSeconds": 60, "maxBackoffSeconds": 30})
    # Equal is a constant delay, which is fine.
    assert job_with(failure={"backoffSeconds": 60, "maxBackoffSeconds": 60})


def test_reconcile_schedules_a_restart_after_the_jobs_backoff(
    make_job: Callable[..., TrainingJob],
    pools: tuple[GPUPool, ...],
    plan: Plan,
    catalog: Catalog,
) -> None:
    def planner(request: PlanRequest, measured: ProfileSet) -> PlanResult:
        return Planned(best=plan)

    job = make_job(JOB_SPEC | {"failure": {"backoffSeconds": 45}})
    first = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    job = with_status(job, first)
    created = list(first.create)
    plans = tuple(p for o in created if o["kind"] == "ConfigMap" if (p := observed_plan(o)))
    workers = []
    for body in (o for o in created if o["kind"] == "Pod"):
        index = body["metadata"]["labels"]["sailplan.dev/worker-index"]
        pod = observed_pod(body | {"status": {"phase": "Failed" if index == "1" else "Running"}})
        assert pod is not None
        workers.append(pod)
    observed = Observed(job=job, pools=pools, plans=plans, pods=tuple(workers), service_exists=True)
    failed = reconcile(observed, planner, catalog, NOW)
    # The first restart waits the job's base (the operator default would be 10 s).
    assert failed.status.restarts == 1
    assert failed.requeue_after == 45.0
    assert failed.memory.replan is not None and failed.memory.replan.not_before is not None
    assert (failed.memory.replan.not_before - NOW).total_seconds() == 45.0
