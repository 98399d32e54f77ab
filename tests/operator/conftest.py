"""Fixtures of the operator's unit tests (builders live in operator_builders.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from operator_builders import JOB_SPEC, make_plan, pool

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.planner.catalog import Catalog, default_catalog
from sailplan.planner.plan import Plan


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return default_catalog()


@pytest.fixture
def plan(catalog: Catalog) -> Plan:
    return make_plan(catalog)


@pytest.fixture
def pools() -> tuple[GPUPool, ...]:
    return (
        pool("a100", "a100-ondemand", {"us-central1-a": 2, "us-central1-b": 2}),
        pool("v100", "v100-ondemand", {"us-west1-b": 3}, gpu_type="V100-16"),
    )


@pytest.fixture
def make_job() -> Callable[..., TrainingJob]:
    def build(
        spec: dict[str, Any] | None = None,
        status: dict[str, Any] | None = None,
        name: str = "opt",
        generation: int = 1,
    ) -> TrainingJob:
        return TrainingJob.model_validate(
            {
                "name": name,
                "namespace": "team-a",
                "uid": "uid-1234",
                "generation": generation,
                "spec": spec if spec is not None else JOB_SPEC,
                "status": status or {},
            }
        )

    return build
