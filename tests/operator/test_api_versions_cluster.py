"""Against the real API server: v1alpha1 manifests keep applying (with kubectl's deprecation
warning) and every object reads the same at v1beta1 and v1alpha1, whichever version wrote
it (conversion strategy None: api/crd.py, docs/reference/api-versions.md)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from test_operator_cluster import _kubectl, job_body

from sailplan.operator.api.common import GROUP, LEGACY_VERSION, VERSION

pytestmark = [pytest.mark.cluster]


def _get(k8s_api: Any, version: str, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(
        GROUP, version, namespace, "trainingjobs", name
    )
    return found


def test_a_v1alpha1_manifest_applies_with_kubectl_and_reads_back_as_v1beta1(
    kubeconfig: str, k8s_api: Any, namespace: str, crds: None, tmp_path: Path
) -> None:
    body = job_body(namespace, "old-manifest", ["some-pool"])
    body["apiVersion"] = f"{GROUP}/{LEGACY_VERSION}"
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(body))
    applied = _kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert applied.returncode == 0, applied.stderr
    assert f"{GROUP}/v1alpha1 TrainingJob is deprecated" in applied.stderr
    assert "use sailplan.dev/v1beta1" in applied.stderr

    new = _get(k8s_api, VERSION, namespace, "old-manifest")
    old = _get(k8s_api, LEGACY_VERSION, namespace, "old-manifest")
    assert new["apiVersion"] == "sailplan.dev/v1beta1"
    assert old["apiVersion"] == "sailplan.dev/v1alpha1"
    assert new["spec"] == old["spec"]
    assert new["spec"]["training"]["steps"] == 10
    # Defaults are applied as for a v1beta1 manifest.
    assert new["spec"]["objective"]["kind"] == "Throughput"
    assert new["metadata"]["uid"] == old["metadata"]["uid"]

    # The same v1alpha1 manifest, edited and applied again, updates the object.
    body["spec"]["training"]["steps"] = 20
    manifest.write_text(yaml.safe_dump(body))
    again = _kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert again.returncode == 0, again.stderr
    assert _get(k8s_api, VERSION, namespace, "old-manifest")["spec"]["training"]["steps"] == 20

    # kubectl get with the fully qualified version works for both.
    for version in (VERSION, LEGACY_VERSION):
        shown = _kubectl(
            kubeconfig,
            "get",
            f"trainingjobs.{version}.{GROUP}",
            "old-manifest",
            "-n",
            namespace,
            "-o",
            "jsonpath={.apiVersion} {.spec.training.steps}",
        )
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == f"{GROUP}/{version} 20"


def test_a_v1beta1_object_reads_back_as_v1alpha1_and_refuses_the_same_bad_input(
    k8s_api: Any, namespace: str, crds: None
) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    body = job_body(namespace, "new-manifest", None, objective={"kind": "Cost"})
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", body)
    old = _get(k8s_api, LEGACY_VERSION, namespace, "new-manifest")
    new = _get(k8s_api, VERSION, namespace, "new-manifest")
    assert old["spec"] == new["spec"] and old["spec"]["objective"]["kind"] == "Cost"
    # A write through v1alpha1 lands in the same object.
    custom.patch_namespaced_custom_object(
        GROUP,
        LEGACY_VERSION,
        namespace,
        "trainingjobs",
        "new-manifest",
        {"spec": {"suspend": True}},
    )
    assert _get(k8s_api, VERSION, namespace, "new-manifest")["spec"]["suspend"] is True
    # Both versions carry the same validation.
    for version in (VERSION, LEGACY_VERSION):
        bad = job_body(namespace, f"bad-{version}", None, objective={"kind": "Energy"})
        bad["apiVersion"] = f"{GROUP}/{version}"
        with pytest.raises(client.ApiException) as refused:
            custom.create_namespaced_custom_object(GROUP, version, namespace, "trainingjobs", bad)
        assert refused.value.status == 422
        assert "kind Energy needs minSamplesPerSecond" in str(refused.value.body)


def test_gpupools_are_served_at_both_versions(k8s_api: Any, crds: None) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    name = f"versions-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(
        GROUP,
        LEGACY_VERSION,
        "gpupools",
        {
            "apiVersion": f"{GROUP}/{LEGACY_VERSION}",
            "kind": "GPUPool",
            "metadata": {"name": name},
            "spec": {"nodePool": "a100-ondemand"},
        },
    )
    try:
        new = custom.get_cluster_custom_object(GROUP, VERSION, "gpupools", name)
        old = custom.get_cluster_custom_object(GROUP, LEGACY_VERSION, "gpupools", name)
        assert new["apiVersion"] == f"{GROUP}/{VERSION}"
        assert new["spec"] == old["spec"] and new["spec"]["nodePool"] == "a100-ondemand"
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "gpupools", name)
