"""What the search shares across the depths of one (micro-batch, DP, kinds) changes nothing.

The outer loop solves one stage DP per pipeline depth; the work bound's rows
(stagedp.WorkRows), the per-usage spread bounds and the rest of Search._group are built
once and reused by every depth. These tests check that reuse against building everything
afresh: the rows equal a per-depth backward min-sum computed from scratch, and searches
with the shared state, with its spread caches dropped every few entries and without it
return the same plans and score the same number of candidates, on small mixed clusters
with deep pipelines, tight memory and constraints.
"""

from __future__ import annotations

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

from sailplan.planner.api import Objective, Planned, PlanRequest
from sailplan.planner.catalog import default_catalog
from sailplan.planner.search import engine, stagedp
from sailplan.planner.search import plan as search


def _per_depth_rows(
    costs: list[np.ndarray], masks: dict[int, list[np.ndarray]], micro: int, depth: int
) -> list[np.ndarray]:
    """[s] = least cost of stages s..depth-1 covering [b, L), stage s holding
    min(depth - s, micro) micro-batches: built for this depth alone."""
    n = costs[0].shape[0]
    after = np.full(n, np.inf)
    after[n - 1] = 0.0
    out = [after]
    for s in range(depth - 1, -1, -1):
        stage = np.full((n, n), np.inf)
        for fits, cost in zip(masks[min(depth - s, micro)], costs, strict=True):
            stage = np.where(fits, np.minimum(stage, cost), stage)
        after = (stage + after[None, :]).min(axis=1)
        out.append(after)
    out.reverse()
    return out


def test_work_rows_equal_a_fresh_min_sum_at_every_depth() -> None:
    rng = np.random.default_rng(7)
    layers, micro = 9, 3
    n = layers + 1
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    costs = [np.where(upper, rng.uniform(0.5, 3.0, (n, n)), np.inf) for _ in range(3)]
    # fewer ranges fit as more micro-batches are in flight, as with real memory
    limits = [rng.uniform(2.0, 6.0, (n, n)) for _ in range(3)]
    masks = {
        f: [
            upper & (limit - f >= np.subtract.outer(np.arange(n), np.arange(n)) * -0.5)
            for limit in limits
        ]
        for f in range(1, micro + 1)
    }
    scales = [2.0, 0.5, 3.0]  # GPUs x weight per kind
    rows = stagedp.WorkRows(costs, scales, lambda f: masks[f], micro)
    costs = [c * w for c, w in zip(costs, scales, strict=True)]
    # ask for the rows out of order: they are built on demand and must not depend on it
    assert np.array_equal(rows.row(4), _per_depth_rows(costs, masks, micro, 4)[0])
    for depth in range(1, layers + 1):
        fresh = _per_depth_rows(costs, masks, micro, depth)
        for s in range(depth + 1):
            assert np.array_equal(rows.row(depth - s), fresh[s])
    # the fixture is not trivial: some rows are finite, some splits do not fit
    assert np.isfinite(rows.row(3)[0])
    assert not np.isfinite(rows.row(1)[0])


# (objective, transformer blocks, (fast GPUs, slow GPUs), max depth, samples/s floor)
CASES: list[tuple[str, int, tuple[int, int], int | None, float | None]] = [
    ("throughput", 6, (4, 8), None, None),
    ("throughput", 10, (2, 6), None, None),
    ("cost", 8, (6, 4), 3, None),
    ("cost", 6, (4, 8), None, 60.0),
    ("throughput", 8, (3, 9), None, None),
]


def _answer(request: PlanRequest, profiles: object) -> tuple[object, ...]:
    result = search(request, profiles, default_catalog())  # type: ignore[arg-type]
    assert isinstance(result, Planned)
    return (
        result.plans_evaluated,
        *(
            (
                p.micro_batch_size,
                tuple((s.layer_start, s.layer_end, s.tensor_parallel) for s in p.stages),
                tuple(tuple(r.pool for r in s.replicas) for s in p.stages),
                p.predictions,
            )
            for p in (result.best, *result.alternatives)
        ),
    )


@pytest.mark.parametrize("case", CASES)
def test_shared_state_keeps_every_plan(
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
    shared = _answer(request, profiles)
    fresh_group = engine.Search._group

    def unshared(self: engine.Search, *args: object) -> object:
        self._groups.clear()  # every DP builds its own rows, bounds and caches
        return fresh_group(self, *args)  # type: ignore[arg-type]

    # the spread caches dropped whenever they hold more than 3 entries
    monkeypatch.setattr(engine, "_SPREAD_CACHE_ENTRIES", 3)
    assert _answer(request, profiles) == shared
    monkeypatch.setattr(engine.Search, "_group", unshared)
    assert _answer(request, profiles) == shared
