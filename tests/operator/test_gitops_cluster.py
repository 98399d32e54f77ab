"""TrainingJob and GPUPool under a GitOps tool (Argo CD, Flux), against the real API server
and the real operator: the tool server-side applies the manifests from Git again and again,
so a re-apply must change nothing, the operator must never own a field the tool applies
(only the status subresource), an edit of an immutable field must be refused naming it,
and a field the schema does not know must be refused rather than silently dropped.

The tool is played by server-side apply with field manager "argocd" (what Argo CD's
server-side sync sends); the operator writes as its own field manager, `sailplan-operator`
(operator.kube.FIELD_MANAGER).
"""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_process import OperatorProcess
from test_operator_cluster import _kubectl, get_job, job_body, wait_phase

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.kube import FIELD_MANAGER

pytestmark = [pytest.mark.cluster]

GITOPS = "argocd"
APPLY = "application/apply-patch+yaml"


def _apply(k8s_api: Any, body: dict[str, Any]) -> dict[str, Any] | None:
    """Server-side apply of one manifest as the GitOps tool (no forced conflicts: a field
    someone else owns with another value is refused, as Argo CD reports a sync error).
    The object applied, or None when the apply created it (the client reads no 201 body)."""
    custom = client.CustomObjectsApi(k8s_api)
    name = body["metadata"]["name"]
    applied: dict[str, Any] | None
    if body["kind"] == "GPUPool":
        applied = custom.patch_cluster_custom_object(
            GROUP, VERSION, "gpupools", name, body, field_manager=GITOPS, _content_type=APPLY
        )
    else:
        namespace = body["metadata"]["namespace"]
        applied = custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "trainingjobs",
            name,
            body,
            field_manager=GITOPS,
            _content_type=APPLY,
        )
    return applied


def _read(k8s_api: Any, body: dict[str, Any]) -> dict[str, Any]:
    if body["kind"] == "GPUPool":
        found: dict[str, Any] = client.CustomObjectsApi(k8s_api).get_cluster_custom_object(
            GROUP, VERSION, "gpupools", body["metadata"]["name"]
        )
        return found
    return get_job(k8s_api, body["metadata"]["namespace"], body["metadata"]["name"])


def _owned_by_others(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """managedFields entries of any manager but the GitOps tool."""
    return [m for m in obj["metadata"].get("managedFields", []) if m["manager"] != GITOPS]


def _gitops_entry(obj: dict[str, Any]) -> dict[str, Any]:
    (entry,) = [m for m in obj["metadata"]["managedFields"] if m["manager"] == GITOPS]
    return entry


def _reapply_changes_nothing(k8s_api: Any, body: dict[str, Any]) -> None:
    """Re-apply `body` and check nothing changed. The operator may write the status between
    the read and the apply (a new resourceVersion that is not the apply's doing), so a
    changed resourceVersion is retried a few times: a re-apply that writes would write
    every time."""
    for _ in range(5):
        before = _read(k8s_api, body)
        after = _apply(k8s_api, copy.deepcopy(body))
        assert after is not None
        assert after["metadata"]["generation"] == before["metadata"]["generation"]
        assert after["spec"] == before["spec"]
        assert _gitops_entry(after) == _gitops_entry(before)  # its time too: no write
        if after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]:
            return
    pytest.fail(f"every re-apply of {body['kind']} {body['metadata']['name']} wrote it")


def test_reapplying_changes_nothing_and_the_operator_owns_only_status(
    k8s_api: Any, namespace: str, operator: OperatorProcess
) -> None:
    pool_name = f"gitops-{uuid.uuid4().hex[:6]}"
    pool = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUPool",
        "metadata": {"name": pool_name, "labels": {"app.kubernetes.io/instance": "ml"}},
        "spec": {"nodePool": "a100-ondemand"},
    }
    job = job_body(namespace, "synced", [pool_name])
    job["metadata"]["labels"] = {"app.kubernetes.io/instance": "ml"}
    job["metadata"]["annotations"] = {"argocd.argoproj.io/sync-wave": "1"}
    try:
        _apply(k8s_api, copy.deepcopy(pool))
        _apply(k8s_api, copy.deepcopy(job))
        created = _read(k8s_api, job)
        running = wait_phase(k8s_api, namespace, "synced", {"Running"}, 180)

        for body in (pool, job):
            live = _read(k8s_api, body)
            # The operator wrote the status (so it has an entry), through the status
            # subresource only, and owns nothing else: no spec, no label, no annotation,
            # no finalizer, no ownerReference.
            others = _owned_by_others(live)
            assert {m["manager"] for m in others} == {FIELD_MANAGER}, others
            for entry in others:
                assert entry.get("subresource") == "status", entry
                assert set(entry["fieldsV1"]) == {"f:status"}, entry
            metadata = live["metadata"]
            assert metadata.get("labels") == body["metadata"]["labels"]
            assert metadata.get("annotations") == body["metadata"].get("annotations")
            assert not metadata.get("finalizers") and not metadata.get("ownerReferences")
            assert live["metadata"]["generation"] == 1
            _reapply_changes_nothing(k8s_api, body)

        assert running["spec"] == created["spec"]
        # Sync again with the job's manifest as Git holds it after someone edited an
        # immutable field: the API server refuses it, naming the field.
        for edit, field, says in (
            (
                {"checkpoint": {"storage": {"uri": "gs://other/ckpt"}}},
                "spec.checkpoint.storage",
                "checkpoint storage is immutable",
            ),
            ({"model": {"name": "OPT-1.3B"}}, "spec.model", "model is immutable"),
        ):
            edited = copy.deepcopy(job)
            edited["spec"].update(edit)
            with pytest.raises(ApiException) as error:
                _apply(k8s_api, edited)
            assert error.value.status == 422, error.value.body
            assert field in str(error.value.body) and says in str(error.value.body)
        assert get_job(k8s_api, namespace, "synced")["spec"] == created["spec"]
    finally:
        client.CustomObjectsApi(k8s_api).delete_cluster_custom_object(
            GROUP, VERSION, "gpupools", pool_name
        )


def _with_unknown_fields(namespace: str, name: str) -> dict[str, Any]:
    return job_body(
        namespace,
        name,
        ["x"],
        podTemplateOverrides={
            "spec": {
                "nodeSelectr": {"example.com/disk": "ssd"},
                "containers": [{"name": "trainer", "envv": [{"name": "A", "value": "1"}]}],
            }
        },
    )


@pytest.mark.usefixtures("crds")
def test_an_unknown_override_field_is_refused_naming_it(
    kubeconfig: str, k8s_api: Any, namespace: str, tmp_path: Path
) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    with pytest.raises(ApiException) as error:
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "trainingjobs",
            _with_unknown_fields(namespace, "typo"),
            field_validation="Strict",
        )
    assert error.value.status == 400, error.value.body
    message = json.loads(error.value.body)["message"]
    assert 'unknown field "spec.podTemplateOverrides.spec.nodeSelectr"' in message, message
    assert 'unknown field "spec.podTemplateOverrides.spec.containers[0].envv"' in message

    # kubectl asks for Strict by default (client-side and server-side apply alike).
    manifest = tmp_path / "typo.yaml"
    manifest.write_text(yaml.safe_dump(_with_unknown_fields(namespace, "typo")))
    for extra in ((), ("--server-side",)):
        refused = _kubectl(kubeconfig, "apply", *extra, "-f", str(manifest))
        assert refused.returncode != 0, refused.stdout
        assert "spec.podTemplateOverrides.spec.nodeSelectr" in refused.stderr, refused.stderr
    with pytest.raises(ApiException) as missing:
        get_job(k8s_api, namespace, "typo")
    assert missing.value.status == 404

    # A client that asks to ignore unknown fields gets the object without them.
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "trainingjobs",
        _with_unknown_fields(namespace, "pruned"),
        field_validation="Ignore",
    )
    overrides = get_job(k8s_api, namespace, "pruned")["spec"]["podTemplateOverrides"]["spec"]
    assert "nodeSelectr" not in overrides
    assert overrides["containers"] == [{"name": "trainer"}]
