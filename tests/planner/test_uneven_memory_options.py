"""The uneven data split with memory options: a stage takes the union of its types' needs.

The scenario of test_search_uneven_split.py (2 A100 + 2 V100, one GPU per node, one-stage
pipelines, the V100 2.5x slower, where 3 + 3 + 1 + 1 micro-batches beat every even split),
with the V100's memory set (a catalog override) between what the stage needs on it without
and with optimizer offload. Without memory options the V100s cannot hold the stage, so no
plan uses them; with them the uneven plan offloads the stage's optimizer on every replica
(a stage's options are one pair of Stage fields), fits every GPU by simulate()'s own
prediction, and its reason says what the option takes.
"""

from __future__ import annotations

from planner_search_cases import (
    FAST,
    SLOW,
    cluster,
    compute_profiles,
    pool,
    profile_set,
    tiny_model,
)

from sailplan.planner.api import Planned, PlanRequest
from sailplan.planner.catalog import Catalog, default_catalog, load_catalog
from sailplan.planner.plan import Plan
from sailplan.planner.search import plan as search
from sailplan.planner.simulator import PlanningContext, simulate

BATCH = 8
MODEL = tiny_model(blocks=3)
SNAPSHOT = cluster(pool(FAST, "us-central1-a", 2), pool(SLOW, "us-central1-a", 2))
PROFILES = profile_set(MODEL, [FAST, SLOW], compute_profiles(MODEL, {FAST: 1.0, SLOW: 2.5}))


def _tight_catalog() -> Catalog:
    """The V100's memory halfway between the one-stage plan's need there without and with
    offload (simulate()'s terms, one micro-batch in flight)."""
    context = PlanningContext(
        model=MODEL, cluster=SNAPSHOT, profiles=PROFILES, catalog=default_catalog()
    )
    costs = context.costs
    table = costs.require_table(SLOW, 1, 1)
    need = [
        costs.stage_memory_bytes(
            table,
            0,
            MODEL.num_layers,
            stage=0,
            num_stages=1,
            num_micro_batches=1,
            data_parallel=4,
            offload=offload,
        )
        for offload in (False, True)
    ]
    assert need[1] < need[0]
    return load_catalog({"gpus": {SLOW: {"memory_gib": (need[0] + need[1]) / 2 / 2**30}}})


def _best(catalog: Catalog, memory_options: bool) -> Plan:
    request = PlanRequest(
        model=MODEL,
        global_batch_size=BATCH,
        cluster=SNAPSHOT,
        top_k=2,
        micro_batch_sizes=(1,),
        max_pipeline_depth=1,
        memory_options=memory_options,
    )
    result = search(request, PROFILES, catalog)
    assert isinstance(result, Planned), result
    return result.best


def test_uneven_split_plans_take_the_union_of_their_types_options() -> None:
    catalog = _tight_catalog()
    without = _best(catalog, memory_options=False)
    # the V100s cannot hold the stage: only the A100s train
    assert {r.gpu_type for r in without.stages[0].replicas} == {FAST}
    best = _best(catalog, memory_options=True)
    assert best.pipeline_micro_batches is not None, best.reason
    types = [r.gpu_type for r in best.stages[0].replicas]
    assert set(types) == {FAST, SLOW}
    # offload is what the V100 needed, and the stage takes it on every replica
    assert best.stages[0].optimizer_offload and best.stages[0].recompute == "none"
    context = PlanningContext(model=MODEL, cluster=SNAPSHOT, profiles=PROFILES, catalog=catalog)
    assert simulate(best.model_copy(update={"predictions": None}), context) == best.predictions
    assert best.predictions is not None
    peak = best.predictions.stages[0].peak_memory_bytes
    assert peak <= catalog.gpu(SLOW).memory_bytes
    assert "uneven data split" in best.reason and "offloads the optimizer" in best.reason
    assert (
        best.predictions.samples_per_second
        > (without.predictions or best.predictions).samples_per_second
    )
