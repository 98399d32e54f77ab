"""What the operator needs to know about a Node and about the pods using its GPUs.

The handlers keep Kopf indices of these small records instead of whole Node and Pod
objects (a 500-node cluster stays cheap to hold and to scan); the GPUPool status is
computed from them by gpupool.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sailplan.operator.api.gpupool import GPU_RESOURCE, ZONE_LABEL


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = False
    unschedulable: bool = False
    gpus_allocatable: int = 0

    @property
    def zone(self) -> str:
        return self.labels.get(ZONE_LABEL, "")

    @property
    def schedulable(self) -> bool:
        return self.ready and not self.unschedulable


def _int_quantity(value: object) -> int:
    # Extended resources such as nvidia.com/gpu are whole numbers.
    try:
        return int(str(value))
    except ValueError:
        return 0


def node_info(body: Mapping[str, Any]) -> NodeInfo:
    """Summarize a Node object (as a dict from the API)."""
    metadata = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    allocatable = (status.get("allocatable") or {}).get(GPU_RESOURCE, 0)
    return NodeInfo(
        name=str(metadata.get("name", "")),
        labels=dict(metadata.get("labels") or {}),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable", False)),
        gpus_allocatable=_int_quantity(allocatable),
    )


def _container_gpus(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    requested = (resources.get("limits") or {}).get(GPU_RESOURCE) or (
        resources.get("requests") or {}
    ).get(GPU_RESOURCE)
    return _int_quantity(requested or 0)


def requested_gpus(body: Mapping[str, Any]) -> int:
    """GPUs a pod asks for, whatever its phase: as the scheduler counts them, the larger of
    its app containers' sum and its largest init container (a profiling pod's GPU is held
    by its init container, the profiler)."""
    spec = body.get("spec") or {}
    app = sum(_container_gpus(c) for c in spec.get("containers") or ())
    init = max((_container_gpus(c) for c in spec.get("initContainers") or ()), default=0)
    return max(app, init)


def pod_gpu_request(body: Mapping[str, Any]) -> tuple[str, int] | None:
    """(node name, GPUs requested) of a bound pod that holds GPUs, else None.

    Pods that finished (Succeeded/Failed) no longer hold their GPUs.
    """
    spec = body.get("spec") or {}
    node = spec.get("nodeName")
    phase = (body.get("status") or {}).get("phase")
    if not node or phase in ("Succeeded", "Failed"):
        return None
    gpus = requested_gpus(body)
    return (str(node), gpus) if gpus else None
