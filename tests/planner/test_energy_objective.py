"""The search's energy objective and energy prices in the cost (planner/search/energy.py).

Small clusters (GPT3-Small on a few GPUs) keep every search under a second. Energies are
checked against planner.energy.plan_energy run on the returned plans, not against numbers
the search printed.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from pydantic import ValidationError

from sailplan.planner.api import Infeasible, Objective, Planned, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cli_energy import context_for
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.energy import JOULES_PER_KWH, plan_energy
from sailplan.planner.plan import Plan
from sailplan.planner.simulator import simulate

CATALOG = default_catalog()
MODEL = CATALOG.model("GPT3-Small")
BATCH = 64
ZONE = "us-central1-a"


def _cluster(*pools: Pool) -> ClusterSnapshot:
    return ClusterSnapshot(pools=pools)


A100X4 = _cluster(Pool(name="a100", gpu_type="A100-40", zone=ZONE, gpus_per_node=4, nodes=1))


def _plan(cluster: ClusterSnapshot, objective: Objective, **extra: object) -> Planned:
    request = PlanRequest(
        model=MODEL, global_batch_size=BATCH, cluster=cluster, objective=objective, **extra
    )
    result = make_plan(request, catalog=CATALOG)
    assert isinstance(result, Planned), result
    return result


def _joules(plan: Plan, cluster: ClusterSnapshot) -> float:
    """No-slowdown energy of `plan`, computed afresh by the energy model."""
    report = plan_energy(plan, context_for(plan, cluster, None, CATALOG))
    return report.no_slowdown.joules_per_iteration


def test_the_energy_objective_uses_less_energy_than_the_fastest_plan_above_the_floor() -> None:
    # Every data-parallel replica runs the full optimizer step and waits in the gradient
    # all-reduce at blocking power, so the fastest plan (DP over every GPU) is not the
    # least energy; under a low floor the energy objective must find a plan that uses
    # less (here a pipeline whose short stages slow down), and say so.
    fastest = _plan(A100X4, Objective(kind="throughput")).best
    assert fastest.predictions is not None
    floor = 0.4 * fastest.predictions.samples_per_second
    energy = _plan(A100X4, Objective(kind="energy", min_samples_per_second=floor))
    chosen = energy.best
    assert chosen.predictions is not None and chosen.predictions.energy is not None
    assert chosen.predictions.samples_per_second >= floor * (1 - 1e-9)
    # its energy is the energy model's at its no-slowdown clocks, and below the fastest's
    assert chosen.predictions.energy.joules_per_iteration == pytest.approx(
        _joules(chosen, A100X4), rel=1e-9
    )
    assert _joules(chosen, A100X4) < _joules(fastest, A100X4)
    # the throughput objective under the same floor still returns the fastest plan
    same_floor = _plan(A100X4, Objective(kind="throughput", min_samples_per_second=floor))
    assert same_floor.best.world_size == fastest.world_size
    assert "least GPU energy" in chosen.reason


def test_the_energy_objective_prefers_the_gpu_type_that_draws_less_for_the_same_work() -> None:
    # The floor is reachable on either the A100-40s or the H100-80s alone: with both in
    # the cluster the plan returned must not use more energy than the energy objective's
    # plan on either type alone (both are among the plans it could return).
    cluster = _cluster(
        Pool(name="a100", gpu_type="A100-40", zone=ZONE, gpus_per_node=2, nodes=1),
        Pool(name="h100", gpu_type="H100-80", zone=ZONE, gpus_per_node=2, nodes=1),
    )
    floor = 10.0
    objective = Objective(kind="energy", min_samples_per_second=floor)
    both = _plan(cluster, objective).best
    for name in ("a100", "h100"):
        alone = _cluster(*(p for p in cluster.pools if p.name == name))
        best_alone = _plan(alone, objective).best
        assert _joules(both, cluster) <= _joules(best_alone, alone) * (1 + 1e-9)


def test_the_energy_objective_is_deterministic_and_ranks_its_alternatives() -> None:
    objective = Objective(kind="energy", min_samples_per_second=15.0)
    first = _plan(A100X4, objective, top_k=3)
    again = _plan(A100X4, objective, top_k=3)
    plans = [first.best, *first.alternatives]
    assert [p.to_json() for p in plans] == [p.to_json() for p in (again.best, *again.alternatives)]
    joules = [_joules(p, A100X4) for p in plans]
    assert joules == sorted(joules)


def test_an_energy_objective_needs_a_floor() -> None:
    with pytest.raises(ValidationError, match="needs a throughput floor"):
        Objective(kind="energy")


def test_a_gpu_without_power_data_is_named_in_one_line() -> None:
    gpus = dict(CATALOG.gpus)
    gpus["A100-40"] = gpus["A100-40"].model_copy(update={"power": None})
    without_power = type(CATALOG)(
        gpus=gpus,
        models=CATALOG.models,
        regions=CATALOG.regions,
        egress=CATALOG.egress,
        remote_continents=CATALOG.remote_continents,
        continent_prefixes=CATALOG.continent_prefixes,
    )
    for request in (
        PlanRequest(
            model=MODEL,
            global_batch_size=BATCH,
            cluster=A100X4,
            objective=Objective(kind="energy", min_samples_per_second=1.0),
        ),
        PlanRequest(
            model=MODEL,
            global_batch_size=BATCH,
            cluster=_cluster(A100X4.pools[0].model_copy(update={"usd_per_kwh": 0.1})),
        ),
    ):
        result = make_plan(request, catalog=without_power)
        assert isinstance(result, Infeasible)
        assert result.code == "NoProfile"
        assert "pool a100: no power data for GPU type 'A100-40'" in result.reason
        assert "\n" not in result.reason


# -- energy prices in the cost -----------------------------------------------------------


def test_a_pools_energy_price_adds_its_gpus_default_clock_energy_to_the_cost() -> None:
    plan = _plan(A100X4, Objective(kind="throughput")).best
    price = 0.25
    priced = _cluster(A100X4.pools[0].model_copy(update={"usd_per_kwh": price}))
    unpriced_predictions = simulate(plan, context_for(plan, A100X4, None, CATALOG))
    context = context_for(plan, priced, None, CATALOG)
    predictions = simulate(plan, context)
    # the energy model's default-clock point is an independent sum over the same GPUs
    joules = plan_energy(plan, context).default.joules_per_iteration
    expected = joules / JOULES_PER_KWH * price
    assert predictions.energy_usd_per_iteration == pytest.approx(expected, rel=1e-9)
    assert predictions.usd_per_iteration - unpriced_predictions.usd_per_iteration == (
        pytest.approx(expected, rel=1e-9)
    )
    assert predictions.usd_per_hour == pytest.approx(
        predictions.usd_per_iteration * 3600 / predictions.iteration_seconds
    )
    assert unpriced_predictions.energy_usd_per_iteration == 0.0


def test_the_cost_objective_moves_to_the_pool_with_cheaper_energy() -> None:
    # Two identical A100 pools in two zones of one region at the same GPU price: without
    # energy prices the cost objective is indifferent (it takes the first zone by name);
    # with energy priced in the first zone only, every GPU of the plan is in the second.
    first = Pool(name="a", gpu_type="A100-40", zone="us-central1-a", gpus_per_node=4, nodes=1)
    second = Pool(name="b", gpu_type="A100-40", zone="us-central1-b", gpus_per_node=4, nodes=1)
    cost = Objective(kind="cost")
    plain = _plan(_cluster(first, second), cost).best
    assert set(plain.gpus_by_pool()) == {"a"}
    priced = _cluster(first.model_copy(update={"usd_per_kwh": 1.0}), second)
    chosen = _plan(priced, cost).best
    assert set(chosen.gpus_by_pool()) == {"b"}
    assert chosen.predictions is not None
    assert chosen.predictions.energy_usd_per_iteration == 0.0


def test_a_negative_energy_price_is_refused_and_unpriced_pools_keep_their_hash() -> None:
    with pytest.raises(ValidationError, match="usd_per_kwh"):
        Pool(name="a", gpu_type="A100-40", zone=ZONE, nodes=1, usd_per_kwh=-0.01)
    pool = A100X4.pools[0]
    # the cluster hash of a snapshot without energy prices is what it was before they
    # existed (plans and replan decisions compare it), and a price changes it
    dumped = {k: v for k, v in pool.model_dump(mode="json").items() if k != "usd_per_kwh"}
    body = {"pools": [dumped], "egress": None}
    old = "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    assert A100X4.content_hash() == old
    assert _cluster(pool.model_copy(update={"usd_per_kwh": 0.1})).content_hash() != old


def test_energy_predictions_come_with_every_plan_when_asked() -> None:
    result = _plan(A100X4, Objective(kind="throughput"), top_k=2, energy_predictions=True)
    for plan in (result.best, *result.alternatives):
        assert plan.predictions is not None and plan.predictions.energy is not None
        assert plan.predictions.energy.joules_per_iteration == pytest.approx(
            _joules(plan, A100X4), rel=1e-9
        )
        assert len(plan.predictions.energy.stage_clocks) == plan.pipeline_depth
    plain = _plan(A100X4, Objective(kind="throughput")).best
    assert plain.predictions is not None and plain.predictions.energy is None


def test_the_energy_price_counts_recomputation_and_not_an_offloaded_step() -> None:
    """The priced energy is the energy model's default point also when a stage recomputes
    (a longer busy pass) and offloads its optimizer step (the CPU steps, the GPU waits)."""
    plan = _plan(A100X4, Objective(kind="throughput")).best
    stages = tuple(
        s.model_copy(update={"recompute": "full", "optimizer_offload": True}) for s in plan.stages
    )
    changed = plan.model_copy(update={"stages": stages})
    price = 0.25
    priced = _cluster(A100X4.pools[0].model_copy(update={"usd_per_kwh": price}))
    plain_context = context_for(plan, priced, None, CATALOG)
    context = context_for(changed, priced, None, CATALOG)
    joules = plan_energy(changed, context).default.joules_per_iteration
    energy_usd = simulate(changed, context).energy_usd_per_iteration
    assert energy_usd == pytest.approx(joules / JOULES_PER_KWH * price, rel=1e-9)
    # and it differs from the plain plan's: the check is not vacuous
    assert energy_usd != pytest.approx(simulate(plan, plain_context).energy_usd_per_iteration)
