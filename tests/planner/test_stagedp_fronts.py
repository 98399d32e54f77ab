"""The stage DP's canonical labels keep it exact: its best time equals a brute force.

stagedp.solve stores each partial pipeline's (closed cycle, open cycle) in a canonical
form: the closed cycle raised to what the stages still to come force anyway (the open
stage's cycle with the cheapest outgoing hop, the spread bound of the layers left), the
open cycle raised to where no outgoing hop can make it matter. Labels that only differed
there then dominate each other. That is exact only if every completion scores both forms
alike; these tests check it against an enumeration of every layer split and every kind
per stage, scored by the iteration-time formula in stagedp's docstring, on random
instances whose hops depend on the cut layer and on both kinds (so the dearest and the
cheapest hop out of a stage differ), whose memory depends on the in-flight count, with
capacity limits and with bounds that bind. Blocks of identical time (the case that made
the fronts large) and irregular ones are both drawn.
"""

from __future__ import annotations

import random
from itertools import combinations, product

import numpy as np
import pytest

from sailplan.planner.search import stagedp

Instance = dict[str, object]


def _instance(seed: int, *, identical_blocks: bool) -> Instance:
    """A random DP instance: solve()'s keyword arguments but depth and limit, and what the
    brute force needs to score a plan."""
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
    return args


def _brute_force(args: Instance, depth: int) -> dict[tuple[tuple[int, ...], int], float]:
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


@pytest.mark.parametrize("identical_blocks", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_canonical_fronts_keep_the_exact_optimum(seed: int, identical_blocks: bool) -> None:
    args = _instance(seed, identical_blocks=identical_blocks)
    layers = int(args["num_layers"])  # type: ignore[call-overload]
    for depth in range(1, layers + 1):
        expected = _brute_force(args, depth)
        unbounded = stagedp.solve(depth=depth, limit=lambda usage: float("inf"), **args)  # type: ignore[arg-type]
        got = {(r.usage, r.kinds[-1]): r.time for r in unbounded}
        assert got.keys() == expected.keys()
        for key, time in expected.items():
            assert got[key] == pytest.approx(time, rel=1e-12, abs=1e-12), (depth, key)
        if not expected:
            continue
        # with the optimum as the bar, the bounds prune hard and the optimum must survive
        optimum = min(expected.values())
        bar = optimum * (1 + 1e-12)
        barred = stagedp.solve(depth=depth, limit=lambda usage, bar=bar: bar, **args)  # type: ignore[arg-type]
        assert min(r.time for r in barred) == pytest.approx(optimum, rel=1e-12)
