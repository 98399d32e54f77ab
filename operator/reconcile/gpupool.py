"""GPUPool status from the nodes it selects: counts per zone, GPU type, spot, conditions.

Called by the GPUPool handler whenever a node or a GPU-holding pod changes. Pure: nodes,
GPU usage and the catalog come in as arguments, the clock as `now`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime

from sailplan.operator.api import gpupool as api
from sailplan.operator.api.common import Condition, set_condition
from sailplan.operator.api.gpupool import GPUPool, GPUPoolStatus, ZoneStatus
from sailplan.operator.reconcile.nodes import NodeInfo
from sailplan.planner.catalog import Catalog, UnknownGPUError


def selects(pool: GPUPool, node: NodeInfo) -> bool:
    spec = pool.spec
    if spec.node_pool is not None:
        return node.labels.get(api.NODEPOOL_LABEL) == spec.node_pool
    if spec.selector is not None:
        return spec.selector.matches(dict(node.labels))
    return False


def _resolve_gpu_type(
    pool: GPUPool, nodes: list[NodeInfo], catalog: Catalog
) -> tuple[str | None, Condition]:
    """The pool's catalog GPU name, from the spec or the nodes' GKE accelerator label."""
    if pool.spec.gpu_type is not None:
        wanted, source = {pool.spec.gpu_type}, "spec.gpuType"
    else:
        wanted = {
            n.labels[api.ACCELERATOR_LABEL] for n in nodes if api.ACCELERATOR_LABEL in n.labels
        }
        source = f"label {api.ACCELERATOR_LABEL}"
    if not wanted:
        return None, Condition(
            type=api.GPU_TYPE_RESOLVED,
            status="False",
            reason=api.REASON_NO_GPU_TYPE,
            message=f"set spec.gpuType or label the nodes with {api.ACCELERATOR_LABEL}",
        )
    try:
        resolved = {catalog.resolve_gpu(name) for name in wanted}
    except UnknownGPUError as error:
        return None, Condition(
            type=api.GPU_TYPE_RESOLVED,
            status="False",
            reason=api.REASON_UNKNOWN_GPU_TYPE,
            message=f"{source}: {error}",
        )
    if len(resolved) > 1:
        return None, Condition(
            type=api.GPU_TYPE_RESOLVED,
            status="False",
            reason=api.REASON_MIXED_GPU_TYPES,
            message=f"nodes carry several GPU types ({', '.join(sorted(resolved))}); "
            "a pool must be homogeneous: split it or set spec.gpuType",
        )
    (gpu_type,) = resolved
    return gpu_type, Condition(
        type=api.GPU_TYPE_RESOLVED,
        status="True",
        reason=api.REASON_RESOLVED,
        message=f"{gpu_type} (from {source})",
    )


def _zone_status(zone: str, nodes: list[NodeInfo], in_use: Mapping[str, int]) -> ZoneStatus:
    ready = [n for n in nodes if n.schedulable]
    sizes = Counter(n.gpus_allocatable for n in ready if n.gpus_allocatable > 0)
    # The most common node size; ties go to the larger one (deterministic).
    gpus_per_node = max(sizes.items(), key=lambda kv: (kv[1], kv[0]))[0] if sizes else 0
    free = [
        n for n in ready if n.gpus_allocatable >= gpus_per_node > 0 and in_use.get(n.name, 0) == 0
    ]
    return ZoneStatus(
        zone=zone,
        nodes_total=len(nodes),
        nodes_ready=len(ready),
        nodes_free=len(free),
        gpus_per_node=gpus_per_node,
        gpus_allocatable=sum(n.gpus_allocatable for n in ready),
        gpus_in_use=sum(in_use.get(n.name, 0) for n in ready),
    )


def pool_status(
    pool: GPUPool,
    nodes: Iterable[NodeInfo],
    gpus_in_use: Mapping[str, int],
    catalog: Catalog,
    now: datetime,
) -> GPUPoolStatus:
    """The status the pool should have given every node of the cluster and GPU usage."""
    selected = sorted((n for n in nodes if selects(pool, n)), key=lambda n: n.name)
    gpu_type, type_condition = _resolve_gpu_type(pool, selected, catalog)

    by_zone: dict[str, list[NodeInfo]] = {}
    for node in selected:
        by_zone.setdefault(node.zone or "unknown", []).append(node)
    zones = tuple(_zone_status(z, by_zone[z], gpus_in_use) for z in sorted(by_zone))

    if pool.spec.spot is not None:
        spot: bool | None = pool.spec.spot
    elif selected:
        # One preemptible node makes the pool preemptible for planning purposes.
        spot = any(n.labels.get(api.SPOT_LABEL) == "true" for n in selected)
    else:
        spot = None

    nodes_ready = sum(z.nodes_ready for z in zones)
    ready_condition = Condition(
        type=api.READY,
        status="True" if nodes_ready else "False",
        reason=api.REASON_NODES_READY if nodes_ready else api.REASON_NO_READY_NODES,
        message=f"{nodes_ready}/{len(selected)} nodes ready and schedulable",
    )
    conditions = pool.status.conditions
    for condition in (ready_condition, type_condition):
        conditions = set_condition(
            conditions, condition.model_copy(update={"observed_generation": pool.generation}), now
        )
    return GPUPoolStatus(
        observed_generation=pool.generation,
        gpu_type=gpu_type,
        spot=spot,
        nodes_total=len(selected),
        nodes_ready=nodes_ready,
        gpus_allocatable=sum(z.gpus_allocatable for z in zones),
        gpus_in_use=sum(z.gpus_in_use for z in zones),
        zones=zones,
        conditions=conditions,
    )
