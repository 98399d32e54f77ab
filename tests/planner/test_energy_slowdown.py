"""A point on the time-energy frontier: PlanRequest.energy_max_slowdown reaches the
frequency planner (planner.energy.plan_energy max_slowdown), is bounded, and holds.

A four-stage GPT3-Small pipeline on one A100 node. With one clock per GPU (what the node
agent applies) no stage can slow down at no slowdown without lengthening the fill chain, so
the time the slowdown allows is what lowers the stages' clocks. Energies are compared with
plan_energy's own no-slowdown point and frontier.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sailplan.planner.api import MAX_ENERGY_SLOWDOWN, Objective, Planned, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cli_energy import context_for
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.energy import plan_energy
from sailplan.planner.plan import Plan, Replica, Stage

CATALOG = default_catalog()
MODEL = CATALOG.model("GPT3-Small")
CLUSTER = ClusterSnapshot(
    pools=(Pool(name="a100", gpu_type="A100-40", zone="us-central1-a", gpus_per_node=4, nodes=1),)
)


def _request(**extra: object) -> PlanRequest:
    return PlanRequest(model=MODEL, global_batch_size=64, cluster=CLUSTER, **extra)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def pipeline() -> Plan:
    """Four one-GPU stages of uneven length, 16 micro-batches of 4."""
    edges = [0, 4, 8, 11, MODEL.num_layers]
    replica = Replica(pool="a100", gpu_type="A100-40", zone="us-central1-a")
    return Plan(
        model=MODEL,
        global_batch_size=64,
        micro_batch_size=4,
        num_micro_batches=16,
        stages=tuple(
            Stage(
                layer_start=edges[i], layer_end=edges[i + 1], tensor_parallel=1, replicas=(replica,)
            )
            for i in range(4)
        ),
    )


def test_the_allowed_slowdown_trades_time_for_energy(pipeline: Plan) -> None:
    context = context_for(pipeline, CLUSTER, None, CATALOG)
    base = plan_energy(pipeline, context)
    assert base.prediction().max_slowdown == 0.0
    assert base.chosen == base.no_slowdown
    previous = base.no_slowdown.joules_per_iteration
    for slowdown in (0.02, 0.1, 0.3):
        report = plan_energy(pipeline, context, max_slowdown=slowdown)
        chosen = report.chosen
        limit = (1 + slowdown) * base.no_slowdown.iteration_seconds
        assert chosen.iteration_seconds <= limit * (1 + 1e-9)
        assert chosen.joules_per_iteration <= previous * (1 + 1e-12)
        previous = min(previous, chosen.joules_per_iteration)
        prediction = report.prediction()
        assert prediction.max_slowdown == slowdown
        assert prediction.joules_per_iteration == chosen.joules_per_iteration
        assert prediction.iteration_seconds == chosen.iteration_seconds
    # 30% more time buys real savings over the no-slowdown point; small ones, since with the
    # trainer's flash attention a GPT block is mostly compute-bound, and a compute-bound
    # kernel's time grows as its clock falls
    assert previous < 0.99 * base.no_slowdown.joules_per_iteration


def test_the_throughput_floor_caps_the_slowdown(pipeline: Plan) -> None:
    context = context_for(pipeline, CLUSTER, None, CATALOG)
    base = plan_energy(pipeline, context)
    cap = 1.01 * base.no_slowdown.iteration_seconds
    capped = plan_energy(pipeline, context, max_slowdown=0.5, max_iteration_seconds=cap)
    assert capped.chosen.iteration_seconds <= cap * (1 + 1e-9)
    free = plan_energy(pipeline, context, max_slowdown=0.5)
    assert free.chosen.iteration_seconds > cap


def test_the_request_bounds_the_slowdown(pipeline: Plan) -> None:
    for bad in (-0.1, MAX_ENERGY_SLOWDOWN + 0.01, 10.0):
        with pytest.raises(ValidationError, match="energy_max_slowdown"):
            _request(energy_max_slowdown=bad)

    with pytest.raises(ValueError, match="below zero"):
        plan_energy(pipeline, context_for(pipeline, CLUSTER, None, CATALOG), max_slowdown=-1)


def test_the_energy_objective_and_predictions_use_the_allowed_slowdown() -> None:
    fastest = make_plan(_request(top_k=1), catalog=CATALOG)
    assert isinstance(fastest, Planned) and fastest.best.predictions is not None
    floor = 0.5 * fastest.best.predictions.samples_per_second
    objective = Objective(kind="energy", min_samples_per_second=floor)
    plain = make_plan(_request(objective=objective), catalog=CATALOG)
    slowed = make_plan(_request(objective=objective, energy_max_slowdown=0.2), catalog=CATALOG)
    assert isinstance(plain, Planned) and isinstance(slowed, Planned)
    for result, slowdown in ((plain, 0.0), (slowed, 0.2)):
        energy = result.best.predictions.energy if result.best.predictions else None
        assert energy is not None and energy.max_slowdown == slowdown
        # never below the floor, whatever the slowdown
        assert energy.iteration_seconds <= 64 / floor * (1 + 1e-9)
    plain_j = plain.best.predictions.energy.joules_per_iteration  # type: ignore[union-attr]
    slowed_j = slowed.best.predictions.energy.joules_per_iteration  # type: ignore[union-attr]
    assert slowed_j <= plain_j * (1 + 1e-12)
    # the other objectives' energy predictions take it too
    asked = make_plan(
        _request(top_k=1, energy_predictions=True, energy_max_slowdown=0.2), catalog=CATALOG
    )
    assert isinstance(asked, Planned) and asked.best.predictions is not None
    assert asked.best.predictions.energy is not None
    assert asked.best.predictions.energy.max_slowdown == 0.2
