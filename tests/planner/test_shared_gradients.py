"""The simulator prices the trainer's cross-stage sum of tied embeddings and its gradient
buckets (planner/simulator/ties.py, CostModel.shared_gradient_seconds, group_bucket_bytes).

A tied model and the same model with a separate head (same name, same compute profiles)
differ on a split plan by the sync alone: the head's own matrix and the tied copy weigh the
same, so only the sync and its egress change. No artifact needed.
"""

from __future__ import annotations

import dataclasses

import pytest

from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance
from sailplan.planner.simulator import DEFAULT_CONSTANTS, PlanningContext, simulate, zone_links
from sailplan.planner.simulator.collectives import NCCL_BASE_LATENCY_S
from sailplan.planner.simulator.costs import Endpoint
from sailplan.planner.simulator.memory import (
    FP32_BYTES,
    REPLICATED_BUCKET_BYTES,
    TRAINER_BUCKET_ELEMENTS,
    TrainingSetup,
)

UNTIED = ModelSpec(
    name="tiny",
    family="gpt3",
    hidden_size=256,
    num_blocks=4,
    num_heads=4,
    vocab_size=4096,
    sequence_length=64,
)
TIED = UNTIED.model_copy(update={"tied_embeddings": True})
MEASURED = Provenance(source="measured", tool="test")
GPU = "A100-40"
PROFILES = ProfileSet(
    compute=tuple(
        ComputeProfile(
            model="tiny",
            gpu_type=GPU,
            tensor_parallel=tp,
            micro_batch_size=1,
            forward_s=(1e-3,) * UNTIED.num_layers,
            backward_s=(2e-3,) * UNTIED.num_layers,
            update_s=(1e-4,) * UNTIED.num_layers,
            provenance=MEASURED,
        )
        for tp in (1, 2)
    )
)
CLUSTER = ClusterSnapshot(
    pools=(
        Pool(name="a", gpu_type=GPU, zone="us-central1-a", gpus_per_node=8, nodes=4),
        Pool(name="b", gpu_type=GPU, zone="us-central1-b", gpus_per_node=8, nodes=4),
        Pool(name="eu", gpu_type=GPU, zone="europe-west4-a", gpus_per_node=8, nodes=4),
    )
)
A = Replica(pool="a", gpu_type=GPU, zone="us-central1-a")
B = Replica(pool="b", gpu_type=GPU, zone="us-central1-b")
EU = Replica(pool="eu", gpu_type=GPU, zone="europe-west4-a")
TRAINER = TrainingSetup.trainer(zero_stage=0, precision="fp32")


def context(model: ModelSpec, training: TrainingSetup = TRAINER) -> PlanningContext:
    return PlanningContext(model=model, cluster=CLUSTER, profiles=PROFILES, training=training)


def plan(model: ModelSpec, *stages: tuple[int, int, tuple[Replica, ...]], tp: int = 1) -> Plan:
    replicas = len(stages[0][2])
    return Plan(
        model=model,
        global_batch_size=4 * replicas,
        micro_batch_size=1,
        num_micro_batches=4,
        stages=tuple(
            Stage(layer_start=a, layer_end=b, tensor_parallel=tp, replicas=r) for a, b, r in stages
        ),
    )


def two_stages(model: ModelSpec, first: Replica, last: Replica, tp: int = 1) -> Plan:
    return plan(model, (0, 3, (first,)), (3, UNTIED.num_layers, (last,)), tp=tp)


FULL_GRADIENT = UNTIED.vocab_size * UNTIED.hidden_size * FP32_BYTES  # vocab x hidden x 4 B


def test_a_split_tied_plan_costs_exactly_the_priced_sync_more_than_its_untied_twin() -> None:
    tied = simulate(two_stages(TIED, A, A), context(TIED))
    untied = simulate(two_stages(UNTIED, A, A), context(UNTIED))
    costs = context(TIED).costs
    # the trainer's two TP roots all-reduce the whole gradient: a ring of two, each half
    # once each way, over the link between the two stages (the boundary's link)
    sync = 2 * costs.p2p_seconds(FULL_GRADIENT / 2, A, A, 1) + NCCL_BASE_LATENCY_S
    assert costs.shared_gradient_seconds("tokens", [(A, 1), (A, 1)]) == pytest.approx(sync)
    # and the optimizer updates the copy on the last stage, at layer 0's update time per
    # parameter (the profiles here give every layer 1e-4 s, untied or not)
    copy_update = 1e-4 * TIED.vocab_size * TIED.hidden_size / TIED.embedding_parameters()
    assert tied.update_seconds - untied.update_seconds == pytest.approx(copy_update, rel=1e-9)
    assert tied.iteration_seconds - untied.iteration_seconds == pytest.approx(
        sync + copy_update, rel=1e-9
    )
    assert tied.allreduce_seconds - untied.allreduce_seconds == pytest.approx(sync, rel=1e-9)
    assert tied.pipeline_seconds == untied.pipeline_seconds
    # the last stage keeps a copy of the token matrix: as much as the untied head matrix
    assert [s.peak_memory_bytes for s in tied.stages] == [
        s.peak_memory_bytes for s in untied.stages
    ]


def test_a_tied_model_on_one_stage_syncs_nothing_and_holds_the_matrix_once() -> None:
    layers = UNTIED.num_layers
    tied = simulate(plan(TIED, (0, layers, (A,))), context(TIED))
    untied = simulate(plan(UNTIED, (0, layers, (A,))), context(UNTIED))
    assert tied.iteration_seconds == untied.iteration_seconds
    # fp32 Adam, no DP: weights 4 + gradients 4 + moments 8 = 16 bytes per parameter
    matrix_states = 16 * UNTIED.vocab_size * UNTIED.hidden_size
    saved = untied.stages[0].peak_memory_bytes - tied.stages[0].peak_memory_bytes
    assert saved == pytest.approx(matrix_states, abs=2)


def test_the_sync_runs_over_the_link_between_the_first_and_last_stage() -> None:
    costs = context(TIED).costs
    same_zone = costs.shared_gradient_seconds("tokens", [(A, 1), (A, 1)])
    other_zone = costs.shared_gradient_seconds("tokens", [(A, 1), (B, 1)])
    other_region = costs.shared_gradient_seconds("tokens", [(A, 1), (EU, 1)])
    assert same_zone < other_region
    assert same_zone <= other_zone
    # a 3-stage plan whose middle stage is elsewhere pays the first-last link only
    layers = UNTIED.num_layers
    near = simulate(plan(TIED, (0, 2, (A,)), (2, 4, (EU,)), (4, layers, (A,))), context(TIED))
    far = simulate(plan(TIED, (0, 2, (A,)), (2, 4, (A,)), (4, layers, (EU,))), context(TIED))
    assert near.allreduce_seconds == pytest.approx(same_zone, rel=1e-9)
    assert far.allreduce_seconds == pytest.approx(other_region, rel=1e-9)


def test_a_cross_zone_sync_is_egress_each_way() -> None:
    tied = simulate(two_stages(TIED, A, B), context(TIED))
    untied = simulate(two_stages(UNTIED, A, B), context(UNTIED))
    # both ring edges cross the zones, each carrying 2 (m - 1) / m = 1 x the gradient
    extra = tied.egress_bytes_per_iteration - untied.egress_bytes_per_iteration
    assert extra == pytest.approx(2 * FULL_GRADIENT)


def test_tensor_parallel_ends_gather_and_broadcast_inside_their_nodes() -> None:
    costs = context(TIED).costs
    # the TP roots' ring at the TP group's share of the NIC (as a pipeline boundary is)
    ring = 2 * costs.p2p_seconds(FULL_GRADIENT / 2, A, A, 2) + NCCL_BASE_LATENCY_S
    curve, latency = costs._intra_node_link(GPU, 8)
    shard = FULL_GRADIENT / 2
    gather = shard / curve.bytes_per_second(shard) + latency
    broadcast = FULL_GRADIENT / curve.bytes_per_second(FULL_GRADIENT) + latency
    synced = costs.shared_gradient_seconds("tokens", [(A, 2), (A, 2)])
    assert synced == pytest.approx(gather + ring + broadcast, rel=1e-9)


def test_the_trainer_s_bucket_is_25_mib_per_rank_under_zero_0_and_2_24_elements_under_zero() -> (
    None
):
    assert context(TIED).costs.group_bucket_bytes(1) == REPLICATED_BUCKET_BYTES
    assert context(TIED).costs.group_bucket_bytes(4) == 4 * REPLICATED_BUCKET_BYTES
    zero1 = TrainingSetup.trainer(zero_stage=1, precision="fp32")
    assert context(TIED, zero1).costs.group_bucket_bytes(2) == (
        2 * TRAINER_BUCKET_ELEMENTS * FP32_BYTES
    )
    half = TrainingSetup.trainer(zero_stage=1, precision="bf16", half_parameters=True)
    assert context(TIED, half).costs.group_bucket_bytes(1) == TRAINER_BUCKET_ELEMENTS * 2


def test_100_mib_of_gradients_are_four_collectives_each_paying_its_latency() -> None:
    group = [Endpoint("a", GPU, "us-central1-a"), Endpoint("b", GPU, "us-central1-b")]
    trainer = context(TIED).costs
    four = trainer.allreduce_seconds(4 * REPLICATED_BUCKET_BYTES, group)
    one = trainer.allreduce_seconds(REPLICATED_BUCKET_BYTES, group)
    assert four == pytest.approx(4 * one, rel=1e-12)
    # the default setup's single 500 MB bucket sends it as one message: at least the
    # three extra collectives' latencies less
    single = context(TIED, TrainingSetup()).costs
    as_one = single.allreduce_seconds(4 * REPLICATED_BUCKET_BYTES, group)
    assert four - as_one >= 3 * NCCL_BASE_LATENCY_S


def test_deepspeed_rings_each_tp_rank_s_shard_without_gather_or_broadcast() -> None:
    deepspeed = PlanningContext(
        model=TIED,
        cluster=CLUSTER,
        profiles=PROFILES,
        training=TRAINER,
        constants=dataclasses.replace(DEFAULT_CONSTANTS, partitioned_p2p=True),
    ).costs
    ring = 2 * deepspeed.p2p_seconds(FULL_GRADIENT / 2, A, B, 2, flows=2) + NCCL_BASE_LATENCY_S
    assert deepspeed.shared_gradient_seconds("tokens", [(A, 2), (B, 2)]) == pytest.approx(
        ring, rel=1e-9
    )
    trainer = context(TIED).costs.shared_gradient_seconds("tokens", [(A, 2), (B, 2)])
    assert trainer > deepspeed.shared_gradient_seconds("tokens", [(A, 2), (B, 2)])


def test_the_first_to_last_zone_link_is_listed_among_the_links_the_prediction_crossed() -> None:
    # A -> B -> EU: no pipeline boundary joins A and EU, the tied ring does
    layers = UNTIED.num_layers
    three = plan(TIED, (0, 2, (A,)), (2, 4, (B,)), (4, layers, (EU,)))
    pairs = {(a.zone, b.zone) for a, b, _ in zone_links(three, context(TIED))}
    assert ("europe-west4-a", "us-central1-a") in pairs
    untied = plan(UNTIED, (0, 2, (A,)), (2, 4, (B,)), (4, layers, (EU,)))
    untied_pairs = {(a.zone, b.zone) for a, b, _ in zone_links(untied, context(UNTIED))}
    assert ("europe-west4-a", "us-central1-a") not in untied_pairs
