"""Peak memory of a known plan computed by hand, term by term, against the simulator.

The plan is Sailor's consumer-cluster run `mit/N2_D1`: OPT-350M in two stages of
layers [0, 12) and [12, 26), TP 2 each, one replica, micro-batch 2, 128 micro-batches,
trained as the Sailor runs were (fp32 weights and gradients, Adam: 16 bytes per
parameter, benchmarks/simulator_accuracy.py SAILOR_TRAINING). Every expected number below
is written from the sources, not from the code under test:

- parameters per TP rank (Megatron's sharding): a block holds 12h^2/t + 7h/t + 6h (QKV
  and MLP up-projection column-parallel with their biases, attention output and MLP
  down-projection row-parallel with replicated biases, two norms); the embedding V h / t
  tokens plus s h learned positions; the last stage the final norm and the untied output
  projection (DeepSpeed's pipeline keeps its own copy of the word embedding there). The
  Sailor artifact's llm_info.json records 6,301,184 for a TP-2 block, which the formula
  gives exactly;
- activations per micro-batch (Korthikanti et al. 2022, Sec. 4.1, 16-bit, scores
  stored): s b h (10 + 24/t) + 5 a s^2 b / t per block, the embedding's 1-byte dropout
  mask s b h, the head's norm input and output (4 s b h) plus logits and their fp32
  softmax (6 s b V / t); a stage after the first also keeps its received input (the fp32
  boundary, 4 s b h);
- 1F1B keeps min(P - s, M) micro-batches in flight on stage s.
"""

from __future__ import annotations

import dataclasses

import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator import DEFAULT_CONSTANTS, PlanningContext
from sailplan.planner.simulator.costs import StageTable
from sailplan.planner.simulator.memory import FP32_BYTES, TrainingSetup

H, HEADS, S, V = 1024, 16, 2048, 50272  # OPT-350M (OPT paper, Table 1; vocabulary 50272)
MBS, MICRO_BATCHES = 2, 128
SAILOR_TRAINING = TrainingSetup(parameter_bytes=FP32_BYTES, boundary_element_bytes=FP32_BYTES)


def block_parameters(t: int) -> int:
    return 12 * H * H // t + 7 * H // t + 6 * H


def block_activation_bytes(t: int, b: int = MBS) -> float:
    return S * b * H * (10 + 24 / t) + 5 * HEADS * S * S * b / t


def context(gpu: str = "RTX-3090", training: TrainingSetup = SAILOR_TRAINING) -> PlanningContext:
    catalog = default_catalog()
    model = catalog.model("OPT-350M")
    profiles = complete_profiles(
        model, [gpu], [1, 2, 4], [MBS], measured=ProfileSet(), catalog=catalog
    )
    pool = Pool(name="p", gpu_type=gpu, zone="us-central1-a", gpus_per_node=2, nodes=2)
    return PlanningContext(
        model=model,
        cluster=ClusterSnapshot(pools=[pool]),
        profiles=profiles,
        # the count above stores the attention scores (5as^2b/t), as the Sailor runs did
        constants=dataclasses.replace(DEFAULT_CONSTANTS, flash_attention=False),
        training=training,
    )


def table(ctx: PlanningContext, tp: int = 2) -> StageTable:
    return ctx.costs.require_table(ctx.cluster.pools[0].gpu_type, tp, MBS)


def peak(ctx: PlanningContext, a: int, b: int, stage: int, tp: int = 2) -> float:
    return ctx.costs.stage_memory_bytes(
        table(ctx, tp), a, b, stage=stage, num_stages=2, num_micro_batches=MICRO_BATCHES
    )


def test_the_parameters_per_rank_are_megatrons_sharding() -> None:
    t = table(context())
    assert block_parameters(2) == 6_301_184  # llm_info.json, OPT-350, TP 2, any block
    assert t.parameters(0, 12) == V * H // 2 + S * H + 11 * block_parameters(2)
    assert t.parameters(12, 26) == 13 * block_parameters(2) + 2 * H + V * H // 2


def test_the_first_stage_peaks_at_states_plus_two_micro_batches_plus_overhead() -> None:
    ctx = context()
    c = ctx.constants
    parameters = V * H // 2 + S * H + 11 * block_parameters(2)
    states = (4 + 4 + 8) * parameters  # fp32 weights, fp32 gradients, Adam's two moments
    per_micro_batch = S * MBS * H + 11 * block_activation_bytes(2)
    expected = states + 2 * per_micro_batch * c.activation_allocator_factor
    expected += c.framework_overhead_bytes
    assert peak(ctx, 0, 12, stage=0) == pytest.approx(expected, rel=1e-9)
    # the by-hand figures the docs quote (docs/benchmarks.md, held-out runs)
    assert states == pytest.approx(1.55e9, abs=0.01e9)
    assert per_micro_batch == pytest.approx(4.71e9, abs=0.01e9)


def test_the_last_stage_keeps_one_micro_batch_with_its_received_input() -> None:
    ctx = context()
    c = ctx.constants
    parameters = 13 * block_parameters(2) + 2 * H + V * H // 2
    head = 4 * S * MBS * H + 6 * S * MBS * V / 2
    boundary = FP32_BYTES * S * MBS * H
    per_micro_batch = 13 * block_activation_bytes(2) + head + boundary
    expected = 16 * parameters + per_micro_batch * c.activation_allocator_factor
    expected += c.framework_overhead_bytes
    assert peak(ctx, 12, 26, stage=1) == pytest.approx(expected, rel=1e-9)


def test_tensor_parallelism_divides_weights_and_split_activations_only() -> None:
    ctx = context()
    two, four = table(ctx, 2), table(ctx, 4)
    # a block's weights halve from TP 2 to 4 except the replicated biases and norms (6h)
    assert two.parameters(1, 2) - 6 * H == pytest.approx(2 * (four.parameters(1, 2) - 6 * H))
    # a block's activations: 10 s b h stay replicated, the rest halves
    replicated = 10 * S * MBS * H
    assert two.activation_bytes(1, 2) - replicated == pytest.approx(
        2 * (four.activation_bytes(1, 2) - replicated)
    )
