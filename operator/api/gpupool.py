"""GPUPool: a named set of GPU nodes the planner may use (cluster-scoped).

Cluster-scoped, like StorageClass or a GKE node pool itself: nodes are cluster-wide, one
pool is shared by TrainingJobs of every namespace, and a cluster admin (not a namespace
user) decides which nodes form a pool and what they cost. A pool selects nodes either by
GKE node-pool name or by a label selector; its GPU type and spot-ness come from the spec or
from the GKE labels on the nodes. The operator keeps the status in step with node events;
TrainingJobs plan from the status.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

from pydantic import ConfigDict, Field, JsonValue, field_validator

from sailplan.operator.api.common import (
    DNS1123_SUBDOMAIN,
    Conditions,
    KubeModel,
    LabelSelector,
    StatusModel,
)
from sailplan.operator.api.machines import MACHINE_SHAPES

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
REASON_CAN_GROW: Final = "CanGrow"  # Ready=True with no ready node: the pool can add some
REASON_SHAPE_MISMATCH: Final = "ShapeMismatch"  # spec.gpuType contradicts the machine type
# Whether the pool's zones still give nodes when asked (autoscaled pools only).
SCALE_UP_AVAILABLE: Final = "ScaleUpAvailable"
REASON_SCALE_UP_HEALTHY: Final = "ScaleUpHealthy"
REASON_SCALE_UP_BACKOFF: Final = "ScaleUpBackoff"  # a zone gave no node in time (stockout, quota)


# Set on the spec in the CRD (schema): exactly one way of selecting nodes.
SPEC_RULES: Final[list[JsonValue]] = [
    {
        "rule": "has(self.nodePool) != has(self.selector)",
        "message": "set exactly one of nodePool and selector",
    },
]


# Set on spec.autoscaling in the CRD: GKE's limits are per zone or for the whole pool, and
# a node shape must be known before any node exists.
AUTOSCALING_RULES: Final[list[JsonValue]] = [
    {
        "rule": "has(self.maxNodesPerZone) != has(self.totalMaxNodes)",
        "message": "set exactly one of maxNodesPerZone and totalMaxNodes",
    },
    {
        "rule": "!has(self.minNodesPerZone) || !has(self.maxNodesPerZone)"
        " || self.minNodesPerZone <= self.maxNodesPerZone",
        "message": "maxNodesPerZone must not be below minNodesPerZone",
    },
    {
        "rule": "!has(self.totalMinNodes) || !has(self.totalMaxNodes)"
        " || self.totalMinNodes <= self.totalMaxNodes",
        "message": "totalMaxNodes must not be below totalMinNodes",
    },
    {
        "rule": "has(self.machineType) || has(self.gpusPerNode)",
        "message": "set machineType or gpusPerNode: the node shape of a pool with no nodes",
    },
]


MACHINE_TYPES: Final[list[JsonValue]] = [*sorted(MACHINE_SHAPES)]


class ProvisioningRequestOptions(KubeModel):
    """Ask for a plan's nodes of this pool atomically with a ProvisioningRequest
    (autoscaling.x-k8s.io/v1, the API of GKE's queued provisioning / Dynamic Workload
    Scheduler and of the cluster autoscaler's atomic scale-up): worker pods are created only
    once the request is Provisioned, so a job never holds part of its nodes while waiting
    for the rest."""

    class_name: str = Field(
        default="queued-provisioning.gke.io",
        min_length=1,
        max_length=253,
        # The ProvisioningRequest CRD's own rule: refused here rather than at each request.
        pattern=DNS1123_SUBDOMAIN,
        description="provisioningClassName: queued-provisioning.gke.io (GKE DWS), "
        "best-effort-atomic-scale-up.autoscaling.x-k8s.io or "
        "check-capacity.autoscaling.x-k8s.io (cluster autoscaler)",
    )
    parameters: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="spec.parameters of the request (e.g. maxRunDurationSeconds on GKE)",
    )
    acceptance_timeout_seconds: int = Field(
        default=120,
        ge=10,
        le=3600,
        description="a request still without any condition this many seconds after it was "
        "created, while no request of its class has one, is of a class no autoscaler "
        "serves: its zone is backed off and the job replans (the cluster autoscaler marks "
        "one request Accepted per loop, every 10 s: 120 s is 12 loops)",
    )


class Autoscaling(KubeModel):
    """What the pool can become: a GKE node pool's autoscaling limits and node shape.

    The planner counts the nodes the pool may still add (up to its maximum) as obtainable
    capacity that takes `provisioningSeconds` to arrive; creating pods pinned to the pool
    and zone is what makes the cluster autoscaler add them.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": AUTOSCALING_RULES})

    zones: tuple[str, ...] = Field(
        min_length=1,
        max_length=32,
        description="zones the node pool may create nodes in (GKE node locations)",
    )
    machine_type: str | None = Field(
        default=None,
        description="GKE machine type (a2-highgpu-4g, a3-highgpu-8g, g2-standard-48, ...): "
        "fixes the GPU type and GPUs per node",
        json_schema_extra={"enum": MACHINE_TYPES},
    )
    gpus_per_node: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="GPUs of a new node (N1 with V100/T4); unset = from machineType",
    )
    min_nodes_per_zone: int | None = Field(default=None, ge=0, le=1000)
    max_nodes_per_zone: int | None = Field(default=None, ge=0, le=1000)
    total_min_nodes: int | None = Field(default=None, ge=0, le=10000)
    total_max_nodes: int | None = Field(default=None, ge=0, le=10000)
    provisioning_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="expected seconds from a pending pod to a Ready node of this pool",
    )
    provisioning_request: ProvisioningRequestOptions | None = Field(
        default=None,
        description="request the plan's nodes atomically through a ProvisioningRequest "
        "before creating its pods; unset = pending pods alone make the autoscaler add nodes",
    )
    provisioning_timeout_seconds: int = Field(
        default=900,
        ge=60,
        le=86400,
        description="a zone whose waiting workers get no node within this many seconds is "
        "short (stockout, quota): its possible nodes count as none for a backoff of 5 min, "
        "doubling to 30 min (the operator's defaults), until a node of the zone becomes "
        "Ready (the cluster autoscaler's max-node-provision-time and node-group backoff "
        "defaults)",
    )

    @field_validator("machine_type")
    @classmethod
    def _known_machine_type(cls, value: str | None) -> str | None:
        # The CRD's enum refuses it at the API server; this keeps the model as strict.
        if value is not None and value not in MACHINE_SHAPES:
            raise ValueError(f"unknown machine type {value!r}")
        return value


class Pricing(KubeModel):
    """Price overrides; unset means the catalog's list price for the nodes' region."""

    on_demand_usd_per_gpu_hour: float | None = Field(default=None, ge=0)
    spot_usd_per_gpu_hour: float | None = Field(default=None, ge=0)
    energy_usd_per_kwh: float | None = Field(
        default=None,
        ge=0,
        description="price of the energy the pool's GPUs draw: the Cost objective and "
        "budgets then add it (at default clocks, from the catalog's GPU power) to the GPU "
        "price; unset means energy is not priced",
    )


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
    autoscaling: Autoscaling | None = Field(
        default=None, description="unset = the pool is the nodes that exist, it never grows"
    )


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
    nodes_provisioning: int = Field(
        default=0, ge=0, description="nodes that exist but are not Ready yet"
    )
    nodes_possible: int = Field(
        default=0, ge=0, description="nodes the pool may still add here (autoscaling maximum)"
    )
    gpus_possible: int = Field(default=0, ge=0, description="GPUs of the nodes it may add")
    gpus_reserved: int = Field(
        default=0, ge=0, description="requested by workers created here and not yet bound"
    )
    scale_up_backoff_until: datetime | None = Field(
        default=None,
        description="workers waited here longer than provisioningTimeoutSeconds without a "
        "node: until then the zone's possible nodes count as none",
    )
    scale_up_backoff_seconds: int = Field(
        default=0,
        ge=0,
        description="the zone's current backoff; doubles each time it fails again, back to 0 "
        "once a node of the zone is Ready",
    )


class GPUPoolStatus(StatusModel):
    observed_generation: int | None = None
    gpu_type: str | None = Field(default=None, description="catalog name the pool resolved to")
    spot: bool | None = None
    nodes_total: int = Field(default=0, ge=0)
    nodes_ready: int = Field(default=0, ge=0)
    gpus_allocatable: int = Field(default=0, ge=0)
    gpus_in_use: int = Field(default=0, ge=0)
    gpus_per_node: int = Field(default=0, ge=0, description="GPUs of a new node (autoscaling)")
    provisioning_seconds: int | None = Field(default=None, ge=0)
    gpus_possible: int = Field(default=0, ge=0)
    gpus_reserved: int = Field(default=0, ge=0)
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
