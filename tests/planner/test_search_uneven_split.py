"""The search splits the batch unevenly across mixed replicas when that is faster.

First principles: replicas of a data-parallel stage meet only at the gradient all-reduce,
so with an even split every pipeline waits for the slowest. On 2 A100 + 2 V100 (one GPU
per node, so TP 1) and a model whose pipelines are single stages (max depth 1), the V100 is
2.5x slower: the even split either leaves the V100s idle (DP 2 on the A100s, 4 micro-batches
each) or runs four pipelines at the V100's pace (2 micro-batches each at 2.5x), while 3 + 3 +
1 + 1 finishes in about 3 A100 micro-batches. The best even-split plan comes from the
independent brute force of test_optimality.py (every plan of the contract, scored with
simulate()), so the comparison does not rest on the search.
"""

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
from test_optimality import scored_plans

from sailplan.planner.api import Objective, Planned, PlanRequest
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.search import plan as search
from sailplan.planner.search.objective import TopK
from sailplan.planner.simulator import PlanningContext, simulate

BATCH = 8


def _best(
    snapshot: ClusterSnapshot,
    profiles: ProfileSet,
    model: ModelSpec,
    objective: Objective | None = None,
) -> Plan:
    request = PlanRequest(
        model=model,
        global_batch_size=BATCH,
        cluster=snapshot,
        objective=objective or Objective(),
        top_k=2,
        micro_batch_sizes=(1,),
        max_pipeline_depth=1,
    )
    result = search(request, profiles, default_catalog())
    assert isinstance(result, Planned), result
    return result.best


def test_mixed_replicas_take_shares_by_speed() -> None:
    model = tiny_model(blocks=3)
    snapshot = cluster(pool(FAST, "us-central1-a", 2), pool(SLOW, "us-central1-a", 2))
    profiles = profile_set(model, [FAST, SLOW], compute_profiles(model, {FAST: 1.0, SLOW: 2.5}))
    best = _best(snapshot, profiles, model)
    assert best.predictions is not None
    counts = best.pipeline_micro_batches
    assert counts is not None, best.reason
    # both types are used, and every A100 pipeline takes more than every V100 one
    types = [best.stages[0].replicas[r].gpu_type for r in range(best.data_parallel)]
    assert set(types) == {FAST, SLOW}
    fast = [c for c, t in zip(counts, types, strict=True) if t == FAST]
    slow = [c for c, t in zip(counts, types, strict=True) if t == SLOW]
    assert min(fast) > max(slow)
    assert best.micro_batch_size * sum(counts) == BATCH
    # its predictions are simulate()'s
    context = PlanningContext(model=model, cluster=snapshot, profiles=profiles)
    assert simulate(best.model_copy(update={"predictions": None}), context) == best.predictions
    # faster than every even-split plan of the contract (the brute force enumerates only
    # even splits: pipeline_micro_batches None)
    even = scored_plans(
        model, snapshot=snapshot, profiles=profiles, batch=BATCH, tps=(1,), sizes=(1,), max_depth=1
    )
    assert all(s.plan.pipeline_micro_batches is None for s in even)
    best_even = min(s.predictions.iteration_seconds for s in even)
    assert best.predictions.iteration_seconds < best_even * 0.99
    # the plan says why: the counts per GPU type and the gain over an even split
    assert "uneven data split" in best.reason
    assert f"{FAST} pipelines take {max(fast)}" in best.reason
    assert "faster than an even split" in best.reason


def test_homogeneous_cluster_keeps_the_even_split() -> None:
    """Replicas of one type run at one speed: an uneven split could only add a straggler."""
    model = tiny_model(blocks=3)
    snapshot = cluster(pool(FAST, "us-central1-a", 2), pool(FAST, "us-central1-b", 2))
    profiles = profile_set(model, [FAST], compute_profiles(model, {FAST: 1.0}))
    for objective in (Objective(), Objective(kind="cost")):
        best = _best(snapshot, profiles, model, objective)
        assert best.pipeline_micro_batches is None
        assert "uneven" not in best.reason


def test_zero_stage_2_keeps_the_even_split() -> None:
    """The trainer's ZeRO-2 reduces after every micro-batch, so its pipelines must run the
    same count: the search then offers no uneven split, on the cluster where it would."""
    model = tiny_model(blocks=3)
    snapshot = cluster(pool(FAST, "us-central1-a", 2), pool(SLOW, "us-central1-a", 2))
    profiles = profile_set(model, [FAST, SLOW], compute_profiles(model, {FAST: 1.0, SLOW: 2.5}))
    request = PlanRequest(
        model=model,
        global_batch_size=BATCH,
        cluster=snapshot,
        top_k=3,
        micro_batch_sizes=(1,),
        max_pipeline_depth=1,
        zero_stage=2,
    )
    result = search(request, profiles, default_catalog())
    assert isinstance(result, Planned), result
    assert all(p.pipeline_micro_batches is None for p in [result.best, *result.alternatives])


@pytest.mark.parametrize("objective", [Objective(kind="cost")])
def test_cost_objective_prices_the_split(objective: Objective) -> None:
    """Under the cost objective the split plan competes on USD per iteration: whatever
    wins, its prediction is simulate()'s and an uneven plan's counts favour the A100s."""
    model = tiny_model(blocks=3)
    snapshot = cluster(pool(FAST, "us-central1-a", 2), pool(SLOW, "us-central1-a", 2))
    profiles = profile_set(model, [FAST, SLOW], compute_profiles(model, {FAST: 1.0, SLOW: 2.5}))
    best = _best(snapshot, profiles, model, objective)
    context = PlanningContext(model=model, cluster=snapshot, profiles=profiles)
    assert simulate(best.model_copy(update={"predictions": None}), context) == best.predictions
    if best.pipeline_micro_batches is not None:
        types = [best.stages[0].replicas[r].gpu_type for r in range(best.data_parallel)]
        by_type = dict(zip(types, best.pipeline_micro_batches, strict=True))
        assert by_type[FAST] > by_type[SLOW]


def test_top_k_keeps_the_better_split_of_one_layout() -> None:
    """The same placement may reach the top k twice: from the even-split DP and from the
    uneven pass. One entry per layout, the better of the two."""
    model = tiny_model(blocks=3)
    snapshot = cluster(pool(FAST, "us-central1-a", 2), pool(SLOW, "us-central1-a", 2))
    profiles = profile_set(model, [FAST, SLOW], compute_profiles(model, {FAST: 1.0, SLOW: 2.5}))
    uneven = _best(snapshot, profiles, model)
    even = Plan.model_validate(
        uneven.model_dump()
        | {
            "pipeline_micro_batches": None,
            "num_micro_batches": BATCH // (uneven.micro_batch_size * uneven.data_parallel),
            "predictions": None,
        }
    )
    top = TopK(2)
    top.offer(2.0, even)
    top.offer(1.0, uneven)
    assert top.plans() == [uneven]
    top = TopK(2)
    top.offer(1.0, even)
    top.offer(2.0, uneven)
    assert top.plans() == [even]
