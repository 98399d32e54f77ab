"""The planner's ClusterSnapshot, built from GPUPool statuses.

One snapshot Pool per (GPUPool, zone): the planner's pools are homogeneous and in one zone,
a GPUPool may span zones. Only nodes with all their GPUs free count, because a plan puts
whole tensor-parallel groups on nodes and a half-used node cannot promise that. Prices are
the GPUPool's overrides where given, else left to the catalog (None).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import PoolSelection
from sailplan.operator.reconcile.naming import pool_key
from sailplan.planner.cluster import ClusterSnapshot, Pool

# "free": nodes a new worker can take now (planning); "ready": every healthy node, busy or
# not (what profiles a job may need, since it may use any of them later).
NodeCount = Literal["free", "ready"]


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


def _price(pool: GPUPool, spot: bool) -> float | None:
    pricing = pool.spec.pricing
    if pricing is None:
        return None
    return pricing.spot_usd_per_gpu_hour if spot else pricing.on_demand_usd_per_gpu_hour


def snapshot_pools(pools: Sequence[GPUPool], count: NodeCount = "free") -> tuple[Pool, ...]:
    """Snapshot pools with at least one free node (or ready node, with count="ready": what
    the pools are, busy or not), for GPUPools whose GPU type resolved."""
    result: list[Pool] = []
    for pool in sorted(pools, key=lambda p: p.name):
        status = pool.status
        if status.gpu_type is None:
            continue
        spot = bool(status.spot)
        for zone in status.zones:
            nodes = zone.nodes_free if count == "free" else zone.nodes_ready
            if nodes == 0 or zone.gpus_per_node == 0:
                continue
            result.append(
                Pool(
                    name=pool_key(pool.name, zone.zone),
                    gpu_type=status.gpu_type,
                    zone=zone.zone,
                    gpus_per_node=zone.gpus_per_node,
                    nodes=nodes,
                    spot=spot,
                    usd_per_gpu_hour=_price(pool, spot),
                )
            )
    return tuple(result)


def build_snapshot(pools: Sequence[GPUPool], count: NodeCount = "free") -> ClusterSnapshot:
    return ClusterSnapshot(pools=snapshot_pools(pools, count))
