"""Random stage-DP instances and their brute-force optimum, shared by the DP's tests.

An instance is stagedp.solve's keyword arguments but depth and limit: a few layers whose
hops depend on the cut layer and on both kinds, memory that depends on the in-flight
count, capacity per usage slot; brute_force enumerates every layer split and every kind
per stage and scores each plan by the iteration-time formula of stagedp's docstring.
Used by test_stagedp_fronts.py and test_cyclebound.py.
"""

from __future__ import annotations

import random
from itertools import combinations, product

import numpy as np

from sailplan.planner.search import stagedp

Instance = dict[str, object]


def instance(seed: int, *, identical_blocks: bool) -> tuple[Instance, tuple[int, int]]:
    """A random DP instance: solve()'s keyword arguments but depth and limit (all the brute
    force needs to score a plan), and the GPUs per usage slot its usage_ok allows."""
    rng = random.Random(seed)
    layers = rng.randint(4, 7)
    micro = rng.choice([1, 2, 3, 8])
    num_kinds = rng.randint(2, 3)
    slots = [rng.randrange(2) for _ in range(num_kinds)]
    gpus = [rng.choice([1, 2, 4]) for _ in range(num_kinds)]
    capacity = (rng.randint(4, 10), rng.randint(4, 10))
    per_layer: list[list[float]] = []
    for _ in range(num_kinds):
        block = rng.uniform(0.5, 2.0)
        per_layer.append(
            [block if identical_blocks else rng.uniform(0.5, 2.0) for _ in range(layers)]
        )
    overhead = [rng.uniform(0.0, 0.3) for _ in range(num_kinds)]
    tail_rate = [rng.uniform(0.0, 0.5) for _ in range(num_kinds)]
    memory = [rng.uniform(0.5, 1.5) for _ in range(num_kinds)]
    room = rng.uniform(3.0, 8.0)
    n = layers + 1

    def matrix(k: int, value: object) -> list[list[float]]:
        out = [[float("inf")] * n for _ in range(n)]
        for a, b in combinations(range(n), 2):
            out[a][b] = value(k, a, b)  # type: ignore[operator]
        return out

    compute = [
        matrix(k, lambda k, a, b: overhead[k] + sum(per_layer[k][a:b])) for k in range(num_kinds)
    ]
    tail = [matrix(k, lambda k, a, b: tail_rate[k] * (b - a)) for k in range(num_kinds)]

    def fits_of(k: int):  # type: ignore[no-untyped-def]
        def fits(in_flight: int) -> list[list[bool]]:
            return [
                [b > a and (b - a) * memory[k] * (1 + 0.3 * in_flight) <= room for b in range(n)]
                for a in range(n)
            ]

        return fits

    kinds = [
        stagedp.Kind(
            slot=slots[k],
            gpus=gpus[k],
            compute=compute[k],
            tail=tail[k],
            fits=fits_of(k),
        )
        for k in range(num_kinds)
    ]
    # hops: per cut layer and both kinds, some zero, some large against the stage times
    boundary = [
        [
            [rng.choice([0.0, rng.uniform(0.0, 0.4), rng.uniform(0.5, 2.0)]) for _ in kinds]
            for _ in kinds
        ]
        for _ in range(n)
    ]
    fastest = np.array([min(per_layer[k][i] for k in range(num_kinds)) for i in range(layers)])
    rest = np.concatenate([np.cumsum(fastest[::-1])[::-1], [0.0]])
    # split_lower[r][b]: the slowest of r stages covering [b, L) on per-layer minimums
    split = [np.full(n, np.inf) for _ in range(layers + 1)]
    split[0][layers] = 0.0
    for r in range(1, layers + 1):
        for b in range(layers):
            split[r][b] = min(
                max(float(fastest[b:e].sum()), split[r - 1][e]) for e in range(b + 1, n)
            )

    def usage_ok(usage: tuple[int, ...]) -> bool:
        return all(u <= c for u, c in zip(usage, capacity, strict=True))

    args: Instance = {
        "num_layers": layers,
        "micro_batches": micro,
        "constant": 0.25,
        "kinds": kinds,
        "num_slots": 2,
        "boundary": boundary,
        "usage_ok": usage_ok,
        "final_ok": usage_ok,
        "rest_lower": rest,
        "rest_heavy": rest,
        "tail_lower": np.zeros(layers + 2),
        "split_lower": split,
        # r stages are worth at most r stages of per-layer minimums
        "stage_speed": lambda usage, r: float(r),
    }
    return args, capacity


def brute_force(args: Instance, depth: int) -> dict[tuple[tuple[int, ...], int], float]:
    """Least iteration time per (usage, last kind) over every split and kind sequence."""
    layers = int(args["num_layers"])  # type: ignore[call-overload]
    micro = int(args["micro_batches"])  # type: ignore[call-overload]
    kinds: list[stagedp.Kind] = args["kinds"]  # type: ignore[assignment]
    boundary: list[list[list[float]]] = args["boundary"]  # type: ignore[assignment]
    usage_ok = args["usage_ok"]
    best: dict[tuple[tuple[int, ...], int], float] = {}
    for cuts in combinations(range(1, layers), depth - 1):
        edges = (0, *cuts, layers)
        for chosen in product(range(len(kinds)), repeat=depth):
            usage = [0, 0]
            for k in chosen:
                usage[kinds[k].slot] += kinds[k].gpus
            if not usage_ok(tuple(usage)):  # type: ignore[operator]
                continue
            times, tails = [], []
            feasible = True
            for i, k in enumerate(chosen):
                a, b = edges[i], edges[i + 1]
                if not kinds[k].fits(min(depth - i, micro))[a][b]:
                    feasible = False
                    break
                times.append(kinds[k].compute[a][b])
                tails.append(kinds[k].tail[a][b])
            if not feasible:
                continue
            hops = [boundary[edges[i]][chosen[i - 1]][chosen[i]] for i in range(1, depth)]
            cycles = [
                times[i] + (hops[i - 1] if i > 0 else 0.0) + (hops[i] if i < depth - 1 else 0.0)
                for i in range(depth)
            ]
            total = (
                sum(times)
                + 2 * sum(hops)
                + (micro - 1) * max(cycles)
                + max(tails)
                + float(args["constant"])  # type: ignore[arg-type]
            )
            key = (tuple(usage), chosen[-1])
            if total < best.get(key, float("inf")):
                best[key] = total
    return best
