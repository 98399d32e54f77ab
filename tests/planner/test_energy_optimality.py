"""The energy objective finds the least-energy plan: compared with exhaustive enumeration.

test_optimality.py's brute force enumerates every plan of the contract on small clusters
(mixed GPU types, zones, TP degrees, pipeline depths, splits and placements); here each
plan that fits is given its energy by planner.energy.plan_energy, independently of the
search, and the least energy among plans that reach the floor must be the search's (ties
may pick another plan of the same energy). Floors are placed where they bind, from the
brute force's own data; with and without an allowed slowdown. The search's lower bounds
(search/energy.py) are checked one by one against the same plans' energies.
"""

from __future__ import annotations

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
from test_optimality import Scored, scored_plans

from sailplan.planner.api import Objective, Planned, PlanRequest
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.energy import plan_energy
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.search import plan as search
from sailplan.planner.search.energy import EnergyBound, least_shares
from sailplan.planner.simulator import PlanningContext

BATCH = 8
Case = tuple[ModelSpec, ClusterSnapshot, ProfileSet, list[Scored], int]


def _energies(case: Case, floor: float, slowdown: float) -> list[float]:
    model, snapshot, profiles, scored, _ = case
    context = PlanningContext(model=model, cluster=snapshot, profiles=profiles)
    out = []
    for s in scored:
        if s.predictions.samples_per_second < floor:
            continue
        report = plan_energy(
            s.plan,
            context,
            predictions=s.predictions,
            max_slowdown=slowdown,
            max_iteration_seconds=BATCH / floor,
        )
        out.append(report.prediction().joules_per_iteration)
    return out


def _floors(scored: list[Scored]) -> list[float]:
    """Three floors: a low one, the median plan's throughput and one near the fastest."""
    rates = sorted(s.predictions.samples_per_second for s in scored)
    return [rates[len(rates) // 10], rates[len(rates) // 2], rates[-1] * 0.9]


@pytest.fixture(scope="module")
def one_zone() -> Case:
    # A100 2.5x faster than V100, heavy head; 2 A100 + 4 V100 on 2-GPU nodes (TP 1 or 2).
    model = tiny_model(blocks=3)
    snapshot = cluster(
        pool(FAST, "us-central1-a", 2, per_node=2), pool(SLOW, "us-central1-a", 4, per_node=2)
    )
    profiles = profile_set(
        model, [FAST, SLOW], compute_profiles(model, {FAST: 1.0, SLOW: 2.5}, head_s=0.03)
    )
    scored = scored_plans(
        model,
        snapshot=snapshot,
        profiles=profiles,
        batch=BATCH,
        tps=(1, 2),
        sizes=(1, 2),
        max_depth=4,
    )
    return model, snapshot, profiles, scored, 4


@pytest.fixture(scope="module")
def two_zones() -> Case:
    model, snapshot, profiles = cases.two_types_two_zones()
    scored = scored_plans(
        model,
        snapshot=snapshot,
        profiles=profiles,
        batch=BATCH,
        tps=(1,),
        sizes=(1, 2),
        max_depth=3,
    )
    return model, snapshot, profiles, scored, 3


def _check(case: Case, which: int, slowdown: float) -> None:
    model, snapshot, profiles, scored, depth = case
    floor = _floors(scored)[which]
    expected = min(_energies(case, floor, slowdown))
    request = PlanRequest(
        model=model,
        global_batch_size=BATCH,
        cluster=snapshot,
        objective=Objective(kind="energy", min_samples_per_second=floor),
        top_k=2,
        micro_batch_sizes=(1, 2),
        max_pipeline_depth=depth,
        energy_max_slowdown=slowdown,
    )
    result = search(request, profiles, default_catalog())
    assert isinstance(result, Planned), result
    best = result.best
    assert best.predictions is not None and best.predictions.energy is not None
    assert best.predictions.samples_per_second >= floor * (1 - 1e-9)
    # the search's energy is plan_energy's of the plan it returns ...
    context = PlanningContext(model=model, cluster=snapshot, profiles=profiles)
    again = plan_energy(
        best.model_copy(update={"predictions": None}),
        context,
        max_slowdown=slowdown,
        max_iteration_seconds=BATCH / floor,
    )
    assert best.predictions.energy.joules_per_iteration == pytest.approx(
        again.prediction().joules_per_iteration, rel=1e-9
    )
    # ... and the least of every plan's
    assert best.predictions.energy.joules_per_iteration == pytest.approx(expected, rel=1e-9)
    assert best.predictions.energy.iteration_seconds <= BATCH / floor * (1 + 1e-9)
    # the bound the search states holds: no plan uses less
    assert result.energy_lower_bound is not None
    assert result.energy_lower_bound <= expected * (1 + 1e-9)


@pytest.mark.parametrize(("which", "slowdown"), [(0, 0.0), (1, 0.0), (2, 0.0), (1, 0.2)])
def test_least_energy_in_one_zone(one_zone: Case, which: int, slowdown: float) -> None:
    _check(one_zone, which, slowdown)


@pytest.mark.parametrize("which", [0, 2])
def test_least_energy_in_two_zones(two_zones: Case, which: int) -> None:
    _check(two_zones, which, 0.0)


@pytest.mark.parametrize("slowdown", [0.0, 0.2])
@pytest.mark.parametrize("which", ["one_zone", "two_zones"])
def test_every_lower_bound_holds_for_every_plan(
    which: str, slowdown: float, request: pytest.FixtureRequest
) -> None:
    """The per-plan bound (before and after simulate), the stage DP's per-stage joules and
    the triple's per-layer joules never exceed a plan's energy: every plan of the brute
    force, helpers and replicas in other zones included; and for a single pipeline at no
    slowdown, where no stage may slow down, the per-plan bound is the energy itself."""
    model, snapshot, profiles, scored, _ = request.getfixturevalue(which)
    floor = _floors(scored)[1]
    context = PlanningContext(model=model, cluster=snapshot, profiles=profiles)
    pools = [p for p in snapshot.pools if p.gpus > 0]
    bound = EnergyBound(
        context,
        pools,
        BATCH,
        max_slowdown=slowdown,
        max_iteration_seconds=BATCH / floor,
        tensor_parallel_degrees=lambda _: (1, 2),
    )
    checked = tight = 0
    for s in scored:
        if s.predictions.samples_per_second < floor:
            continue
        plan = s.plan
        energy = plan_energy(
            plan,
            context,
            predictions=s.predictions,
            max_slowdown=slowdown,
            max_iteration_seconds=BATCH / floor,
        ).prediction()
        exact = energy.joules_per_iteration * (1 + 1e-9)
        placed = bound.placed(plan)
        after = placed.lower(s.predictions)
        assert placed.lower() <= exact and after <= exact, plan
        blocking = s.predictions.iteration_seconds * bound.plan_watts(plan)
        mbs, dp = plan.micro_batch_size, plan.data_parallel
        stages = sum(
            min(
                bound.stage_joules([r.gpu_type], st.tensor_parallel, mbs, dp)[st.layer_start][
                    st.layer_end
                ]
                for r in st.replicas
            )
            for st in plan.stages
        )
        assert blocking + stages <= exact, plan
        assert blocking + bound.joules_lower(mbs, dp) <= exact, plan
        checked += 1
        if dp == 1 and slowdown == 0.0:
            assert after == pytest.approx(energy.joules_per_iteration, rel=1e-9)
            tight += 1
    assert checked > 50 and (tight > 0 or slowdown > 0)


def test_the_least_share_of_a_layer_is_the_least_over_the_ranges_holding_it() -> None:
    # (compute, other) per layer: an embedding with no compute, two blocks, a head
    parts = [(0.0, 1.0), (3.0, 1.0), (1.0, 1.0), (4.0, 0.0)]
    shares = least_shares(parts)
    for layer in range(len(parts)):
        ranges = [(a, b) for a in range(layer + 1) for b in range(layer + 1, len(parts) + 1)]
        brute = min(
            sum(c for c, _ in parts[a:b]) / sum(c + o for c, o in parts[a:b]) for a, b in ranges
        )
        assert shares[layer] == pytest.approx(brute)
    assert shares[0] == 0.0  # the embedding alone
    # the head alone is all compute, but a stage holding it may start at the embedding
    assert shares[3] == pytest.approx(8.0 / 11.0)
