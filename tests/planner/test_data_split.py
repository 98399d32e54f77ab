"""Uneven data split across mixed replicas: the counts, the simulator's schedule, the planner."""

from __future__ import annotations

import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance
from sailplan.planner.search.data_split import balance_data_split, proportional_counts
from sailplan.planner.simulator import PlanningContext, simulate

CATALOG = default_catalog()
TINY = ModelSpec(
    name="tiny", hidden_size=64, num_blocks=4, num_heads=4, vocab_size=128, sequence_length=32
)
ZONE = "us-central1-a"


def test_counts_follow_speed_and_sum_to_the_total() -> None:
    assert proportional_counts(8, [3.0, 1.0]) == (6, 2)
    assert proportional_counts(5, [1.0, 1.0]) == (3, 2)  # the tie goes to pipeline 0
    assert proportional_counts(3, [100.0, 1.0, 1.0]) == (1, 1, 1)  # at least one each
    with pytest.raises(ValueError):
        proportional_counts(1, [1.0, 1.0])


def _profile(gpu: str, layer_s: float) -> ComputeProfile:
    n = TINY.num_layers
    return ComputeProfile(
        model="tiny",
        gpu_type=gpu,
        tensor_parallel=1,
        micro_batch_size=1,
        forward_s=(layer_s,) * n,
        backward_s=(2 * layer_s,) * n,
        update_s=(0.0,) * n,
        provenance=Provenance(source="measured", tool="test"),
    )


def test_each_pipeline_runs_its_own_count_and_the_slowest_sets_the_time() -> None:
    cluster = ClusterSnapshot(
        pools=(
            Pool(name="a", gpu_type="A100-40", zone=ZONE, nodes=1),
            Pool(name="v", gpu_type="V100-16", zone=ZONE, nodes=1),
        )
    )
    profiles = ProfileSet(compute=(_profile("A100-40", 1e-3), _profile("V100-16", 3e-3)))
    context = PlanningContext(model=TINY, cluster=cluster, profiles=profiles)
    replicas = (
        Replica(gpu_type="A100-40", zone=ZONE, pool="a"),
        Replica(gpu_type="V100-16", zone=ZONE, pool="v"),
    )

    def plan(counts: tuple[int, int] | None) -> Plan:
        return Plan(
            model=TINY,
            global_batch_size=8,
            micro_batch_size=1,
            num_micro_batches=max(counts) if counts else 4,
            pipeline_micro_batches=counts,
            stages=(Stage(layer_start=0, layer_end=TINY.num_layers, replicas=replicas),),
        )

    per_micro_batch_a = TINY.num_layers * 3e-3  # forward + backward of every layer
    even = simulate(plan(None), context)
    uneven = simulate(plan((6, 2)), context)
    # even: both pipelines wait for the V100's 4 micro-batches; uneven: 6 x A100 = 2 x V100
    assert even.pipeline_seconds == pytest.approx(4 * 3 * per_micro_batch_a)
    assert uneven.pipeline_seconds == pytest.approx(6 * per_micro_batch_a)


def test_balancing_gives_the_faster_replica_more_micro_batches_and_says_why() -> None:
    # OPT-350M, one A100 and one A100-80 as the two replicas of one stage, estimated
    # profiles: the A100-80 is the faster (calibrated on the artifact's measured profiles)
    model = CATALOG.model("OPT-350M")
    cluster = ClusterSnapshot(
        pools=(
            Pool(name="a40", gpu_type="A100-40", zone=ZONE, gpus_per_node=1, nodes=1),
            Pool(name="a80", gpu_type="A100-80", zone=ZONE, gpus_per_node=1, nodes=1),
        )
    )
    profiles = complete_profiles(
        model, ["A100-40", "A100-80"], [1], [1], measured=ProfileSet(), catalog=CATALOG
    )
    context = PlanningContext(model=model, cluster=cluster, profiles=profiles)
    replicas = (
        Replica(gpu_type="A100-40", zone=ZONE, pool="a40"),
        Replica(gpu_type="A100-80", zone=ZONE, pool="a80"),
    )
    even = Plan(
        model=model,
        global_batch_size=32,
        micro_batch_size=1,
        num_micro_batches=16,
        stages=(Stage(layer_start=0, layer_end=model.num_layers, replicas=replicas),),
    )
    balanced = balance_data_split(even, context)
    assert balanced is not None and balanced.pipeline_micro_batches is not None
    slow_count, fast_count = balanced.pipeline_micro_batches
    assert fast_count > slow_count and slow_count + fast_count == 32
    assert "uneven data split" in balanced.reason
    assert balanced.predictions is not None
    assert balanced.predictions.iteration_seconds < simulate(even, context).iteration_seconds
    # identical replicas: nothing to balance
    same = even.model_copy(
        update={"stages": (even.stages[0].model_copy(update={"replicas": (replicas[0],) * 2}),)}
    )
    assert balance_data_split(same, context) is None
