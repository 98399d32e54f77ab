"""GPUPool: a named set of GPU nodes the planner may use (cluster-scoped).

Cluster-scoped, like StorageClass or a GKE node pool itself: nodes are cluster-wide, one
pool is shared by TrainingJobs of every namespace, and a cluster admin (not a namespace
user) decides which nodes form a pool and what they cost. A pool selects nodes either by
GKE node-pool name or by a label selector; its GPU type and spot-ness come from the spec or
from the GKE labels on the nodes. The operator keeps the status in step with node events;
TrainingJobs plan from the status.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import ConfigDict, Field, JsonValue

from sailplan.operator.api.common import (
    DNS1123_SUBDOMAIN,
    Conditions,
    KubeModel,
    LabelSelector,
    StatusModel,
)

KIND: Final = "GPUPool"
PLURAL: Final = "gpupools"

# GKE labels the pool reads from its nodes.
NODEPOOL_LABEL: Final = "cloud.google.com/gke-nodepool"
ACCELERATOR_LABEL: Final = "cloud.google.com/gke-accelerator"
SPOT_LABEL: Final = "cloud.google.com/gke-spot"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
GPU_RESOURCE: Final = "nvidia.com/gpu"

# Condition types and reasons.
READY: Final = "Ready"
GPU_TYPE_RESOLVED: Final = "GPUTypeResolved"
REASON_NODES_READY: Final = "NodesReady"
REASON_NO_READY_NODES: Final = "NoReadyNodes"
REASON_RESOLVED: Final = "Resolved"
REASON_UNKNOWN_GPU_TYPE: Final = "UnknownGPUType"
REASON_MIXED_GPU_TYPES: Final = "MixedGPUTypes"
REASON_NO_GPU_TYPE: Final = "NoGPUType"


# Set on the spec in the CRD (schema): exactly one way of selecting nodes.
SPEC_RULES: Final[list[JsonValue]] = [
    {
        "rule": "has(self.nodePool) != has(self.selector)",
        "message": "set exactly one of nodePool and selector",
    },
]


class Pricing(KubeModel):
    """Price overrides; unset means the catalog's list price for the nodes' region."""

    on_demand_usd_per_gpu_hour: float | None = Field(default=None, ge=0)
    spot_usd_per_gpu_hour: float | None = Field(default=None, ge=0)


TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Taint(KubeModel):
    """A taint the pool's nodes carry (core/v1 Taint): its pods get the matching toleration."""

    key: str = Field(min_length=1, max_length=316)
    value: str | None = Field(
        default=None, max_length=63, description="unset = tolerate the key with any value"
    )
    effect: TaintEffect


# GKE taints every GPU node with this; spot node pools may add cloud.google.com/gke-spot.
GKE_GPU_TAINT: Final = Taint(key=GPU_RESOURCE, value="present", effect="NoSchedule")
GKE_SPOT_TAINT: Final = Taint(key=SPOT_LABEL, value="true", effect="NoSchedule")


class GPUPoolSpec(KubeModel):
    """Which nodes form the pool and what they are."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": SPEC_RULES})

    node_pool: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS1123_SUBDOMAIN,
        description="GKE node pool name (nodes labelled cloud.google.com/gke-nodepool=<name>)",
    )
    selector: LabelSelector | None = Field(
        default=None, description="alternative to nodePool: nodes carrying all these labels"
    )
    gpu_type: str | None = Field(
        default=None,
        max_length=63,
        description="catalog GPU name or alias; unset = read cloud.google.com/gke-accelerator",
    )
    spot: bool | None = Field(
        default=None, description="unset = read cloud.google.com/gke-spot from the nodes"
    )
    taints: tuple[Taint, ...] | None = Field(
        default=None,
        max_length=32,
        description="the taints the pool's nodes carry; its worker and profiling pods tolerate "
        "exactly these. Unset = GKE's: nvidia.com/gpu=present:NoSchedule, plus "
        "cloud.google.com/gke-spot=true:NoSchedule on a spot pool; [] = untainted nodes",
    )
    pricing: Pricing | None = None


class ZoneStatus(StatusModel):
    """The pool's nodes in one zone."""

    zone: str
    nodes_total: int = Field(default=0, ge=0)
    nodes_ready: int = Field(default=0, ge=0, description="Ready and not cordoned")
    nodes_free: int = Field(
        default=0, ge=0, description="ready nodes with none of their GPUs requested by pods"
    )
    gpus_per_node: int = Field(default=0, ge=0, description="allocatable GPUs on a ready node")
    gpus_allocatable: int = Field(default=0, ge=0, description="over ready nodes")
    gpus_in_use: int = Field(default=0, ge=0, description="requested by pods on ready nodes")


class GPUPoolStatus(StatusModel):
    observed_generation: int | None = None
    gpu_type: str | None = Field(default=None, description="catalog name the pool resolved to")
    spot: bool | None = None
    nodes_total: int = Field(default=0, ge=0)
    nodes_ready: int = Field(default=0, ge=0)
    gpus_allocatable: int = Field(default=0, ge=0)
    gpus_in_use: int = Field(default=0, ge=0)
    zones: tuple[ZoneStatus, ...] = Field(
        default=(),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["zone"]},
    )
    conditions: Conditions = ()


class GPUPool(KubeModel):
    """A parsed GPUPool object (name plus spec and status)."""

    name: str
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    spec: GPUPoolSpec
    status: GPUPoolStatus = GPUPoolStatus()

    def node_taints(self) -> tuple[Taint, ...]:
        """The taints its nodes carry: the spec's, or GKE's for a GPU (and spot) pool."""
        if self.spec.taints is not None:
            return self.spec.taints
        return (GKE_GPU_TAINT, GKE_SPOT_TAINT) if self.status.spot else (GKE_GPU_TAINT,)
