"""Which pools may serve a stage kind, whether a set of stages fits the cluster, and its price.

A stage kind is (slowest GPU type, TP degree). Its replicas may run on that type or on a
*helper* type that is at least as fast on every layer (forward+backward and update) and has
at least as much memory: mixing them leaves the stage time, memory feasibility and hence the
simulator's prediction unchanged, and lets a stage of D replicas use leftover faster GPUs
when the slow type runs out. A TP group must sit on one node, so a pool serves TP degree t
only if t divides its GPUs per node (nodes then pack without fragments).

Feasibility of a demand (GPUs per kind) is Hall's condition over the kinds' server sets,
exact for this bipartite assignment; the price lower bound assumes each kind gets its
cheapest servers. Called by engine.py (DP pruning) and placement.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from sailplan.planner.cluster import Pool


@dataclass(frozen=True)
class KindServers:
    """Pools (indices into the cluster's pool list) that may host a kind's TP groups."""

    gpu_type: str
    tensor_parallel: int
    zone: str  # "" = any zone
    pools: tuple[int, ...]
    cheapest_usd_per_gpu_hour: float


@dataclass(frozen=True)
class TypeServers:
    """Pools that may host stages whose slowest GPU type is `gpu_type` (any TP)."""

    gpu_type: str
    pools: tuple[int, ...]
    cheapest_usd_per_gpu_hour: float


class CapacityModel:
    """Hall-condition feasibility and price bounds for GPU demands per slowest GPU type.

    Demands are counted in GPUs per type, not per (type, TP): exact when a type's pools
    all have node sizes that every searched TP degree divides (the usual case: one node
    shape per type); otherwise placement.py has the last word and may reject a candidate.
    """

    def __init__(
        self, pools: Sequence[Pool], prices: Sequence[float], servers: Sequence[TypeServers]
    ) -> None:
        self.pools = tuple(pools)
        self.prices = tuple(prices)
        self.servers = tuple(servers)
        self._ok: dict[tuple[int, ...], bool] = {}

    def feasible(self, usage: tuple[int, ...]) -> bool:
        cached = self._ok.get(usage)
        if cached is None:
            cached = self._hall(usage)
            self._ok[usage] = cached
        return cached

    def _hall(self, usage: tuple[int, ...]) -> bool:
        active = [k for k, gpus in enumerate(usage) if gpus]
        for size in range(1, len(active) + 1):
            for subset in combinations(active, size):
                demand = sum(usage[k] for k in subset)
                union: set[int] = set()
                for k in subset:
                    union.update(self.servers[k].pools)
                if demand > sum(self.pools[p].gpus for p in union):
                    return False
        return True

    def usd_per_hour_lower(self, usage: tuple[int, ...]) -> float:
        return sum(
            gpus * self.servers[k].cheapest_usd_per_gpu_hour for k, gpus in enumerate(usage) if gpus
        )
