"""What the operator needs to know about a Node and about the pods using its GPUs.

The handlers keep Kopf indices of these small records instead of whole Node and Pod
objects (a 500-node cluster stays cheap to hold and to scan); the GPUPool status is
computed from them by gpupool.py. A worker pod that is created but not bound yet holds no
node's GPUs but will take some in its pool and zone: `pod_gpu_reservation` counts it, so
that capacity is reserved until the pod binds or is deleted. `gpu_use` reads both from the
fresh list of live workers that each planning pass makes (controller.runtime).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from sailplan.operator.api.gpupool import GPU_RESOURCE, ZONE_LABEL
from sailplan.operator.reconcile.naming import LABEL_GPUPOOL

# Keys of the operator's pod index: a node name (GPUs of its bound pods), (GPUPool, zone)
# (GPUs its unbound workers reserve) or (WAITING, GPUPool, zone) (when each was created).
WAITING: Final = "waiting-since"
GpuIndexKey = str | tuple[str, str] | tuple[str, str, str]


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = False
    unschedulable: bool = False
    gpus_allocatable: int = 0
    # No Ready condition yet: a Node object made before its kubelet reported (Karpenter
    # creates them so). Capacity on its way, unlike a node whose kubelet stopped answering.
    starting: bool = False

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
    readiness = [c for c in status.get("conditions") or () if c.get("type") == "Ready"]
    ready = any(c.get("status") == "True" for c in readiness)
    allocatable = (status.get("allocatable") or {}).get(GPU_RESOURCE, 0)
    return NodeInfo(
        name=str(metadata.get("name", "")),
        labels=dict(metadata.get("labels") or {}),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable", False)),
        gpus_allocatable=_int_quantity(allocatable),
        starting=not readiness,
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


def other_pod_gpu_request(body: Mapping[str, Any]) -> tuple[str, int] | None:
    """(node name, GPUs) of a bound GPU pod that is no Sailplan worker (no GPUPool label),
    else None: the GPU use that the planning pass's fresh list of workers does not show."""
    if ((body.get("metadata") or {}).get("labels") or {}).get(LABEL_GPUPOOL):
        return None
    return pod_gpu_request(body)


def _pinned_zone(spec: Mapping[str, Any]) -> str | None:
    """The one zone a pod's required node affinity allows, if it names exactly one."""
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    zones = {
        value
        for term in required.get("nodeSelectorTerms") or ()
        for expression in term.get("matchExpressions") or ()
        if expression.get("key") == ZONE_LABEL and expression.get("operator") == "In"
        for value in expression.get("values") or ()
    }
    return next(iter(zones)) if len(zones) == 1 else None


def pod_gpu_reservation(body: Mapping[str, Any]) -> tuple[str, str, int] | None:
    """(GPUPool, zone, GPUs) a created but unbound worker pod will take, else None.

    Only the operator's workers (labelled with their GPUPool, pinned to one zone by node
    affinity); a bound, finished or deleting pod reserves nothing.
    """
    metadata = body.get("metadata") or {}
    pool = (metadata.get("labels") or {}).get(LABEL_GPUPOOL)
    spec = body.get("spec") or {}
    phase = (body.get("status") or {}).get("phase")
    if (
        not pool
        or spec.get("nodeName")
        or phase in ("Succeeded", "Failed")
        or metadata.get("deletionTimestamp")
    ):
        return None
    zone = _pinned_zone(spec)
    gpus = requested_gpus(body)
    return (str(pool), zone, gpus) if zone and gpus else None


def created_at(body: Mapping[str, Any]) -> datetime | None:
    """metadata.creationTimestamp as an aware datetime (None when absent or malformed)."""
    stamp = (body.get("metadata") or {}).get("creationTimestamp")
    if isinstance(stamp, datetime):
        return stamp
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def pod_priority(body: Mapping[str, Any]) -> int:
    """spec.priority: the value the API server resolved from the pod's priorityClassName
    (the scheduler preempts pods of lower priority for it); 0 when unset."""
    value = (body.get("spec") or {}).get("priority")
    return int(value) if isinstance(value, int) else 0


@dataclass(frozen=True)
class GpuUse:
    """GPUs that pods hold or will take, as one read of them saw it."""

    in_use: Mapping[str, int] = field(default_factory=dict)  # node -> GPUs of bound pods
    priorities: Mapping[str, int] = field(default_factory=dict)  # node -> highest priority
    reservations: tuple[tuple[str, str, int], ...] = ()  # (GPUPool, zone, GPUs), unbound


def gpu_use(pods: Iterable[Mapping[str, Any]]) -> GpuUse:
    """What `pods` (API dicts) hold per node once bound (`pod_gpu_request`, with their
    priority) and reserve per pool and zone while unbound (`pod_gpu_reservation`)."""
    in_use: dict[str, int] = {}
    priorities: dict[str, int] = {}
    reservations: list[tuple[str, str, int]] = []
    for body in pods:
        held = pod_gpu_request(body)
        if held is not None:
            node, gpus = held
            in_use[node] = in_use.get(node, 0) + gpus
            priority = pod_priority(body)
            priorities[node] = max(priorities.get(node, priority), priority)
            continue
        reservation = pod_gpu_reservation(body)
        if reservation is not None:
            reservations.append(reservation)
    return GpuUse(in_use, priorities, tuple(reservations))


def bound_nodes(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """uid -> node of the bound pods among `pods` (API dicts)."""
    result: dict[str, str] = {}
    for body in pods:
        uid = (body.get("metadata") or {}).get("uid")
        node = (body.get("spec") or {}).get("nodeName")
        if uid and node:
            result[str(uid)] = str(node)
    return result


def busiest(*views: Mapping[str, int]) -> dict[str, int]:
    """Per node, the largest value any view gives (GPUs in use, or the highest priority):
    views of the same pods read at different moments, none of which may be missed."""
    result: dict[str, int] = {}
    for view in views:
        for node, value in view.items():
            result[node] = max(result.get(node, value), value)
    return result


def held_priorities(priorities: Mapping[str, int], in_use: Mapping[str, int]) -> dict[str, int]:
    """`priorities` (node -> highest priority of its GPU pods) of the nodes `in_use` says
    are held: a node whose pods are gone counts free, never preemptible as well."""
    return {node: value for node, value in priorities.items() if in_use.get(node, 0) > 0}
