"""The operator's decisions reach the user as Kubernetes Events posted through Kopf (real
API server, operator as a subprocess): on the TrainingJob, from the operator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from operator_process import OperatorProcess
from test_operator_cluster import job_body, job_events
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_decision_is_an_event_on_the_job_from_the_operator(
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
) -> None:
    pool = gpupools("a100-ondemand")
    created: dict[str, Any] = client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", job_body(namespace, "told", [pool])
    )

    def planned() -> Any:
        found = [e for e in job_events(k8s_api, namespace, "told") if e.reason == "Planned"]
        return found[0] if found else None

    event = wait_for("a Planned Event", planned, 120)
    assert event.type == "Normal"
    assert event.message.startswith("generation 1: ")
    involved = event.involved_object
    assert (involved.kind, involved.name, involved.namespace, involved.uid) == (
        "TrainingJob",
        "told",
        namespace,
        created["metadata"]["uid"],
    )
    assert involved.api_version == f"{GROUP}/{VERSION}"
    assert event.source.component == "sailplan-operator"
    assert event.reporting_component == "sailplan-operator"
