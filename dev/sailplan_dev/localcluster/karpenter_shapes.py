"""What the local Karpenter is told: GKE GPU machine types and the NodePools of a GPUPool.

Pure (no I/O), so unit tests check every label, limit and taint without a cluster
(tests/cluster/test_karpenter_units.py). `instance_types` is Karpenter's kwok-provider
instance-types file: the GKE GPU machine types of operator.api.machines, sized by GKE's
machine pages and priced from the planner's catalog; `without_offerings` takes a machine
type's offerings in some zones out of it (a stockout there). `node_pools` are the NodePools a
GPUPool's spec.autoscaling stands for. The cluster test and benchmarks/autoscale.py give
them to localcluster.karpenter.Karpenter (the process).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Final

from sailplan.operator.api.gpupool import (
    GKE_GPU_TAINT,
    GKE_SPOT_TAINT,
    GPU_RESOURCE,
    NODEPOOL_LABEL,
    GPUPool,
)
from sailplan.operator.api.machines import MACHINE_SHAPES
from sailplan.planner.catalog import Catalog, default_catalog
from sailplan.planner.cluster import region_of

from .nodes import (
    ACCELERATOR_LABEL,
    INSTANCE_TYPE_LABEL,
    MANAGER_KWOK,
    MANAGER_LABEL,
    REGION_LABEL,
    SPOT_LABEL,
    ZONE_LABEL,
)

KARPENTER_GROUP: Final = "karpenter.sh"
KARPENTER_VERSION_API: Final = "v1"
CAPACITY_TYPE_LABEL: Final = "karpenter.sh/capacity-type"
NODEPOOL_OF_NODE_LABEL: Final = "karpenter.sh/nodepool"
NODE_CLASS: Final = "sailplan"
# On every NodePool made here, so Karpenter.stop() removes exactly those (and their nodes).
OWNER_LABEL: Final = "sailplan.dev/local-karpenter"

# vCPUs and memory of the GKE GPU machine types (GKE's accelerator-optimized and G2 machine
# pages; their GB figures written as Gi, close enough for a fake node); the GPU type and
# count are MACHINE_SHAPES'.
_MACHINE_SIZES: Final[dict[str, tuple[str, str]]] = {
    "a2-highgpu-1g": ("12", "85Gi"),
    "a2-highgpu-2g": ("24", "170Gi"),
    "a2-highgpu-4g": ("48", "340Gi"),
    "a2-highgpu-8g": ("96", "680Gi"),
    "a2-megagpu-16g": ("96", "1360Gi"),
    "a2-ultragpu-1g": ("12", "170Gi"),
    "a2-ultragpu-2g": ("24", "340Gi"),
    "a2-ultragpu-4g": ("48", "680Gi"),
    "a2-ultragpu-8g": ("96", "1360Gi"),
    "a3-highgpu-8g": ("208", "1872Gi"),
    "a3-megagpu-8g": ("208", "1872Gi"),
    "a3-ultragpu-8g": ("224", "2952Gi"),
    "g2-standard-4": ("4", "16Gi"),
    "g2-standard-8": ("8", "32Gi"),
    "g2-standard-12": ("12", "48Gi"),
    "g2-standard-16": ("16", "64Gi"),
    "g2-standard-24": ("24", "96Gi"),
    "g2-standard-32": ("32", "128Gi"),
    "g2-standard-48": ("48", "192Gi"),
    "g2-standard-96": ("96", "384Gi"),
}
# N1 machines take V100s or T4s attached separately (a GPUPool says gpuType and
# autoscaling.gpusPerNode). Karpenter knows a shape only by its instance-type name, so each
# (GPU, count) is one instance type, named n1-standard-<vCPUs>-<count>x<gpu>; on GKE the
# instance-type label would say only n1-standard-<vCPUs>.
_N1_GPUS: Final[tuple[str, ...]] = ("V100-16", "T4")
_N1_COUNTS: Final[tuple[int, ...]] = (1, 2, 4, 8)


class KarpenterError(RuntimeError):
    """Karpenter could not be started, or did not become ready."""


def n1_instance_type(gpu_type: str, gpus: int) -> str:
    return f"n1-standard-{8 * gpus}-{gpus}x{gpu_type.lower().split('-')[0]}"


def accelerator(catalog: Catalog, gpu_type: str) -> str:
    """The GKE accelerator name (label cloud.google.com/gke-accelerator) of a catalog GPU."""
    spec = catalog.gpu(catalog.resolve_gpu(gpu_type))
    names = [a for a in spec.aliases if a.startswith("nvidia-")]
    if not names:
        raise KarpenterError(f"GPU type {gpu_type} has no GKE accelerator alias in the catalog")
    return names[0]


def _shapes() -> Iterator[tuple[str, str, int, str, str]]:
    """(instance type, catalog GPU type, GPUs, vCPUs, memory) of every machine offered."""
    for name, shape in MACHINE_SHAPES.items():
        cpu, memory = _MACHINE_SIZES[name]
        yield name, shape.gpu_type, shape.gpus_per_node, cpu, memory
    for gpu in _N1_GPUS:
        for count in _N1_COUNTS:
            yield n1_instance_type(gpu, count), gpu, count, str(8 * count), f"{30 * count}Gi"


def _requirement(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": [value]}


def instance_types(zones: Iterable[str], catalog: Catalog | None = None) -> list[dict[str, Any]]:
    """Karpenter's instance-types file (kwok provider format): every GKE GPU machine type,
    offered on demand and spot in each zone at the catalog's price for the zone's region.

    The offerings' single-valued requirements become labels of the nodes Karpenter makes:
    zone, region, capacity type, and GKE's accelerator and spot labels.
    """
    catalog = catalog or default_catalog()
    zones = sorted(set(zones))
    types: list[dict[str, Any]] = []
    for name, gpu_type, gpus, cpu, memory in _shapes():
        gke_accelerator = accelerator(catalog, gpu_type)
        offerings = [
            {
                "Price": round(
                    catalog.price_per_gpu_hour(gpu_type, region_of(zone), spot) * gpus, 6
                ),
                "Available": True,
                "Requirements": [
                    _requirement(CAPACITY_TYPE_LABEL, "spot" if spot else "on-demand"),
                    _requirement(ZONE_LABEL, zone),
                    _requirement(REGION_LABEL, region_of(zone)),
                    _requirement(ACCELERATOR_LABEL, gke_accelerator),
                    _requirement(SPOT_LABEL, "true" if spot else "false"),
                ],
            }
            for zone in zones
            for spot in (False, True)
        ]
        types.append(
            {
                "name": name,
                "offerings": offerings,
                "architecture": "amd64",
                "operatingSystems": ["linux"],
                "resources": {
                    "cpu": cpu,
                    "memory": memory,
                    GPU_RESOURCE: str(gpus),
                    "pods": "110",
                    "ephemeral-storage": "100Gi",
                },
            }
        )
    return types


def without_offerings(
    types: list[dict[str, Any]], machine_type: str, zones: Iterable[str]
) -> list[dict[str, Any]]:
    """`types` where `machine_type` is no longer offered in `zones` (on demand nor spot): a
    stockout there, as the cloud would answer for a while.

    The kwok provider has no unavailable offering: it marks every offering of its file
    Available when it reads it, so one that is gone has to be missing from the file. The
    other machine types, and this one in other zones, stay as they were.
    """
    gone = set(zones)
    if not any(t["name"] == machine_type for t in types):
        raise KarpenterError(f"no instance type {machine_type} to take offerings from")
    result = []
    for instance in types:
        if instance["name"] == machine_type:
            kept = [o for o in instance["offerings"] if _zone_of(o) not in gone]
            instance = {**instance, "offerings": kept}
        result.append(instance)
    return result


def _zone_of(offering: dict[str, Any]) -> str | None:
    return next((r["values"][0] for r in offering["Requirements"] if r["key"] == ZONE_LABEL), None)


def node_pool_instance_type(pool: GPUPool, catalog: Catalog | None = None) -> str:
    autoscaling = pool.spec.autoscaling
    if autoscaling is None:
        raise KarpenterError(f"GPUPool {pool.name} has no spec.autoscaling")
    if autoscaling.machine_type is not None:
        return autoscaling.machine_type
    if pool.spec.gpu_type is None or autoscaling.gpus_per_node is None:
        raise KarpenterError(f"GPUPool {pool.name}: no machineType, and no gpuType + gpusPerNode")
    catalog = catalog or default_catalog()
    return n1_instance_type(catalog.resolve_gpu(pool.spec.gpu_type), autoscaling.gpus_per_node)


def node_pools(
    pool: GPUPool, consolidate_after_s: int = 0, catalog: Catalog | None = None
) -> list[dict[str, Any]]:
    """The Karpenter NodePools standing for a GPUPool's spec.autoscaling.

    Nodes get the labels the GPUPool selects (GKE node-pool name or its selector's labels)
    and its taints; requirements fix the machine type, zone and capacity type. GKE's
    maxNodesPerZone is a limit per zone, which a NodePool cannot express over several zones:
    one NodePool per zone then, each limited to that many nodes (and their GPUs);
    totalMaxNodes is one NodePool over all the zones. Minimums are not modelled (Karpenter
    has none for dynamic NodePools).
    """
    autoscaling = pool.spec.autoscaling
    if autoscaling is None:
        raise KarpenterError(f"GPUPool {pool.name} has no spec.autoscaling")
    machine = node_pool_instance_type(pool, catalog)
    offered = {name: count for name, _gpu, count, _cpu, _mem in _shapes()}
    if machine not in offered:
        raise KarpenterError(f"GPUPool {pool.name}: no instance type {machine} is offered")
    gpus = offered[machine]
    if pool.spec.node_pool is not None:
        labels = {NODEPOOL_LABEL: pool.spec.node_pool}
    else:
        assert pool.spec.selector is not None  # the CRD requires one of the two
        labels = dict(pool.spec.selector.match_labels)
    spot = bool(pool.spec.spot)
    taints = pool.spec.taints
    if taints is None:
        taints = (GKE_GPU_TAINT, GKE_SPOT_TAINT) if spot else (GKE_GPU_TAINT,)
    if autoscaling.max_nodes_per_zone is not None:
        groups = [([zone], autoscaling.max_nodes_per_zone) for zone in autoscaling.zones]
    else:
        groups = [(list(autoscaling.zones), autoscaling.total_max_nodes or 0)]
    manifests = []
    for zones, max_nodes in groups:
        suffix = f"-{zones[0]}" if len(groups) > 1 else ""
        manifests.append(
            {
                "apiVersion": f"{KARPENTER_GROUP}/{KARPENTER_VERSION_API}",
                "kind": "NodePool",
                "metadata": {"name": f"{pool.name}{suffix}"[:253], "labels": {OWNER_LABEL: "true"}},
                "spec": {
                    "template": {
                        "metadata": {"labels": {**labels, MANAGER_LABEL: MANAGER_KWOK}},
                        "spec": {
                            "nodeClassRef": {
                                "group": "karpenter.kwok.sh",
                                "kind": "KWOKNodeClass",
                                "name": NODE_CLASS,
                            },
                            "requirements": [
                                {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [machine]},
                                {"key": ZONE_LABEL, "operator": "In", "values": zones},
                                {
                                    "key": CAPACITY_TYPE_LABEL,
                                    "operator": "In",
                                    "values": ["spot" if spot else "on-demand"],
                                },
                            ],
                            "taints": [
                                {"key": t.key, "effect": t.effect}
                                | ({"value": t.value} if t.value is not None else {})
                                for t in taints
                            ],
                            "expireAfter": "Never",
                        },
                    },
                    "disruption": {
                        "consolidationPolicy": "WhenEmptyOrUnderutilized",
                        "consolidateAfter": f"{consolidate_after_s}s",
                        # Every empty node may go at once (the default allows 10% of them).
                        "budgets": [{"nodes": "100%"}],
                    },
                    "limits": {"nodes": str(max_nodes), GPU_RESOURCE: str(max_nodes * gpus)},
                },
            }
        )
    return manifests
