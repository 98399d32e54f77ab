"""The state ConfigMap: where the operator keeps its memory of a TrainingJob (api.memory).

One ConfigMap per job, `<job>-state`, labelled like the job's other children
(`sailplan.dev/job`, `sailplan.dev/role: state`) and owned by the job (controller
ownerReference), so it goes with the job. Why a ConfigMap and not a CRD of its own:
docs/reference/api-versions.md. The runtime reads it at the start of each pass
(controller.observation) and writes what the pure reconcile returns as `Outcome.memory`, at
most once per pass and only when it changed (controller.apply).

A job an older operator ran has no ConfigMap yet and its memory in the v1alpha1 status
fields; `Stored.legacy` marks memory read from there, which the first pass writes here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from sailplan.operator.api.common import API_VERSION
from sailplan.operator.api.memory import LEGACY_STATUS_FIELDS, JobMemory
from sailplan.operator.api.trainingjob import KIND
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.children import controller_uid

ROLE_STATE: Final = "state"
STATE_KEY: Final = "state.json"


def state_configmap_name(job: str) -> str:
    return f"{job}-state"


@dataclass(frozen=True)
class Stored:
    """The memory as read, with what writing it back needs."""

    memory: JobMemory
    # The ConfigMap's resourceVersion; None when there is none (the write creates it).
    resource_version: str | None = None
    # Read from the status of a v1alpha1 object (no ConfigMap yet): the pass migrates it.
    legacy: bool = False

    def needs_write(self, memory: JobMemory | None) -> bool:
        if memory is None:
            return False
        if self.resource_version is None:
            return not memory.is_empty()  # nothing to remember: no ConfigMap needed yet
        return memory != self.memory


def read(body: Mapping[str, Any] | None, job_uid: str) -> Stored | None:
    """The memory in a state ConfigMap of the job with `job_uid`; None when there is no
    such ConfigMap or it belongs to another object (an earlier job of the same name)."""
    if body is None:
        return None
    metadata = body.get("metadata") or {}
    if controller_uid(metadata) != job_uid:
        return None
    text = (body.get("data") or {}).get(STATE_KEY, "")
    try:
        memory = JobMemory.model_validate_json(text) if text else JobMemory()
    except ValidationError:
        memory = JobMemory()  # unreadable: the reconcile adopts the newest plan ConfigMap
    return Stored(memory, resource_version=str(metadata.get("resourceVersion") or "") or None)


def render(
    namespace: str, job: str, uid: str, memory: JobMemory, resource_version: str | None
) -> dict[str, Any]:
    """The state ConfigMap of job `job` (uid `uid`) holding `memory`; with
    `resource_version`, a replacement the API server refuses if it changed since read."""
    metadata: dict[str, Any] = {
        "name": state_configmap_name(job),
        "namespace": namespace,
        "labels": naming.job_labels(job, ROLE_STATE),
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": job,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {STATE_KEY: memory.model_dump_json(by_alias=True, exclude_none=True)},
    }


def legacy(raw_status: Mapping[str, Any]) -> Stored:
    """The memory a v1alpha1 object kept in its status (api.memory.LEGACY_STATUS_FIELDS)."""
    return Stored(JobMemory.from_legacy_status(dict(raw_status)), legacy=True)


def has_legacy_fields(raw_status: Mapping[str, Any]) -> bool:
    return any(raw_status.get(key) for key in LEGACY_STATUS_FIELDS)
