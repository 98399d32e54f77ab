"""Node start-up time in the replan decision: a plan that needs nodes an autoscaled pool
has yet to add waits for them, and that wait is part of its cost.

Plans come from the real planner (make_plan): OPT-350M, global batch 32, A100 nodes of 4
GPUs in one zone, one ready and three that the pool may add.
"""

from __future__ import annotations

import pytest
from operator_builders import JOB_SPEC

from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.replan import triggers as t
from sailplan.operator.replan.cost import fastest_to_finish, node_wait_seconds
from sailplan.operator.replan.decision import (
    Keep,
    ReplanContext,
    ReplanInputs,
    Switch,
    decide,
    plan_request,
)
from sailplan.planner.api import Planned, make_plan
from sailplan.planner.catalog import Catalog, default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.plan import Plan

ZONE = "us-central1-a"
SPEC = JOB_SPEC | {"training": {"globalBatchSize": 32, "steps": 100_000}}
CAPACITY_ADDED = t.Trigger(t.CAPACITY_ADDED, "a100: +12 GPUs")


def job(step: int = 0) -> TrainingJob:
    return TrainingJob.model_validate(
        {"name": "opt", "namespace": "team-a", "spec": SPEC, "status": {"progress": {"step": step}}}
    )


def cluster(ready: int, obtainable: int, provisioning_seconds: float) -> ClusterSnapshot:
    return ClusterSnapshot(
        pools=(
            Pool(
                name=f"a100/{ZONE}",
                gpu_type="A100-40",
                zone=ZONE,
                gpus_per_node=4,
                nodes=ready + obtainable,
                obtainable_nodes=obtainable,
                provisioning_seconds=provisioning_seconds,
            ),
        )
    )


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return default_catalog()


def best(catalog: Catalog, snapshot: ClusterSnapshot) -> Plan:
    result = make_plan(plan_request(job(), catalog.model("OPT-350M"), snapshot))
    assert isinstance(result, Planned)
    return result.best


@pytest.fixture(scope="module")
def on_one_node(catalog: Catalog) -> Plan:
    return best(catalog, cluster(1, 0, 0))


@pytest.fixture(scope="module")
def on_four_nodes(catalog: Catalog) -> Plan:
    return best(catalog, cluster(1, 3, 0))


def test_a_plan_waits_only_when_it_needs_nodes_that_do_not_exist(
    on_one_node: Plan, on_four_nodes: Plan
) -> None:
    grown = cluster(1, 3, 480)
    assert node_wait_seconds(on_one_node, grown) == 0.0
    assert node_wait_seconds(on_four_nodes, grown) == 480.0
    assert node_wait_seconds(on_four_nodes, cluster(4, 0, 480)) == 0.0


def test_first_plan_on_ready_nodes_beats_a_faster_one_that_waits(
    on_one_node: Plan, on_four_nodes: Plan
) -> None:
    assert on_four_nodes.predictions is not None and on_one_node.predictions is not None
    faster = on_four_nodes.predictions.samples_per_second
    slower = on_one_node.predictions.samples_per_second
    assert faster > slower
    grown = cluster(1, 3, 480)
    # Little work left: done on the one ready node before four nodes could even arrive.
    little = slower * 60
    chosen, why = fastest_to_finish(
        (on_four_nodes, on_one_node), grown, remaining_samples=little, horizon_seconds=1e9
    )
    assert chosen is on_one_node
    assert why is not None and "waits 480 s" in why
    # Much work left: the wait is repaid, the faster plan wins.
    much = faster * 86400
    chosen, why = fastest_to_finish(
        (on_four_nodes, on_one_node), grown, remaining_samples=much, horizon_seconds=1e9
    )
    assert chosen is on_four_nodes and why is None


def test_a_switch_onto_new_nodes_counts_their_start_up_in_the_restart(
    catalog: Catalog, on_one_node: Plan
) -> None:
    model = catalog.model("OPT-350M")
    context = ReplanContext(planner=make_plan, catalog=catalog)

    def decision(provisioning_seconds: float) -> Keep | Switch:
        snapshot = cluster(1, 3, provisioning_seconds)
        inputs = ReplanInputs(
            job=job(step=99_000), model=model, plan=on_one_node, pods=(), nodes={}, cluster=snapshot
        )
        result = decide(inputs, context, CAPACITY_ADDED)
        assert isinstance(result, Keep | Switch)
        return result

    instant = decision(0)
    assert isinstance(instant, Switch) and instant.evaluation is not None
    saved, restart = instant.evaluation.benefit, instant.evaluation.restart_seconds
    # Nodes that take longer to arrive than the switch would save: keep the running plan.
    slow = decision(saved * 2)
    assert isinstance(slow, Keep) and slow.evaluation is not None
    assert slow.evaluation.restart_seconds == pytest.approx(restart + saved * 2)
