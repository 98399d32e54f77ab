"""Fixtures of the operator's tests (builders live in operator_builders.py): pure builders,
and `operator`, the real operator as a subprocess against the local cluster."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_builders import JOB_SPEC, make_plan, pool
from operator_process import OperatorProcess
from outcome import failed
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
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


# Worker and profiling pods carry it (sailplan.operator.reconcile.naming.LABEL_JOB).
JOB_LABEL = "sailplan.dev/job"


@pytest.fixture
def operator(
    *,
    kubeconfig: str,
    namespace: str,
    crds: None,
    k8s_api: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[OperatorProcess]:
    # Extra command-line arguments: @pytest.mark.parametrize("operator", [(...)], indirect=True)
    extra = tuple(getattr(request, "param", ()))
    running = OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log", *extra)
    running.start()
    try:
        yield running
    finally:
        running.stop()
        if failed(request):
            # Shown under "Captured stdout teardown": what the operator did while it failed.
            print("\n".join(["-- operator log (last 80 lines)", *running.log_tail(80)]))
        # Free the GPUs for the next test: delete the jobs, wait for their pods to go.
        custom = client.CustomObjectsApi(k8s_api)
        core = client.CoreV1Api(k8s_api)
        for job in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs")[
            "items"
        ]:
            custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, "trainingjobs", job["metadata"]["name"]
            )
        # With the operator gone, a worker would wait out its grace period (a preempted
        # one's included) and the garbage collector on a loaded machine: the next test needs
        # the GPUs now, not what this one's pods would do on their way out.
        core.delete_collection_namespaced_pod(
            namespace, label_selector=JOB_LABEL, grace_period_seconds=0
        )
        wait_for(
            "test pods gone",
            lambda: not core.list_namespaced_pod(namespace, label_selector=JOB_LABEL).items,
            60,
        )
        if os.environ.get("SAILPLAN_TEST_SHOW_OPERATOR_LOG"):
            print(running.log.read_text())
