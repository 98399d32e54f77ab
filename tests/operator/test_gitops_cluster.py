"""TrainingJob and GPUPool under a GitOps tool (Argo CD, Flux), against the real API server:
a field the schema does not know must be refused rather than silently dropped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_operator_cluster import _kubectl, get_job, job_body

from sailplan.operator.api.common import GROUP, VERSION

pytestmark = [pytest.mark.cluster]


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
