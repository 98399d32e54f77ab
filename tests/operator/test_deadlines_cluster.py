"""spec.activeDeadlineSeconds and spec.ttlSecondsAfterFinished against a real API server,
with the operator holding exactly the ClusterRole of manifests/base/rbac.yaml (which must
allow deleting the finished job)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from argocd_lua import health
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_process import ClusterRbac, OperatorProcess, service_account_kubeconfig
from test_operator_cluster import get_job, job_body, pods_of, wait_phase
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _gone(k8s_api: Any, namespace: str, name: str) -> bool:
    try:
        get_job(k8s_api, namespace, name)
    except ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def test_a_job_past_its_deadline_fails_and_is_deleted_after_its_ttl(
    kubeconfig: str,
    k8s_api: Any,
    namespace: str,
    gpupools: Callable[..., str],
    tmp_path: Path,
) -> None:
    rbac = ClusterRbac(k8s_api, namespace)
    try:
        token = rbac.grant()
        limited = service_account_kubeconfig(kubeconfig, token, tmp_path / "operator.kubeconfig")
        pool = gpupools("a100-ondemand")
        operator = OperatorProcess(limited, namespace, tmp_path / "operator.log")
        operator.start()
        try:
            body = job_body(
                namespace, "late", [pool], activeDeadlineSeconds=30, ttlSecondsAfterFinished=20
            )
            client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
                GROUP, VERSION, namespace, "trainingjobs", body
            )
            job = wait_phase(k8s_api, namespace, "late", {"Failed"}, 180)
            conditions = {c["type"]: c for c in job["status"]["conditions"]}
            assert conditions["Failed"]["reason"] == "DeadlineExceeded"
            # Argo CD's health of the object as the API server returns it.
            status, message = health(job)
            assert status == "Degraded" and message.startswith("DeadlineExceeded: "), message
            assert job["status"]["completionTime"]
            wait_for("the job's pods gone", lambda: not pods_of(k8s_api, namespace, "late"), 60)
            wait_for("the job deleted after its TTL", lambda: _gone(k8s_api, namespace, "late"), 90)
            log = operator.log.read_text()
            assert "Forbidden" not in log, log[-2000:]
        finally:
            operator.stop()
    finally:
        rbac.revoke()
