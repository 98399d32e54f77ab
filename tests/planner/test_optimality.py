"""The search finds the true optimum: compared with an independent brute force.

The brute force below enumerates EVERY plan of the contract on small clusters (each
micro-batch size, data-parallel degree, pipeline depth, every contiguous layer split, every
per-stage TP degree, and every multiset of pipelines, a pipeline being one pool per stage,
so replicas of a stage may sit on different GPU types and zones), keeps those that fit in
memory and capacity, scores each with simulate(), and takes the optimum per objective. It
shares nothing with the search but the simulator and the plan types. The search must
return a plan whose simulate() value equals that optimum (ties may pick another plan of
the same value), and its reported predictions must be simulate()'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations, combinations_with_replacement, product

import planner_search_cases as cases
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
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Predictions, Replica, Stage
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.search import plan as search
from sailplan.planner.simulator import PlanningContext, simulate


@dataclass(frozen=True)
class Scored:
    plan: Plan
    predictions: Predictions


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def every_plan(
    model: ModelSpec,
    *,
    snapshot: ClusterSnapshot,
    batch: int,
    tps: tuple[int, ...],
    sizes: tuple[int, ...],
    max_depth: int,
) -> Iterator[Plan]:
    pools = snapshot.pools
    layers = model.num_layers
    for mbs in sizes:
        for dp in _divisors(batch // mbs):
            for depth in range(1, min(layers, max_depth) + 1):
                for cuts in combinations(range(1, layers), depth - 1):
                    edges = (0, *cuts, layers)
                    for stage_tps in product(tps, repeat=depth):
                        if dp * sum(stage_tps) > sum(p.gpus for p in pools):
                            continue
                        options = [
                            [i for i, p in enumerate(pools) if p.gpus_per_node % t == 0]
                            for t in stage_tps
                        ]
                        pipelines = list(product(*options))
                        for chosen in combinations_with_replacement(pipelines, dp):
                            used = [0] * len(pools)
                            for pipeline in chosen:
                                for s, p in enumerate(pipeline):
                                    used[p] += stage_tps[s]
                            if any(u > p.gpus for u, p in zip(used, pools, strict=True)):
                                continue
                            yield Plan(
                                model=model,
                                global_batch_size=batch,
                                micro_batch_size=mbs,
                                num_micro_batches=batch // (mbs * dp),
                                stages=tuple(
                                    Stage(
                                        layer_start=edges[s],
                                        layer_end=edges[s + 1],
                                        tensor_parallel=stage_tps[s],
                                        replicas=tuple(
                                            Replica(
                                                pool=pools[pipe[s]].name,
                                                gpu_type=pools[pipe[s]].gpu_type,
                                                zone=pools[pipe[s]].zone,
                                            )
                                            for pipe in chosen
                                        ),
                                    )
                                    for s in range(depth)
                                ),
                            )


def scored_plans(
    model: ModelSpec,
    *,
    snapshot: ClusterSnapshot,
    profiles: ProfileSet,
    batch: int,
    tps: tuple[int, ...],
    sizes: tuple[int, ...],
    max_depth: int,
) -> list[Scored]:
    catalog = default_catalog()
    context = PlanningContext(model=model, cluster=snapshot, profiles=profiles, catalog=catalog)
    out = []
    for candidate in every_plan(
        model, snapshot=snapshot, batch=batch, tps=tps, sizes=sizes, max_depth=max_depth
    ):
        predictions = simulate(candidate, context)
        fits = all(
            stage_prediction.peak_memory_bytes
            <= min(catalog.gpu(r.gpu_type).memory_bytes for r in stage.replicas)
            for stage, stage_prediction in zip(candidate.stages, predictions.stages, strict=True)
        )
        if fits:
            out.append(Scored(candidate, predictions))
    return out


def optimum(scored: list[Scored], objective: Objective) -> float:
    values = []
    for s in scored:
        p = s.predictions
        if (
            objective.min_samples_per_second
            and p.samples_per_second < objective.min_samples_per_second
        ):
            continue
        if objective.max_usd_per_hour and p.usd_per_hour > objective.max_usd_per_hour:
            continue
        if (
            objective.max_usd_per_iteration
            and p.usd_per_iteration > objective.max_usd_per_iteration
        ):
            continue
        values.append(p.usd_per_iteration if objective.kind == "cost" else p.iteration_seconds)
    assert values, "the brute force found no feasible plan: the case is mis-built"
    return min(values)


def check(
    model: ModelSpec,
    *,
    snapshot: ClusterSnapshot,
    profiles: ProfileSet,
    scored: list[Scored],
    objective: Objective,
    batch: int,
    sizes: tuple[int, ...],
    max_depth: int,
) -> Plan:
    request = PlanRequest(
        model=model,
        global_batch_size=batch,
        cluster=snapshot,
        objective=objective,
        top_k=2,
        micro_batch_sizes=sizes,
        max_pipeline_depth=max_depth,
    )
    result = search(request, profiles, default_catalog())
    assert isinstance(result, Planned), result
    best = result.best
    assert best.predictions is not None
    context = PlanningContext(model=model, cluster=snapshot, profiles=profiles)
    assert simulate(best.model_copy(update={"predictions": None}), context) == best.predictions
    value = (
        best.predictions.usd_per_iteration
        if objective.kind == "cost"
        else best.predictions.iteration_seconds
    )
    assert value == pytest.approx(optimum(scored, objective), rel=1e-9)
    return best


OBJECTIVE_KINDS = ["throughput", "cost", "cost-with-floor", "throughput-with-budget"]


def objective_for(kind: str, scored: list[Scored]) -> Objective:
    """The four objectives; constraints placed where they bind, from the brute force's data."""
    if kind in ("throughput", "cost"):
        return Objective(kind=kind)
    fastest = min(scored, key=lambda s: s.predictions.iteration_seconds).predictions
    cheapest = min(scored, key=lambda s: s.predictions.usd_per_iteration).predictions
    if kind == "cost-with-floor":
        # halfway between the cheapest plan's throughput and the best: the cheapest misses it
        floor = (cheapest.samples_per_second + fastest.samples_per_second) / 2
        return Objective(kind="cost", min_samples_per_second=floor)
    # a USD/hour budget below the fastest plan's: the throughput search must trade down
    lowest = min(s.predictions.usd_per_hour for s in scored)
    return Objective(kind="throughput", max_usd_per_hour=(lowest + fastest.usd_per_hour) / 2)


@pytest.fixture(scope="module")
def two_types_one_zone() -> tuple[ModelSpec, ClusterSnapshot, ProfileSet, list[Scored]]:
    # A100 2.5x faster than V100, heavy head; 2 A100 + 4 V100 on 2-GPU nodes (TP 1 or 2).
    model = tiny_model(blocks=3)
    snapshot = cluster(
        pool(FAST, "us-central1-a", 2, per_node=2), pool(SLOW, "us-central1-a", 4, per_node=2)
    )
    profiles = profile_set(
        model, [FAST, SLOW], compute_profiles(model, {FAST: 1.0, SLOW: 2.5}, head_s=0.03)
    )
    scored = scored_plans(
        model, snapshot=snapshot, profiles=profiles, batch=8, tps=(1, 2), sizes=(1, 2), max_depth=5
    )
    return model, snapshot, profiles, scored


@pytest.mark.parametrize("kind", OBJECTIVE_KINDS)
def test_two_gpu_types_in_one_zone(
    two_types_one_zone: tuple[ModelSpec, ClusterSnapshot, ProfileSet, list[Scored]],
    kind: str,
) -> None:
    model, snapshot, profiles, scored = two_types_one_zone
    objective = objective_for(kind, scored)
    check(
        model,
        snapshot=snapshot,
        profiles=profiles,
        scored=scored,
        objective=objective,
        batch=8,
        sizes=(1, 2),
        max_depth=5,
    )


@pytest.fixture(scope="module")
def two_types_two_zones() -> tuple[ModelSpec, ClusterSnapshot, ProfileSet, list[Scored]]:
    model, snapshot, profiles = cases.two_types_two_zones()
    scored = scored_plans(
        model, snapshot=snapshot, profiles=profiles, batch=8, tps=(1,), sizes=(1, 2), max_depth=3
    )
    return model, snapshot, profiles, scored


@pytest.mark.parametrize("kind", OBJECTIVE_KINDS)
def test_two_gpu_types_in_two_zones(
    two_types_two_zones: tuple[ModelSpec, ClusterSnapshot, ProfileSet, list[Scored]],
    kind: str,
) -> None:
    model, snapshot, profiles, scored = two_types_two_zones
    objective = objective_for(kind, scored)
    check(
        model,
        snapshot=snapshot,
        profiles=profiles,
        scored=scored,
        objective=objective,
        batch=8,
        sizes=(1, 2),
        max_depth=3,
    )
