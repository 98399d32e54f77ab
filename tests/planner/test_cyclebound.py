"""The stage DP's capacity-aware cycle bound (search/cyclebound.py) is exact to its
definition and never costs the DP its optimum.

- CycleRoom.need against an enumeration of every covering: r stages at the last r
  positions of a pipeline, each range fitting with its in-flight count and within the
  cycle with its hops, the least weighted GPU count per weighting.
- stagedp.solve with the bound against the brute force of stagedp_cases: with the optimum
  as the bar the optimum survives, every plan it returns scores as without the bound, and on
  some instances the bound drops whole DPs or partial plans (it is not vacuous).
- The whole search with the bound returns the same plans as without it on small mixed
  clusters (the CASES of test_search_caches.py plus a deep one).
"""

from __future__ import annotations

from itertools import combinations, product

import numpy as np
import pytest
from planner_search_cases import (
    FAST,
    SLOW,
    cluster,
    compute_profiles,
    pool,
    profile_set,
    tiny_model,
)
from stagedp_cases import Instance, brute_force, instance

from sailplan.planner.api import Objective, Planned, PlanRequest
from sailplan.planner.catalog import default_catalog
from sailplan.planner.search import engine, stagedp
from sailplan.planner.search import plan as search
from sailplan.planner.search.cyclebound import CycleInputs, CycleRoom


def _cycle_inputs(args: Instance, capacity: tuple[int, int]) -> CycleInputs:
    """The bound's inputs for a stagedp_cases instance: Hall per slot and over both, and a
    weighting that prices one slot's GPUs 2.5x the other's."""
    kinds: list[stagedp.Kind] = args["kinds"]  # type: ignore[assignment]
    boundary: list[list[list[float]]] = args["boundary"]  # type: ignore[assignment]
    layers = int(args["num_layers"])  # type: ignore[call-overload]
    n = layers + 1
    hop_in = np.full((n, len(kinds)), np.inf)
    hop_out = np.full((n, len(kinds)), np.inf)
    for b in range(1, layers):
        hops = np.asarray(boundary[b])
        hop_in[b] = hops.min(axis=0)
        hop_out[b] = hops.min(axis=1)
    gpus = np.array([k.gpus for k in kinds], dtype=float)
    slot_of = np.array([k.slot for k in kinds])
    price = np.array([1.0, 2.5])
    kind_cost = np.array(
        [
            np.where(slot_of == 0, gpus, 0.0),
            np.where(slot_of == 1, gpus, 0.0),
            gpus,
            gpus * price[slot_of],
        ]
    )
    slot_weight = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], price])
    totals = np.array(
        [capacity[0], capacity[1], sum(capacity), float(price @ np.asarray(capacity))],
        dtype=float,
    )
    return CycleInputs(
        compute_at=lambda f: [np.asarray(k.compute, dtype=float) for k in kinds],
        fits=lambda f: [np.asarray(k.fits(f), dtype=bool) for k in kinds],
        hop_in=hop_in,
        hop_out=hop_out,
        kind_cost=kind_cost,
        slot_weight=slot_weight,
        capacity=totals,
    )


def _need_by_enumeration(
    inputs: CycleInputs,
    kind_cost: np.ndarray,
    depth: int,
    micro: int,
    cycle: float,
    *,
    r: int,
    start: int,
) -> np.ndarray:
    """Least weighted GPUs (per row of kind_cost) of r stages covering [start, L) at the
    last r positions."""
    layers = inputs.num_layers
    best = np.full(kind_cost.shape[0], np.inf)
    least_out = inputs.hop_out.min(axis=0)
    for cuts in combinations(range(start + 1, layers), r - 1):
        edges = (start, *cuts, layers)
        for chosen in product(range(kind_cost.shape[1]), repeat=r):
            ok = True
            for i, k in enumerate(chosen):
                position = depth - r + i
                a, b = edges[i], edges[i + 1]
                flight = min(depth - position, micro)
                time = inputs.compute_at(flight)[k][a, b]
                time += inputs.hop_in[a, k] if position > 0 else 0.0
                time += least_out[k] if position < depth - 1 else 0.0
                if not inputs.fits(flight)[k][a, b] or time > cycle:
                    ok = False
                    break
            if ok:
                best = np.minimum(best, kind_cost[:, list(chosen)].sum(axis=1))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_need_is_the_least_weighted_covering(seed: int) -> None:
    args, capacity = instance(seed, identical_blocks=seed % 2 == 0)
    inputs = _cycle_inputs(args, capacity)
    layers, micro = inputs.num_layers, int(args["micro_batches"])  # type: ignore[call-overload]
    finite = infinite = 0
    for depth in range(1, layers + 1):
        for cycle in (1.0, 2.5, 6.0):
            room = CycleRoom(inputs, depth, micro, cycle)
            for r in range(1, depth + 1):
                for start in range(layers + 1):
                    expected = _need_by_enumeration(
                        inputs, room.kind_cost, depth, micro, room.cycle, r=r, start=start
                    )
                    got = room.need[r][:, start]
                    assert np.allclose(got, expected, rtol=1e-12), (depth, cycle, r, start)
                    finite += int(np.isfinite(expected[0]))
                    infinite += int(not np.isfinite(expected[0]))
    # both answers occur: the instances are neither trivially feasible nor impossible
    assert finite and infinite


@pytest.mark.parametrize("identical_blocks", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_the_dp_keeps_its_optimum_with_the_bound(seed: int, identical_blocks: bool) -> None:
    args, capacity = instance(seed, identical_blocks=identical_blocks)
    inputs = _cycle_inputs(args, capacity)
    layers = int(args["num_layers"])  # type: ignore[call-overload]
    for depth in range(1, layers + 1):
        expected = brute_force(args, depth)
        if not expected:
            continue
        optimum = min(expected.values())
        for bar in (optimum * (1 + 1e-12), optimum * 1.2):
            with_bound = stagedp.solve(
                depth=depth, limit=lambda usage, bar=bar: bar, cycle_inputs=inputs, **args
            )  # type: ignore[arg-type]
            assert min(r.time for r in with_bound) == pytest.approx(optimum, rel=1e-12)
            # what it returns is scored exactly (the same (usage, kind) optimum)
            for result in with_bound:
                if result.time <= bar:
                    key = (result.usage, result.kinds[-1])
                    assert result.time == pytest.approx(expected[key], rel=1e-12)


def test_pairs_of_constraints_see_what_each_alone_misses() -> None:
    """Four one-layer stages, each either a fast kind (1 GPU of the scarce fast type, 2 in
    the cluster) or a slow kind (4 GPUs, of either type), 6 GPUs in all. The least GPU
    total (4 fast stages) breaks the fast type's capacity and the least fast-type use (4
    slow stages) the total: each row alone is met by its own covering, no covering meets
    both (enumerated below), and the paired rows say so."""
    layers = depth = 4
    n = layers + 1
    later = np.triu(np.ones((n, n), dtype=bool), k=1)
    one_layer = later & ~np.triu(np.ones((n, n), dtype=bool), k=2)
    # a stage of layers [a, b) takes b - a seconds on either kind
    times = np.where(later, np.arange(n)[None, :] - np.arange(n)[:, None], 0).astype(float)
    gpus = np.array([1.0, 4.0])  # kind 0 fast, kind 1 slow

    def inputs_with(fast_gpus: float) -> CycleInputs:
        return CycleInputs(
            compute_at=lambda f: [times, times],
            fits=lambda f: [later, later],
            hop_in=np.zeros((n, 2)),
            hop_out=np.zeros((n, 2)),
            # GPU total; fast-type GPUs (Hall, fast slot); GPUs of slow kinds (Hall, slow
            # slot, which the fast pools may serve too)
            kind_cost=np.array([gpus, [1.0, 0.0], [0.0, 4.0]]),
            slot_weight=np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]),
            capacity=np.array([6.0, fast_gpus, 6.0]),
        )

    inputs = inputs_with(2.0)
    cycle = 1.5  # one layer per stage
    assert np.array_equal(later & (times <= cycle), one_layer)
    jointly = [
        chosen
        for chosen in product(range(2), repeat=depth)
        if gpus[list(chosen)].sum() <= 6 and chosen.count(0) <= 2 and 4 * chosen.count(1) <= 6
    ]
    assert not jointly
    room = CycleRoom(inputs, depth, 8, cycle)
    own_rows = inputs.capacity.shape[0]
    whole = room.need[depth][:, 0]
    assert np.all(whole[:own_rows] <= inputs.capacity)  # each row alone: room enough
    assert not room.feasible
    # with two fast GPUs more, four fast stages fit everything: the pairs must not refuse it
    assert CycleRoom(inputs_with(4.0), depth, 8, cycle).feasible


def test_the_bound_drops_work_on_some_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: with a bar a little above the optimum, some DPs keep fewer partial
    plans (Pareto inserts) with the bound than without, and none keeps more."""
    inserts = [0]
    insert = stagedp._insert

    def counted(front: list[stagedp._Label], label: stagedp._Label) -> None:
        inserts[0] += 1
        insert(front, label)

    monkeypatch.setattr(stagedp, "_insert", counted)
    fewer = 0
    for seed in range(12):
        args, capacity = instance(seed, identical_blocks=False)
        inputs = _cycle_inputs(args, capacity)
        for depth in range(2, int(args["num_layers"]) + 1):  # type: ignore[call-overload]
            expected = brute_force(args, depth)
            if not expected:
                continue
            bar = min(expected.values()) * 1.05
            inserts[0] = 0
            stagedp.solve(depth=depth, limit=lambda usage, bar=bar: bar, **args)  # type: ignore[arg-type]
            plain = inserts[0]
            inserts[0] = 0
            stagedp.solve(
                depth=depth, limit=lambda usage, bar=bar: bar, cycle_inputs=inputs, **args
            )  # type: ignore[arg-type]
            assert inserts[0] <= plain
            fewer += inserts[0] < plain
    assert fewer > 0


def _plans(request: PlanRequest, profiles: object) -> tuple[object, ...]:
    result = search(request, profiles, default_catalog())  # type: ignore[arg-type]
    assert isinstance(result, Planned)
    return tuple(
        (
            p.micro_batch_size,
            tuple((s.layer_start, s.layer_end, s.tensor_parallel) for s in p.stages),
            tuple(tuple(r.pool for r in s.replicas) for s in p.stages),
            p.predictions,
        )
        for p in (result.best, *result.alternatives)
    )


# (objective, transformer blocks, (fast GPUs, slow GPUs), max depth, samples/s floor)
CASES: list[tuple[str, int, tuple[int, int], int | None, float | None]] = [
    ("throughput", 6, (4, 8), None, None),
    ("throughput", 10, (2, 6), None, None),
    ("throughput", 14, (2, 12), None, None),
    ("cost", 8, (6, 4), 3, None),
    ("cost", 6, (4, 8), None, 60.0),
]


@pytest.mark.parametrize("case", CASES)
def test_the_search_returns_the_same_plans_without_the_bound(
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[str, int, tuple[int, int], int | None, float | None],
) -> None:
    kind, blocks, gpus, max_depth, floor = case
    model = tiny_model(blocks)
    profiles = profile_set(
        model, [FAST, SLOW], compute_profiles(model, {FAST: 1.0, SLOW: 2.5}, head_s=0.03)
    )
    request = PlanRequest(
        model=model,
        global_batch_size=16,
        cluster=cluster(
            pool(FAST, "us-central1-a", gpus[0], per_node=2),
            pool(SLOW, "us-central1-a", gpus[1], per_node=2),
        ),
        objective=Objective(kind=kind, min_samples_per_second=floor),  # type: ignore[arg-type]
        max_pipeline_depth=max_depth,
        top_k=3,
    )
    bounded = _plans(request, profiles)
    monkeypatch.setattr(engine.Search, "_cycle_inputs", lambda self, *args: None)
    assert _plans(request, profiles) == bounded
