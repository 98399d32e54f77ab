"""The real API server enforces the bounds of spec.replan and spec.failure (tests/conftest.py
cluster fixtures): out-of-range values and a backoff cap below its base are refused with 422
at create and at update, and unset fields stay unset (no CRD default freezes the operator's
value into the stored object). Needs no operator: validation is the API server's own.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_operator_cluster import job_body as cluster_job_body

from sailplan.operator.api.common import GROUP, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PLURAL = "trainingjobs"


def job_body(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return cluster_job_body(namespace, name, None, **spec)


def refused(call: Any) -> str:
    with pytest.raises(ApiException) as error:
        call()
    assert error.value.status == 422, error.value.body
    return str(error.value.body)


BAD_VALUES = [
    ("replan", "horizonSeconds", 59, "greater than or equal to 60"),
    ("replan", "drainTimeoutSeconds", 86401, "less than or equal to 86400"),
    ("replan", "checkpointBandwidthBytesPerSecond", 1000, "greater than or equal to 1000000"),
    ("failure", "backoffSeconds", 0, "greater than or equal to 1"),
    ("failure", "maxBackoffSeconds", 86401, "less than or equal to 86400"),
]


def test_out_of_bounds_settings_are_refused_at_create_and_update(
    k8s_api: Any, namespace: str, crds: None
) -> None:
    custom = client.CustomObjectsApi(k8s_api)

    def create(body: dict[str, Any]) -> Any:
        return custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    for section, field, value, why in BAD_VALUES:
        body = job_body(namespace, "bad", **{section: {field: value}})
        message = refused(lambda body=body: create(body))
        assert f"spec.{section}.{field}" in message and why in message, message

    cap_below_base = {"backoffSeconds": 60, "maxBackoffSeconds": 30}
    message = refused(lambda: create(job_body(namespace, "bad", failure=cap_below_base)))
    assert "maxBackoffSeconds must be at least backoffSeconds" in message

    # Within bounds: stored as written; unset fields stay unset next to the defaulted ones.
    settings = {
        "replan": {
            "horizonSeconds": 86400,
            "drainTimeoutSeconds": 600,
            "checkpointBandwidthBytesPerSecond": 2_000_000_000,
        },
        "failure": {"backoffSeconds": 60, "maxBackoffSeconds": 60},
    }
    stored = create(job_body(namespace, "good", **settings))
    assert stored["spec"]["replan"] == settings["replan"] | {
        "minPredictedGain": 0.1,
        "cooldownSeconds": 300,
    }
    assert stored["spec"]["failure"] == settings["failure"] | {"maxRestarts": 3}
    plain = create(job_body(namespace, "plain"))
    assert plain["spec"]["replan"] == {"minPredictedGain": 0.1, "cooldownSeconds": 300}
    assert plain["spec"]["failure"] == {"maxRestarts": 3}

    # The same rules hold for an edit of a running job (merge patch: the base stays 60).
    def patch(failure: dict[str, Any]) -> Any:
        return custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "good", {"spec": {"failure": failure}}
        )

    message = refused(lambda: patch({"maxBackoffSeconds": 10}))
    assert "maxBackoffSeconds must be at least backoffSeconds" in message
    # Clearing the cap (null = unset) is fine: the rule only binds when both are set.
    cleared = patch({"maxBackoffSeconds": None})
    assert cleared["spec"]["failure"] == {"backoffSeconds": 60, "maxRestarts": 3}
