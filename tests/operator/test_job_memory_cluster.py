"""The operator's memory of a job lives in the job's state ConfigMap, against the real API
server and the real operator: the status shows none of it, an operator restarted mid-job
resumes from it, and a job an older operator ran (its memory in the v1alpha1 status) keeps
it across the upgrade: the restarted operator's storage migration (controller.storage)
moves it to the ConfigMap and the job goes on without replanning (reconcile.memory,
docs/reference/api-versions.md; the per-pass fallback is tested in test_job_memory.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from operator_process import OperatorProcess, install_crds
from test_operator_cluster import get_job, job_body, pods_of, wait_phase
from waiting import wait_for

from sailplan.operator.api import crd
from sailplan.operator.api.common import GROUP, LEGACY_VERSION, VERSION
from sailplan.operator.reconcile.memory import STATE_KEY, state_configmap_name
from sailplan_dev.apply import apply

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _state(k8s_api: Any, namespace: str, job: str) -> Any:
    try:
        return client.CoreV1Api(k8s_api).read_namespaced_config_map(
            state_configmap_name(job), namespace
        )
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def _memory(k8s_api: Any, namespace: str, job: str) -> dict[str, Any]:
    found = _state(k8s_api, namespace, job)
    loaded: dict[str, Any] = json.loads(found.data[STATE_KEY]) if found is not None else {}
    return loaded


def _write_memory(k8s_api: Any, namespace: str, job: str, memory: dict[str, Any]) -> None:
    client.CoreV1Api(k8s_api).patch_namespaced_config_map(
        state_configmap_name(job), namespace, {"data": {STATE_KEY: json.dumps(memory)}}
    )


def _with_restarts(job: dict[str, Any], restarts: int) -> dict[str, Any] | None:
    return job if job["status"].get("restarts") == restarts else None


def _get(k8s_api: Any, version: str, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(
        GROUP, version, namespace, "trainingjobs", name
    )
    return found


def test_memory_is_an_owned_configmap_and_a_restarted_operator_resumes_from_it(
    k8s_api: Any, namespace: str, operator: OperatorProcess, gpupools: Callable[..., str]
) -> None:
    pool = gpupools("a100-ondemand")
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", job_body(namespace, "mem", [pool])
    )
    job = wait_phase(k8s_api, namespace, "mem", {"Running"})
    state = _state(k8s_api, namespace, "mem")
    assert state is not None
    (owner,) = state.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller) == (
        "TrainingJob",
        "mem",
        job["metadata"]["uid"],
        True,
    )
    assert state.metadata.labels["sailplan.dev/job"] == "mem"
    assert state.metadata.labels["sailplan.dev/role"] == "state"
    memory = _memory(k8s_api, namespace, "mem")
    assert memory["replan"]["generation"] == 1 and memory["replan"]["phase"] == "Running"
    # The status holds what users read, at either version, and no memory.
    for version in (VERSION, LEGACY_VERSION):
        status = _get(k8s_api, version, namespace, "mem")["status"]
        assert "replan" not in status and "unschedulableInputs" not in status
        assert status["plan"]["generation"] == 1
    # A quiet pass writes nothing: the memory did not change.
    version_before = state.metadata.resource_version
    client.CustomObjectsApi(k8s_api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", "mem", {"metadata": {"labels": {"x": "1"}}}
    )
    wait_for(
        "a pass after the label",
        lambda: get_job(k8s_api, namespace, "mem")["status"].get("observedGeneration"),
        30,
    )

    # Killed, then its memory changed while it is down: the restarted operator reads the
    # ConfigMap (the failure budget spent shows in status.restarts), and plans nothing anew.
    operator.kill()
    assert _state(k8s_api, namespace, "mem").metadata.resource_version == version_before
    memory["replan"]["failures"] = {"restarts": 2, "lastFailure": "before the restart"}
    _write_memory(k8s_api, namespace, "mem", memory)
    before = sorted(p.metadata.name for p in pods_of(k8s_api, namespace, "mem"))
    operator.start()
    job = wait_for(
        "status.restarts from the memory",
        lambda: _with_restarts(get_job(k8s_api, namespace, "mem"), 2),
        60,
    )
    assert job["status"]["plan"]["generation"] == 1
    assert [h["generation"] for h in job["status"]["history"]] == [1]
    assert sorted(p.metadata.name for p in pods_of(k8s_api, namespace, "mem")) == before
    assert _memory(k8s_api, namespace, "mem")["replan"]["failures"]["restarts"] == 2

    # The ConfigMap goes with the job (garbage collector, through the ownerReference).
    client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", "mem"
    )
    wait_for("the state ConfigMap gone", lambda: _state(k8s_api, namespace, "mem") is None, 60)


def _stored_at(version: str) -> list[dict[str, Any]]:
    """The CRDs as an operator of the previous release had them: `version` stored."""
    definitions = crd.all_crds()
    for definition in definitions:
        for served in definition["spec"]["versions"]:
            served["storage"] = served["name"] == version
    return definitions


def test_a_job_whose_memory_is_in_its_v1alpha1_status_is_migrated_on_the_first_pass(
    k8s_api: Any, namespace: str, operator: OperatorProcess, gpupools: Callable[..., str]
) -> None:
    pool = gpupools("a100-ondemand")
    custom = client.CustomObjectsApi(k8s_api)
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", job_body(namespace, "legacy", [pool])
    )
    wait_phase(k8s_api, namespace, "legacy", {"Running"})
    operator.kill()
    # Make it what an older operator left: stored at v1alpha1 with the memory in its status
    # (the failure budget changed, to tell the migrated memory from a fresh bootstrap).
    memory = _memory(k8s_api, namespace, "legacy")
    memory["replan"]["failures"] = {"restarts": 1, "lastFailure": "kept in the status"}
    try:
        apply(k8s_api, _stored_at(LEGACY_VERSION))

        def kept_in_status() -> bool:
            # Repeated until the API server stores at v1alpha1 (a CRD change takes a moment);
            # stored at v1beta1, the status field would be pruned.
            custom.patch_namespaced_custom_object_status(
                GROUP,
                LEGACY_VERSION,
                namespace,
                "trainingjobs",
                "legacy",
                {"status": {"replan": memory["replan"], "restarts": 0}},
            )
            status = _get(k8s_api, LEGACY_VERSION, namespace, "legacy")["status"]
            return bool(status.get("replan"))

        wait_for("the memory kept in the v1alpha1 status", kept_in_status, 30)
        client.CoreV1Api(k8s_api).delete_namespaced_config_map(
            state_configmap_name("legacy"), namespace
        )
        old = _get(k8s_api, LEGACY_VERSION, namespace, "legacy")["status"]
        assert old["replan"]["failures"]["restarts"] == 1
        assert "replan" not in _get(k8s_api, VERSION, namespace, "legacy")["status"]
        before = sorted(p.metadata.name for p in pods_of(k8s_api, namespace, "legacy"))
    finally:
        install_crds(k8s_api)  # v1beta1 stored again, as the upgrade installs it

    operator.start()
    wait_for(
        "the memory in the state ConfigMap",
        lambda: _memory(k8s_api, namespace, "legacy").get("replan"),
        60,
    )
    moved = _memory(k8s_api, namespace, "legacy")["replan"]
    assert moved["failures"]["restarts"] == 1 and moved["generation"] == 1
    job = wait_for(
        "status.restarts from the migrated memory",
        lambda: _with_restarts(get_job(k8s_api, namespace, "legacy"), 1),
        60,
    )
    # Nothing planned or started anew, and the status no longer holds the memory.
    assert job["status"]["plan"]["generation"] == 1
    assert sorted(p.metadata.name for p in pods_of(k8s_api, namespace, "legacy")) == before
    assert "replan" not in _get(k8s_api, LEGACY_VERSION, namespace, "legacy")["status"]
