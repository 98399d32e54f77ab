"""The planner's ClusterSnapshot, built from GPUPool statuses.

One snapshot Pool per (GPUPool, zone): the planner's pools are homogeneous and in one zone,
a GPUPool may span zones. Only nodes with all their GPUs free count, because a plan puts
whole tensor-parallel groups on nodes and a half-used node cannot promise that. Prices are
the GPUPool's overrides where given, else left to the catalog (None).

An autoscaled GPUPool adds the nodes it may still create as obtainable nodes (with its
provisioning time). GPUs reserved by workers that were created and are not bound yet
(another job's plan) are taken off first the free nodes (where the scheduler would put
them), then the obtainable ones, in whole nodes: two jobs never count the same capacity.
A planning pass reads the live workers fresh and corrects the statuses with them
(`with_reservations` for the unbound ones, `with_in_use` for the bound ones), because the
GPUPool status that counts a worker's node as busy is written a moment after it binds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import PoolSelection
from sailplan.operator.reconcile.gpupool import selects
from sailplan.operator.reconcile.naming import pool_key
from sailplan.operator.reconcile.nodes import NodeInfo
from sailplan.planner.cluster import ClusterSnapshot, Pool

# "free": nodes a new worker can take now (planning); "ready": every healthy node, busy or
# not (what profiles a job may need, since it may use any of them later); "possible": the
# ready nodes, or one node for a zone with none ready that may still add some (where a
# profiling pod, pinned there, makes the autoscaler add a node to measure).
NodeCount = Literal["free", "ready", "possible"]


class PoolSelectionError(ValueError):
    """The job names GPUPools that do not exist."""


def select_pools(selection: PoolSelection, pools: Iterable[GPUPool]) -> list[GPUPool]:
    """The GPUPools a job may use, sorted by name."""
    available = sorted(pools, key=lambda p: p.name)
    if selection.names is not None:
        by_name = {p.name: p for p in available}
        missing = sorted(set(selection.names) - set(by_name))
        if missing:
            known = ", ".join(by_name) or "none"
            raise PoolSelectionError(
                f"spec.pools.names: no GPUPool named {', '.join(missing)}; existing: {known}"
            )
        return [by_name[name] for name in sorted(set(selection.names))]
    if selection.selector is not None:
        selector = selection.selector
        return [p for p in available if selector.matches(p.labels)]
    return available


def with_reservations(
    pools: Sequence[GPUPool], reservations: Iterable[tuple[str, str, int]]
) -> tuple[GPUPool, ...]:
    """`pools` with each zone's gpusReserved set from (GPUPool, zone, GPUs) of the unbound
    workers that exist now (nodes.pod_gpu_reservation), fresher than the written status."""
    reserved: dict[tuple[str, str], int] = {}
    for pool_name, zone_name, gpus in reservations:
        reserved[pool_name, zone_name] = reserved.get((pool_name, zone_name), 0) + gpus
    result = []
    for pool in pools:
        zones = tuple(
            zone.model_copy(update={"gpus_reserved": reserved.get((pool.name, zone.zone), 0)})
            for zone in pool.status.zones
        )
        status = pool.status.model_copy(update={"zones": zones})
        result.append(pool.model_copy(update={"status": status}))
    return tuple(result)


def with_in_use(
    pools: Sequence[GPUPool], nodes: Mapping[str, NodeInfo], in_use: Mapping[str, int]
) -> tuple[GPUPool, ...]:
    """`pools` with each zone's nodesFree counted again from `nodes` and `in_use` (node ->
    GPUs its bound pods hold), both read fresher than the written status: a worker that has
    just bound holds its node, and one that has just gone frees it, before the status says
    so. At most the zone's ready nodes as the status counts them: a node that joined since
    is still among the nodes the pool may add (nodesPossible) until the status is
    rewritten, and must not count twice."""
    result = []
    for pool in pools:
        zones = []
        for zone in pool.status.zones:
            idle = sum(
                1
                for node in nodes.values()
                if (node.zone or "unknown") == zone.zone
                and node.schedulable
                and selects(pool, node)
                and node.gpus_allocatable >= zone.gpus_per_node > 0
                and in_use.get(node.name, 0) == 0
            )
            zones.append(zone.model_copy(update={"nodes_free": min(zone.nodes_ready, idle)}))
        status = pool.status.model_copy(update={"zones": tuple(zones)})
        result.append(pool.model_copy(update={"status": status}))
    return tuple(result)


def _price(pool: GPUPool, spot: bool) -> float | None:
    pricing = pool.spec.pricing
    if pricing is None:
        return None
    return pricing.spot_usd_per_gpu_hour if spot else pricing.on_demand_usd_per_gpu_hour


def usable_nodes(
    free: int, obtainable: int, reserved_gpus: int, gpus_per_node: int
) -> tuple[int, int]:
    """(free, obtainable) nodes left once `reserved_gpus` of unbound workers are placed:
    whole nodes, free ones first."""
    reserved_nodes = -(-reserved_gpus // gpus_per_node) if gpus_per_node else 0
    from_free = min(free, reserved_nodes)
    from_obtainable = min(obtainable, reserved_nodes - from_free)
    return free - from_free, obtainable - from_obtainable


def snapshot_pools(
    pools: Sequence[GPUPool],
    count: NodeCount = "free",
    *,
    reserved: Mapping[str, int] | None = None,
) -> tuple[Pool, ...]:
    """Snapshot pools with at least one free or obtainable node (or ready node, with
    count="ready": what the pools are, busy or not), for GPUPools whose GPU type resolved.

    `reserved` (pool key -> GPUs) replaces the statuses' gpusReserved where given: the
    caller's fresher count, less what the planning job itself holds.
    """
    result: list[Pool] = []
    for pool in sorted(pools, key=lambda p: p.name):
        status = pool.status
        if status.gpu_type is None:
            continue
        spot = bool(status.spot)
        for zone in status.zones:
            if zone.gpus_per_node == 0:
                continue
            key = pool_key(pool.name, zone.zone)
            if count == "free":
                held = reserved.get(key, 0) if reserved is not None else zone.gpus_reserved
                free, obtainable = usable_nodes(
                    zone.nodes_free, zone.nodes_possible, held, zone.gpus_per_node
                )
            elif count == "possible" and zone.nodes_ready == 0:
                free, obtainable = 0, min(1, zone.nodes_possible)
            else:
                free, obtainable = zone.nodes_ready, 0
            if free + obtainable == 0:
                continue
            result.append(
                Pool(
                    name=key,
                    gpu_type=status.gpu_type,
                    zone=zone.zone,
                    gpus_per_node=zone.gpus_per_node,
                    nodes=free + obtainable,
                    obtainable_nodes=obtainable,
                    provisioning_seconds=float(status.provisioning_seconds or 0)
                    if obtainable
                    else 0.0,
                    spot=spot,
                    usd_per_gpu_hour=_price(pool, spot),
                    usd_per_kwh=pool.spec.pricing.energy_usd_per_kwh
                    if pool.spec.pricing is not None
                    else None,
                )
            )
    return tuple(result)


def build_snapshot(
    pools: Sequence[GPUPool],
    count: NodeCount = "free",
    *,
    reserved: Mapping[str, int] | None = None,
) -> ClusterSnapshot:
    return ClusterSnapshot(pools=snapshot_pools(pools, count, reserved=reserved))


def with_preemptible(
    pools: Sequence[GPUPool],
    nodes: Mapping[str, NodeInfo],
    node_priority: Mapping[str, int],
    priority: int,
) -> tuple[GPUPool, ...]:
    """`pools` as a job of `priority` may plan on them: a ready node whose GPUs only pods of
    lower priority hold (`node_priority`: node -> the highest priority among its GPU pods)
    counts as free, because the scheduler preempts those pods for the job's workers
    (Kubernetes pod priority). The preempted job replans like after a spot preemption."""
    result = []
    for pool in pools:
        zones = []
        for zone in pool.status.zones:
            preemptible = sum(
                1
                for node in nodes.values()
                if node.zone == zone.zone
                and node.schedulable
                and selects(pool, node)
                and node.name in node_priority
                and node_priority[node.name] < priority
                and node.gpus_allocatable >= zone.gpus_per_node > 0
            )
            free = min(zone.nodes_ready, zone.nodes_free + preemptible)
            zones.append(zone.model_copy(update={"nodes_free": free}))
        status = pool.status.model_copy(update={"zones": tuple(zones)})
        result.append(pool.model_copy(update={"status": status}))
    return tuple(result)
