"""spec.suspend against a real API server and the real operator (what Kueue does through
it): a job created suspended gets no pods; resumed it runs; suspended again its pods go and
the status says Suspended."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from argocd_lua import health
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_process import OperatorProcess
from test_operator_cluster import get_job, job_body, pods_of, wait_phase
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _conditions(job: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        c["type"]: (c["status"], c["reason"])
        for c in (job.get("status") or {}).get("conditions", [])
    }


def _set_suspend(k8s_api: Any, namespace: str, name: str, suspend: bool) -> None:
    client.CustomObjectsApi(k8s_api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", name, {"spec": {"suspend": suspend}}
    )


def test_suspend_resume_and_suspend_again(
    k8s_api: Any, namespace: str, operator: OperatorProcess, gpupools: Callable[..., str]
) -> None:
    pool = gpupools("a100-ondemand")
    # kwok's pods never exit on a checkpoint request: the drain ends at its timeout.
    body = job_body(namespace, "susp", [pool], suspend=True, replan={"drainTimeoutSeconds": 10})
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", body
    )
    job = wait_phase(k8s_api, namespace, "susp", {"Suspended", "Running", "Pending"})
    assert job["status"]["phase"] == "Suspended", job["status"]
    assert _conditions(job)["Suspended"] == ("True", "JobSuspended")
    # Argo CD's health of the object as the API server returns it.
    assert health(job)[0] == "Suspended"
    assert not job["status"].get("plan")
    assert not pods_of(k8s_api, namespace, "susp")

    _set_suspend(k8s_api, namespace, "susp", False)
    job = wait_phase(k8s_api, namespace, "susp", {"Running"}, 180)
    assert _conditions(job)["Suspended"] == ("False", "JobResumed")
    assert pods_of(k8s_api, namespace, "susp")

    _set_suspend(k8s_api, namespace, "susp", True)

    def released() -> dict[str, Any] | None:
        job = get_job(k8s_api, namespace, "susp")
        suspended = _conditions(job).get("Suspended") == ("True", "JobSuspended")
        return job if suspended and not pods_of(k8s_api, namespace, "susp") else None

    job = wait_for("pods gone and Suspended=True/JobSuspended", released, 120)
    assert job["status"]["phase"] == "Suspended"
    assert job["status"]["workers"]["desired"] == 0
    assert _conditions(job)["Running"] == ("False", "Suspended")
    status, message = health(job)
    assert status == "Suspended" and message.startswith("JobSuspended"), message

    # The GPUPool shows nothing in use or reserved any more (its status follows the pods).
    def pool_free() -> bool:
        status = client.CustomObjectsApi(k8s_api).get_cluster_custom_object(
            GROUP, VERSION, "gpupools", pool
        )["status"]
        return not status.get("gpusInUse") and not status.get("gpusReserved")

    wait_for("the pool's GPUs free", pool_free, 60)


@pytest.mark.cluster
def test_the_api_server_refuses_suspending_or_resuming_a_finished_job(
    k8s_api: Any, namespace: str, crds: None
) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    for name, phase in (("won", "Succeeded"), ("lost", "Failed")):
        body = job_body(namespace, name, None)
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", body)
        _set_suspend(k8s_api, namespace, name, True)  # not finished yet: allowed
        _set_suspend(k8s_api, namespace, name, False)
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "trainingjobs", name, {"status": {"phase": phase}}
        )
        with pytest.raises(ApiException) as error:
            _set_suspend(k8s_api, namespace, name, True)
        assert error.value.status == 422
        assert "spec.suspend cannot change after the job Succeeded or Failed" in str(
            error.value.body
        )
        # Other spec edits and status writes of a finished job still pass the rule.
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "trainingjobs", name, {"status": {"phase": phase}}
        )
        assert get_job(k8s_api, namespace, name)["spec"].get("suspend") is False
