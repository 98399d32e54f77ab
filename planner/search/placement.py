"""Put a chosen pipeline shape onto pools: which pool every replica of every stage uses.

Input: D (pipelines) and each stage's kind (slowest GPU type, TP, zone or "spans zones")
with the pools that may serve it. Output: per stage, D replicas in pipeline order (replica r
of every stage is pipeline r).

Rules, and why:
1. Zone-pure stages first, most constrained first (fewest eligible GPUs, then larger TP,
   so nodes pack without fragments): for nested server sets this never starves a stage a
   feasible demand could serve.
2. Each stage takes the cheapest eligible pools first (then its own GPU type before a
   faster helper, then by name): the DP already fixed every quantity that sets the time,
   so the remaining freedom is price.
3. Zone-spanning stages are filled zone by zone with whole pipeline segments (each takes
   the same number of replicas in a zone, the zone that can host the most first), so
   adjacent spanning stages line up and their activations stay inside zones.
4. Pipelines are then aligned: replica r of stage s+1 is chosen in the zone of replica r
   of stage s whenever one is left, so activations cross zones only where the stages'
   zone counts differ.

Called by engine.py after the stage DP; pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sailplan.planner.cluster import Pool, region_of
from sailplan.planner.plan import Replica
from sailplan.planner.search.capacity import KindServers


@dataclass(frozen=True)
class StageShape:
    kind: int
    gpu_type: str
    tensor_parallel: int
    zone: str = ""


def _stage_order(
    shapes: Sequence[StageShape], servers: Sequence[KindServers], pools: Sequence[Pool]
) -> list[int]:
    def key(s: int) -> tuple[int, int, int]:
        shape = shapes[s]
        eligible = sum(pools[p].gpus for p in servers[shape.kind].pools)
        return (eligible, -shape.tensor_parallel, s)

    return sorted(range(len(shapes)), key=key)


def _take(free: list[int], candidates: Sequence[int], tp: int, count: int) -> list[int] | None:
    """Allocate `count` TP groups from candidate pools in order; None if they do not fit."""
    if count == 0:
        return []
    taken: list[int] = []
    for pool in candidates:
        while len(taken) < count and free[pool] >= tp:
            free[pool] -= tp
            taken.append(pool)
        if len(taken) == count:
            return taken
    return None


def _align(previous: Sequence[int], current: list[int], pools: Sequence[Pool]) -> list[int]:
    """Order `current` so that position r shares a zone (else a region) with previous[r]."""
    remaining = list(current)
    row: list[int] = [-1] * len(previous)

    def same_zone(a: int, b: int) -> bool:
        return pools[a].zone == pools[b].zone

    def same_region(a: int, b: int) -> bool:
        return pools[a].region == pools[b].region

    matches: tuple[Callable[[int, int], bool], ...] = (same_zone, same_region)
    for match in matches:
        for r, before in enumerate(previous):
            if row[r] >= 0:
                continue
            for i, candidate in enumerate(remaining):
                if match(before, candidate):
                    row[r] = remaining.pop(i)
                    break
    for r in range(len(row)):
        if row[r] < 0:
            row[r] = remaining.pop(0)
    return row


def _hostable(
    free: list[int],
    *,
    stages: Sequence[int],
    shapes: Sequence[StageShape],
    candidates: Callable[[int, str | None], list[int]],
    zone: str,
    most: int,
) -> int:
    """How many replicas of every one of `stages` the zone can still host (at most `most`)."""
    low, high = 0, most
    while low < high:
        mid = (low + high + 1) // 2
        trial = list(free)
        if all(_take(trial, candidates(s, zone), shapes[s].tensor_parallel, mid) for s in stages):
            low = mid
        else:
            high = mid - 1
    return low


def place(
    dp: int,
    shapes: Sequence[StageShape],
    servers: Sequence[KindServers],
    pools: Sequence[Pool],
    prices: Sequence[float],
) -> list[list[Replica]] | None:
    """Replicas per stage in pipeline order, or None when the pools cannot host the shape."""
    free = [p.gpus for p in pools]
    allocated: dict[int, list[int]] = {s: [] for s in range(len(shapes))}

    def candidates(s: int, zone: str | None) -> list[int]:
        shape = shapes[s]
        return sorted(
            (p for p in servers[shape.kind].pools if zone is None or pools[p].zone == zone),
            key=lambda p: (prices[p], pools[p].gpu_type != shape.gpu_type, pools[p].name),
        )

    pure = [s for s in _stage_order(shapes, servers, pools) if shapes[s].zone]
    spanning = [s for s in _stage_order(shapes, servers, pools) if not shapes[s].zone]
    for s in pure:
        got = _take(free, candidates(s, None), shapes[s].tensor_parallel, dp)
        if got is None:
            return None
        allocated[s] = got
    # Zone-spanning stages: whole pipeline segments zone by zone (every spanning stage
    # takes the same number of replicas in a zone), so adjacent spanning stages line up
    # and their activations stay inside zones; the zone that hosts the most goes first.
    remaining = dp
    zones = sorted({p.zone for p in pools})
    while remaining and spanning:
        best_zone, best_count = "", 0
        for zone in zones:
            count = _hostable(
                free,
                stages=spanning,
                shapes=shapes,
                candidates=candidates,
                zone=zone,
                most=remaining,
            )
            if count > best_count:
                best_zone, best_count = zone, count
        if best_count == 0:
            break
        for s in spanning:
            got = _take(free, candidates(s, best_zone), shapes[s].tensor_parallel, best_count)
            assert got is not None  # _hostable checked the same free state
            allocated[s].extend(got)
        remaining -= best_count
    for s in spanning:  # what no single zone can host: any pools, cheapest first
        got = _take(free, candidates(s, None), shapes[s].tensor_parallel, dp - len(allocated[s]))
        if got is None:
            return None
        allocated[s].extend(got)

    def by_zone(pool: int) -> tuple[str, str, str]:
        return (region_of(pools[pool].zone), pools[pool].zone, pools[pool].name)

    rows = [sorted(allocated[0], key=by_zone)]
    for s in range(1, len(shapes)):
        rows.append(_align(rows[-1], sorted(allocated[s], key=by_zone), pools))
    return [
        [Replica(pool=pools[p].name, gpu_type=pools[p].gpu_type, zone=pools[p].zone) for p in row]
        for row in rows
    ]
