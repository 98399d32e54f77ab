"""The DP's capacity-aware work bound (stagedp.WorkRows) only prunes, never changes the
optimum: the search with it returns the same best plan as the search without it, on
small mixed clusters where both run quickly (deep pipelines, tight memory, scarce fast
GPUs, cost objective and constraints included)."""

from __future__ import annotations

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
from sailplan.planner.search import engine
from sailplan.planner.search import plan as search

CASES = [
    ("throughput", 6, (4, 8), None),
    ("throughput", 10, (2, 6), None),
    ("cost", 6, (4, 8), None),
    ("throughput", 8, (3, 9), 2),
    ("cost", 8, (6, 4), 3),
]


def _best(request: PlanRequest, profiles: object) -> tuple[object, float]:
    result = search(request, profiles, default_catalog())  # type: ignore[arg-type]
    assert isinstance(result, Planned)
    assert result.best.predictions is not None
    layout = (
        result.best.micro_batch_size,
        result.best.data_parallel,
        tuple((s.layer_start, s.layer_end, s.tensor_parallel) for s in result.best.stages),
        tuple(tuple(r.pool for r in s.replicas) for s in result.best.stages),
    )
    return layout, result.best.predictions.iteration_seconds


@pytest.mark.parametrize(("kind", "blocks", "gpus", "max_depth"), CASES)
def test_work_bound_keeps_the_optimum(
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    blocks: int,
    gpus: tuple[int, int],
    max_depth: int | None,
) -> None:
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
        objective=Objective(kind=kind),  # type: ignore[arg-type]
        max_pipeline_depth=max_depth,
    )
    with_bound = _best(request, profiles)
    monkeypatch.setattr(engine, "_WEIGHT_POWERS", ())
    without_bound = _best(request, profiles)
    assert with_bound == without_bound
