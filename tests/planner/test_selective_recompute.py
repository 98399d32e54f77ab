"""Selective activation recomputation (Stage.recompute = "selective"): memory, time, choice.

Memory against Korthikanti et al. 2022 by hand: a GPT-shaped block keeps
sbh(10 + 24/t + 5as/(ht)) bytes (Sec. 4.2.1) and sbh(10 + 24/t) under selective
recomputation (Table 2); the backward holds one block's attention core (5as^2b/t) again.
Time against the block's FLOPs by hand (Narayanan et al. 2021: 24bsh^2 + 4bs^2h per GPT
block, of which 4bs^2h are QK^T and attention over V). The search: a long-sequence model
on one GPU without the optimizer offload (SGD) fits only with recomputation, and takes
selective over full because it repeats less of the forward.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sailplan.planner.api import Infeasible, Planned, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance
from sailplan.planner.simulator import PlanningContext, SimulatorConstants, simulate

S, H, A, TP = 2048, 1024, 16, 2
GPT = ModelSpec(
    name="gpt", hidden_size=H, num_blocks=4, num_heads=A, vocab_size=1000, sequence_length=S
)  # 6 layers: embedding, 4 blocks, head
FORWARD_S = 1e-3
POOL = Pool(name="a", gpu_type="A100-80", zone="us-central1-a", nodes=1, gpus_per_node=8)
REPLICA = Replica(pool="a", gpu_type="A100-80", zone="us-central1-a")


def _context(constants: SimulatorConstants | None = None) -> PlanningContext:
    n = GPT.num_layers
    profile = ComputeProfile(
        model=GPT.name,
        gpu_type="A100-80",
        tensor_parallel=TP,
        micro_batch_size=1,
        forward_s=(FORWARD_S,) * n,
        backward_s=(2 * FORWARD_S,) * n,
        update_s=(1e-4,) * n,
        provenance=Provenance(source="measured", tool="test"),
    )
    return PlanningContext(
        model=GPT,
        cluster=ClusterSnapshot(pools=(POOL,)),
        profiles=ProfileSet(compute=(profile,)),
        # a runtime that stores the attention scores (Sailplan's trainer does not: there
        # selective frees nothing, test_flash_attention_leaves_selective_nothing_to_free)
        constants=constants or SimulatorConstants(flash_attention=False),
    )


def _plan(first: str, micro: int = 4) -> Plan:
    return Plan(
        model=GPT,
        global_batch_size=micro,
        micro_batch_size=1,
        num_micro_batches=micro,
        stages=(
            Stage(
                layer_start=0,
                layer_end=3,
                tensor_parallel=TP,
                replicas=(REPLICA,),
                recompute=first,  # type: ignore[arg-type]
            ),
            Stage(layer_start=3, layer_end=6, tensor_parallel=TP, replicas=(REPLICA,)),
        ),
    )


def test_selective_keeps_korthikanti_table_2_per_block() -> None:
    context = _context()
    table = context.costs.require_table("A100-80", TP, 1)
    scale = context.training.activation_scale
    b = 1
    # block 1: everything but the attention core, and the core itself, by hand
    kept = table.activation_bytes(1, 2) - table.attention_core_bytes(1, 2)
    assert kept == pytest.approx(scale * S * b * H * (10 + 24 / TP))
    assert table.attention_core_bytes(1, 2) == pytest.approx(scale * 5 * A * S * S * b / TP)
    # the embedding and the head have no attention core
    assert table.attention_core_bytes(0, 1) == 0
    assert table.attention_core_bytes(5, 6) == 0


def test_selective_memory_lies_between_none_and_full() -> None:
    context = _context()
    none, selective, full = (simulate(_plan(r), context) for r in ("none", "selective", "full"))
    scale = context.training.activation_scale
    factor = context.constants.activation_allocator_factor
    core = scale * 5 * A * S * S / TP
    # stage 0 of 2 holds 2 micro-batches in flight; its blocks 1 and 2 drop their cores,
    # and the backward holds one core again
    in_flight = 2
    saved = (in_flight * 2 * core - core) * factor
    peak = [p.stages[0].peak_memory_bytes for p in (none, selective, full)]
    assert peak[0] - peak[1] == pytest.approx(saved, rel=1e-9)
    assert peak[2] < peak[1] < peak[0]
    # the other stage is unchanged
    assert selective.stages[1].peak_memory_bytes == none.stages[1].peak_memory_bytes


def test_selective_time_is_the_attention_cores_forward_share() -> None:
    context = _context()
    none, selective, full = (simulate(_plan(r), context) for r in ("none", "selective", "full"))
    # each GPT block: 24bsh^2 + 4bs^2h forward FLOPs, the core 4bs^2h: share s / (6h + s)
    share = S / (6 * H + S)
    extra = selective.stages[0].forward_backward_seconds - none.stages[0].forward_backward_seconds
    assert extra == pytest.approx(2 * FORWARD_S * share)  # blocks 1 and 2; the embedding none
    assert full.stages[0].forward_backward_seconds == pytest.approx(
        none.stages[0].forward_backward_seconds + 3 * FORWARD_S
    )
    assert none.iteration_seconds < selective.iteration_seconds < full.iteration_seconds


def test_flash_attention_leaves_selective_nothing_to_free() -> None:
    context = _context(SimulatorConstants(flash_attention=True))
    none, selective = (simulate(_plan(r), context) for r in ("none", "selective"))
    assert selective.stages[0].peak_memory_bytes == none.stages[0].peak_memory_bytes


def test_a_convnet_stage_cannot_take_selective() -> None:
    resnet = default_catalog().model("WideResNet-50-2")
    with pytest.raises(ValidationError, match="selective recomputation recomputes attention"):
        Plan(
            model=resnet,
            global_batch_size=1,
            micro_batch_size=1,
            num_micro_batches=1,
            stages=(
                Stage(
                    layer_start=0,
                    layer_end=resnet.num_layers,
                    replicas=(REPLICA,),
                    recompute="selective",
                ),
            ),
        )


# 8 blocks at s = 8192: each block's attention core keeps 5 x 16 x 8192^2 bytes (5.4 GB),
# 43 GB for the 8, more than an A100-40 holds; the rest of a block keeps 34sbh (0.29 GB).
LONG = ModelSpec(
    name="long-context",
    family="opt",
    hidden_size=1024,
    num_blocks=8,
    num_heads=16,
    vocab_size=32000,
    sequence_length=8192,
)


LONG_PROFILES = ProfileSet(
    compute=(
        ComputeProfile(
            model=LONG.name,
            gpu_type="A100-40",
            tensor_parallel=1,
            micro_batch_size=1,
            forward_s=(FORWARD_S,) * LONG.num_layers,
            backward_s=(2 * FORWARD_S,) * LONG.num_layers,
            update_s=(1e-4,) * LONG.num_layers,
            provenance=Provenance(source="measured", tool="test"),
        ),
    )
)


def _one_gpu(memory_options: bool) -> PlanRequest:
    return PlanRequest(
        model=LONG,
        global_batch_size=1,
        # SGD: DeepSpeed's offload runs CPU Adam only, so recomputation is all that is left
        optimizer="sgd",
        cluster=ClusterSnapshot(
            pools=(
                Pool(
                    name="a100", gpu_type="A100-40", zone="us-central1-a", nodes=1, gpus_per_node=1
                ),
            )
        ),
        micro_batch_sizes=(1,),
        top_k=1,
        memory_options=memory_options,
        runtime="megatron-deepspeed",  # stores the scores that selective recomputation frees
    )


def test_the_search_takes_selective_where_it_fits_and_full_is_slower() -> None:
    # Sailplan's trainer never stores the scores: the same request plans without recomputing
    trainer = make_plan(
        _one_gpu(memory_options=True).model_copy(update={"runtime": "sailplan"}),
        measured=LONG_PROFILES,
    )
    assert isinstance(trainer, Planned), trainer
    assert [s.recompute for s in trainer.best.stages] == ["none"]
    without = make_plan(_one_gpu(memory_options=False), measured=LONG_PROFILES)
    assert isinstance(without, Infeasible) and without.code == "OutOfMemory"
    request = _one_gpu(memory_options=True)
    result = make_plan(request, measured=LONG_PROFILES)
    assert isinstance(result, Planned), result
    best = result.best
    assert [s.recompute for s in best.stages] == ["selective"]
    assert "recomputes its attention cores (selective)" in best.reason
    assert best.predictions is not None
    capacity = default_catalog().gpu("A100-40").memory_bytes
    assert best.predictions.stages[0].peak_memory_bytes <= capacity
    # the same plan: without recomputation it does not fit; with full it fits, slower
    context = PlanningContext(
        model=LONG,
        cluster=request.cluster,
        profiles=LONG_PROFILES,
        optimizer="sgd",
        training=request.training_setup(),
        constants=request.constants(),
    )
    stage = best.stages[0]
    none, full = (
        simulate(
            best.model_copy(update={"stages": (stage.model_copy(update={"recompute": r}),)}),
            context,
        )
        for r in ("none", "full")
    )
    assert none.stages[0].peak_memory_bytes > capacity
    assert full.stages[0].peak_memory_bytes <= capacity
    assert full.iteration_seconds > best.predictions.iteration_seconds
