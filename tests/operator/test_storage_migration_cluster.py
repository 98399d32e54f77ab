"""Storage-version migration against the real API server, run under the manifests' RBAC:
objects written while the CRDs stored v1alpha1 are stored again at v1beta1, a job's memory
in its v1alpha1 status moves to its state ConfigMap first, and the CRDs' storedVersions
ends as v1beta1 alone (controller.storage). The rewrite takes no field from the object's
other managers: a GitOps tool that applied the spec still owns all of it, and the
operator's field manager owns nothing there."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_process import ClusterRbac, install_crds, service_account_kubeconfig
from test_job_memory_cluster import _stored_at
from test_operator_cluster import job_body
from waiting import wait_for

from sailplan.operator.api.common import GROUP, LEGACY_VERSION, VERSION
from sailplan.operator.controller import storage
from sailplan.operator.kube import FIELD_MANAGER, Kube, as_field_manager
from sailplan.operator.reconcile.memory import STATE_KEY, state_configmap_name
from sailplan_dev.apply import apply
from sailplan_dev.localcluster.kubeconfig import api_client

pytestmark = [pytest.mark.cluster]

MEMORY = {
    "replan": {"phase": "Running", "generation": 2, "attempt": 1, "trigger": "before upgrade"}
}


def _stored_versions(k8s_api: Any, plural: str) -> list[str]:
    crd = client.ApiextensionsV1Api(k8s_api).read_custom_resource_definition(f"{plural}.{GROUP}")
    return list(crd.status.stored_versions)


def _fields(obj: dict[str, Any], manager: str) -> dict[str, Any]:
    """The fields `manager` owns in `obj` (its managedFields entry's fieldsV1)."""
    (entry,) = [m for m in obj["metadata"]["managedFields"] if m["manager"] == manager]
    fields: dict[str, Any] = entry["fieldsV1"]
    return fields


def test_objects_of_v1alpha1_are_rewritten_and_stored_versions_end_as_v1beta1(
    kubeconfig: str, k8s_api: Any, namespace: str, crds: None, tmp_path: Path
) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    pool = f"migrated-{uuid.uuid4().hex[:6]}"
    try:
        # What a cluster of the previous release holds: objects stored at v1alpha1, a job's
        # memory in its status.
        apply(k8s_api, _stored_at(LEGACY_VERSION))
        custom.create_cluster_custom_object(
            GROUP,
            LEGACY_VERSION,
            "gpupools",
            {
                "apiVersion": f"{GROUP}/{LEGACY_VERSION}",
                "kind": "GPUPool",
                "metadata": {"name": pool},
                "spec": {"nodePool": "a100-ondemand"},
            },
        )
        for name in ("old", "plain"):
            body = job_body(namespace, name, None)
            body["apiVersion"] = f"{GROUP}/{LEGACY_VERSION}"
            custom.create_namespaced_custom_object(
                GROUP, LEGACY_VERSION, namespace, "trainingjobs", body
            )
        # One as a GitOps tool applies it: server-side, under its own field manager.
        synced = job_body(namespace, "synced", None)
        synced["apiVersion"] = f"{GROUP}/{LEGACY_VERSION}"
        custom.patch_namespaced_custom_object(
            GROUP,
            LEGACY_VERSION,
            namespace,
            "trainingjobs",
            "synced",
            synced,
            field_manager="argocd",
            _content_type="application/apply-patch+yaml",
        )
        applied = _fields(
            custom.get_namespaced_custom_object(
                GROUP, LEGACY_VERSION, namespace, "trainingjobs", "synced"
            ),
            "argocd",
        )

        def kept_in_status() -> bool:
            custom.patch_namespaced_custom_object_status(
                GROUP,
                LEGACY_VERSION,
                namespace,
                "trainingjobs",
                "old",
                {"status": {"phase": "Running", "plan": None, **MEMORY}},
            )
            got = custom.get_namespaced_custom_object(
                GROUP, LEGACY_VERSION, namespace, "trainingjobs", "old"
            )
            return bool((got.get("status") or {}).get("replan"))

        wait_for("the memory stored in the v1alpha1 status", kept_in_status, 30)
    finally:
        install_crds(k8s_api)  # the upgrade: v1beta1 stored
    for plural in ("gpupools", "trainingjobs"):
        assert "v1alpha1" in _stored_versions(k8s_api, plural)

    rbac = ClusterRbac(k8s_api, namespace)
    try:
        token = rbac.grant()
        config = service_account_kubeconfig(kubeconfig, token, tmp_path / "operator.kubeconfig")
        operator_api = as_field_manager(api_client(Path(config)))
        try:
            asyncio.run(storage.migrate(Kube(operator_api)))
        finally:
            operator_api.close()
    finally:
        rbac.revoke()

    for plural in ("gpupools", "trainingjobs"):
        assert _stored_versions(k8s_api, plural) == ["v1beta1"]
    state = client.CoreV1Api(k8s_api).read_namespaced_config_map(
        state_configmap_name("old"), namespace
    )
    moved = json.loads(state.data[STATE_KEY])
    assert moved["replan"]["generation"] == 2 and moved["replan"]["trigger"] == "before upgrade"
    assert state.metadata.owner_references[0].name == "old"
    with pytest.raises(client.ApiException):
        client.CoreV1Api(k8s_api).read_namespaced_config_map(
            state_configmap_name("plain"), namespace
        )
    # Stored again at v1beta1: v1alpha1 no longer shows the status fields v1beta1 lacks.
    old = custom.get_namespaced_custom_object(
        GROUP, LEGACY_VERSION, namespace, "trainingjobs", "old"
    )
    assert "replan" not in old["status"] and old["status"]["phase"] == "Running"
    migrated = custom.get_cluster_custom_object(GROUP, VERSION, "gpupools", pool)
    assert migrated["spec"]["nodePool"] == "a100-ondemand"
    # The rewrite owns nothing: every field stays with whoever wrote it.
    jobs = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs")
    for obj in [migrated, *jobs["items"]]:
        managers = {m["manager"] for m in obj["metadata"]["managedFields"]}
        assert FIELD_MANAGER not in managers, obj["metadata"]
    rewritten = next(j for j in jobs["items"] if j["metadata"]["name"] == "synced")
    assert _fields(rewritten, "argocd") == applied
    assert "f:spec" in applied
    custom.delete_cluster_custom_object(GROUP, VERSION, "gpupools", pool)
    # Nothing left to do: a second run changes nothing (one read of each CRD).
    asyncio.run(storage.migrate(Kube(k8s_api)))
