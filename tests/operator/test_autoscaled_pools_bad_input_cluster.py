"""Bad autoscaling input against the real API server and the real operator: what the CRD
schema refuses at `kubectl apply` (a maximum below its minimum, both kinds of maximum, no
node shape, an unknown machine type), what becomes a condition with a reason (a GPU type
the catalog does not know), and a GPUPool that asks for ProvisioningRequests where the API
server serves none (the job says so instead of a pass that fails)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from argocd_lua import health
from kubernetes import client
from operator_builders import JOB_SPEC
from operator_process import OperatorProcess
from test_autoscaled_pools_cluster import ZONE, pool_status, submit
from test_operator_cluster import get_job, pods_of
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def refused(k8s_api: Any, autoscaling: dict[str, Any], **spec: Any) -> str:
    """The API server's message refusing a GPUPool with this autoscaling."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUPool",
        "metadata": {"name": f"bad-{uuid.uuid4().hex[:6]}"},
        "spec": {"nodePool": "bad", "autoscaling": autoscaling, **spec},
    }
    with pytest.raises(client.ApiException) as error:
        client.CustomObjectsApi(k8s_api).create_cluster_custom_object(
            GROUP, VERSION, "gpupools", body
        )
    assert error.value.status == 422
    return str(error.value.body)


@pytest.mark.usefixtures("crds")
def test_the_schema_refuses_impossible_autoscaling_limits_and_unknown_shapes(
    k8s_api: Any,
) -> None:
    shape = {"zones": [ZONE], "machineType": "a2-highgpu-4g"}
    message = refused(k8s_api, {**shape, "minNodesPerZone": 3, "maxNodesPerZone": 2})
    assert "maxNodesPerZone must not be below minNodesPerZone" in message
    message = refused(k8s_api, {**shape, "totalMinNodes": 5, "totalMaxNodes": 4})
    assert "totalMaxNodes must not be below totalMinNodes" in message
    message = refused(k8s_api, {**shape, "maxNodesPerZone": 2, "totalMaxNodes": 4})
    assert "set exactly one of maxNodesPerZone and totalMaxNodes" in message
    message = refused(k8s_api, {"zones": [ZONE], "maxNodesPerZone": 2})
    assert "set machineType or gpusPerNode" in message
    message = refused(k8s_api, {**shape, "machineType": "a9-imaginary-4g", "maxNodesPerZone": 1})
    assert "spec.autoscaling.machineType" in message and "a2-highgpu-4g" in message
    # A class name the ProvisioningRequest CRD itself would refuse on every request.
    message = refused(
        k8s_api,
        {**shape, "maxNodesPerZone": 1, "provisioningRequest": {"className": "example.com/dws"}},
    )
    assert "spec.autoscaling.provisioningRequest.className" in message


def test_an_unknown_gpu_type_is_a_condition_naming_the_known_ones(
    k8s_api: Any, operator: OperatorProcess, gpupools: Callable[..., str]
) -> None:
    pool = gpupools(
        f"h900-{uuid.uuid4().hex[:6]}",
        gpuType="H900",
        autoscaling={"zones": [ZONE], "gpusPerNode": 8, "maxNodesPerZone": 1},
    )

    def resolved() -> dict[str, Any] | None:
        conditions = {c["type"]: c for c in pool_status(k8s_api, pool).get("conditions", [])}
        return conditions.get("GPUTypeResolved")

    condition = wait_for("condition GPUTypeResolved", resolved, 90)
    assert (condition["status"], condition["reason"]) == ("False", "UnknownGPUType")
    assert "H900" in condition["message"] and "A100-40" in condition["message"]
    # Argo CD's health of the object as the API server returns it.
    gpupool = client.CustomObjectsApi(k8s_api).get_cluster_custom_object(
        GROUP, VERSION, "gpupools", pool
    )
    status, message = health(gpupool)
    assert status == "Degraded" and message.startswith("UnknownGPUType: "), message


@pytest.fixture
def no_provisioning_request_crd(k8s_api: Any) -> Iterator[None]:
    """The ProvisioningRequest CRD absent for the test (another test of the session may
    have installed it; it is put back afterwards)."""
    from sailplan_dev.localcluster import build

    extensions = client.ApiextensionsV1Api(k8s_api)
    crd = yaml.safe_load(build.provisioning_request_crd().read_text())
    name = crd["metadata"]["name"]
    try:
        extensions.delete_custom_resource_definition(name)
        existed = True
    except client.ApiException as error:
        if error.status != 404:
            raise
        existed = False

    def gone() -> bool:
        try:
            extensions.read_custom_resource_definition(name)
        except client.ApiException as error:
            return error.status == 404
        return False

    wait_for("the ProvisioningRequest CRD gone", gone, 60)
    yield
    if existed:
        extensions.create_custom_resource_definition(crd)

        def established() -> bool:
            found = extensions.read_custom_resource_definition(name)
            conditions = found.status.conditions or ()
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait_for("the ProvisioningRequest CRD back", established, 60)


@pytest.mark.usefixtures("no_provisioning_request_crd")
def test_provisioning_requests_without_their_crd_are_a_reason_on_the_job(
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
) -> None:
    pool = gpupools(
        f"nocrd-{uuid.uuid4().hex[:6]}",
        autoscaling={
            "zones": [ZONE],
            "machineType": "a2-highgpu-4g",
            "maxNodesPerZone": 2,
            "provisioningRequest": {},
        },
    )
    wait_for("possible capacity", lambda: pool_status(k8s_api, pool).get("gpusPossible") == 8, 90)
    submit(k8s_api, namespace, "nocrd", pool)

    def running_condition() -> dict[str, Any] | None:
        conditions = (get_job(k8s_api, namespace, "nocrd").get("status") or {}).get(
            "conditions", []
        )
        found = next((c for c in conditions if c["type"] == "Running"), None)
        return found if found and found.get("reason") == "CapacityRequestFailed" else None

    condition = wait_for(
        "Running=False CapacityRequestFailed",
        running_condition,
        120,
        lambda: str((get_job(k8s_api, namespace, "nocrd").get("status") or {}).get("conditions")),
    )
    assert "provisioningrequests.autoscaling.x-k8s.io" in condition["message"]
    assert f"spec.autoscaling.provisioningRequest from GPUPool {pool}" in condition["message"]
    assert pods_of(k8s_api, namespace, "nocrd") == []


@pytest.mark.usefixtures("crds")
def test_the_schema_refuses_a_negative_energy_price_and_an_energy_objective_without_a_floor(
    k8s_api: Any,
) -> None:
    shape = {"zones": [ZONE], "machineType": "a2-highgpu-4g", "maxNodesPerZone": 1}
    message = refused(k8s_api, shape, pricing={"energyUsdPerKwh": -0.1})
    assert "spec.pricing.energyUsdPerKwh" in message
    job = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": f"energy-{uuid.uuid4().hex[:6]}", "namespace": "default"},
        "spec": JOB_SPEC | {"objective": {"kind": "Energy"}},
    }
    with pytest.raises(client.ApiException) as error:
        client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
            GROUP, VERSION, "default", "trainingjobs", job
        )
    assert error.value.status == 422
    assert "kind Energy needs minSamplesPerSecond" in str(error.value.body)
