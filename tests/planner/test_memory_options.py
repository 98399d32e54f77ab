"""Memory options per stage: the Plan fields, simulate()'s prices and the search's choice.

simulate() on the synthetic profiles of test_simulator.py (every layer 1 ms forward, 2 ms
backward, 0.1 ms update), where the options' time can be computed by hand: full
recomputation adds each layer's forward to the backward; offload replaces the GPU update
with the fp32 gradient partition down and the parameters up over the GPU's host link and
CPU Adam over the partition. Memory: recomputation keeps the layers' outputs instead of
their activations, offload moves the master weights and moments to the host.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from test_simulator import CLUSTER, MODEL, PROFILES, A

from sailplan.planner.api import Infeasible, Planned, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog, load_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Stage
from sailplan.planner.simulator import PlanningContext, SimulatorConstants, simulate
from sailplan.planner.simulator.memory import FP32_BYTES, TrainingSetup

CONSTANTS = SimulatorConstants()
TRAINER = TrainingSetup.trainer(zero_stage=1)


def _context(training: TrainingSetup = TRAINER) -> PlanningContext:
    return PlanningContext(
        model=MODEL, cluster=CLUSTER, profiles=PROFILES, constants=CONSTANTS, training=training
    )


def _plan(recompute: str = "none", offload: bool = False, micro: int = 4) -> Plan:
    return Plan(
        model=MODEL,
        global_batch_size=micro,
        micro_batch_size=1,
        num_micro_batches=micro,
        stages=(
            Stage(layer_start=0, layer_end=3, replicas=(A,)),
            Stage(
                layer_start=3,
                layer_end=6,
                replicas=(A,),
                recompute=recompute,  # type: ignore[arg-type]
                optimizer_offload=offload,
            ),
        ),
    )


def test_full_recomputation_adds_a_forward_to_the_stage_and_keeps_only_layer_outputs() -> None:
    context = _context()
    plain, recomputed = simulate(_plan(), context), simulate(_plan("full"), context)
    # stage 1: 3 layers x (1 ms forward + 1 ms forward again + 2 ms backward)
    assert recomputed.stages[1].forward_backward_seconds == pytest.approx(3 * 4e-3)
    assert recomputed.stages[0].forward_backward_seconds == pytest.approx(3 * 3e-3)
    assert recomputed.iteration_seconds > plain.iteration_seconds
    costs = context.costs
    table = costs.require_table("A100-40", 1, 1)
    # kept per micro-batch: the received input and the outputs of layers 3 and 4 (the
    # head's output is the loss), each 32 tokens x 64 hidden in fp32; plus one layer's
    # activations while the backward recomputes it (the largest: the head's logits)
    hidden = 32 * 64 * FP32_BYTES
    assert table.recompute_kept_bytes(3, 6) == 2 * hidden
    in_flight = 1  # the last stage of two holds one micro-batch
    largest = max(table.activations[i + 1] - table.activations[i] for i in range(3, 6))
    saved = (table.activation_bytes(3, 6) - 2 * hidden - largest) * in_flight
    factor = CONSTANTS.activation_allocator_factor
    assert plain.stages[1].peak_memory_bytes - recomputed.stages[1].peak_memory_bytes == (
        pytest.approx(saved * factor, abs=2)
    )


def test_offload_replaces_the_gpu_update_with_pcie_copies_and_cpu_adam() -> None:
    context = _context()
    plain, offloaded = simulate(_plan(), context), simulate(_plan(offload=True), context)
    params = sum(MODEL.layer_parameters(i, 1) for i in range(3, 6))
    link = default_catalog().gpu("A100-40").host_link_bytes_per_s
    assert link is not None
    # fp32 gradients down, fp32 parameters up, Adam at the measured CPU rate (one replica)
    expected = 8 * params / link + params / CONSTANTS.cpu_adam_params_per_s
    assert offloaded.update_seconds == pytest.approx(max(expected, 3e-4))
    # the GPU no longer holds the moments nor DeepSpeed's fp32 partition
    states = context.costs.model_states(params, 1, 1)
    moved = context.costs.model_states(params, 1, 1, offload=True)
    assert moved.master_weights == moved.optimizer_states == 0
    assert plain.stages[1].peak_memory_bytes - offloaded.stages[1].peak_memory_bytes == (
        pytest.approx(states.total - moved.total, abs=2)
    )
    # host: fp32 master, its gradient, 8 B of moments, the copy-back buffer, a staged tensor
    assert offloaded.stages[1].host_memory_bytes == int(moved.host)
    assert moved.host >= 20 * params
    assert offloaded.stages[0].host_memory_bytes == 0


def test_plan_fields_validate_and_round_trip() -> None:
    plan = _plan("full", offload=True)
    assert Plan.from_json(plan.to_json()) == plan
    # plans written before the options parse as "no options"
    legacy = (
        plan.to_json()
        .replace('"recompute": "full",', "")
        .replace('"optimizer_offload": true', '"optimizer_offload": false')
    )
    assert Plan.from_json(legacy).stages[1].recompute == "none"
    with pytest.raises(ValidationError, match="recompute"):
        _plan("partial")
    with pytest.raises(ValidationError, match="optimizer_offload runs DeepSpeed's CPU Adam"):
        Plan.model_validate({**_plan(offload=True).model_dump(), "optimizer": "sgd"})


def _v100_request(memory_options: bool) -> PlanRequest:
    catalog = default_catalog()
    return PlanRequest(
        model=catalog.model("LLaMA-3-8B"),
        global_batch_size=32,
        cluster=ClusterSnapshot(
            pools=(
                Pool(
                    name="v100", gpu_type="V100-16", zone="us-central1-a", nodes=1, gpus_per_node=8
                ),
            )
        ),
        top_k=1,
        memory_options=memory_options,
    )


def test_options_make_a_v100_plan_feasible_and_say_why() -> None:
    without = make_plan(_v100_request(memory_options=False))
    assert isinstance(without, Infeasible) and without.code == "OutOfMemory"
    result = make_plan(_v100_request(memory_options=True))
    assert isinstance(result, Planned)
    best = result.best
    assert best.predictions is not None
    assert any(s.recompute == "full" or s.optimizer_offload for s in best.stages)
    for stage, predicted in zip(best.stages, best.predictions.stages, strict=True):
        assert predicted.peak_memory_bytes <= 16 * 2**30
        if stage.optimizer_offload:
            assert predicted.host_memory_bytes > 0
    assert "on V100-16" in best.reason and "GiB without" in best.reason
    # deterministic
    again = make_plan(_v100_request(memory_options=True))
    assert isinstance(again, Planned)
    assert again.best.model_copy(update={"reason": ""}) == best.model_copy(update={"reason": ""})


def test_a_roomy_cluster_gets_no_options() -> None:
    catalog = default_catalog()
    request = PlanRequest(
        model=catalog.model("OPT-350M"),
        global_batch_size=64,
        cluster=ClusterSnapshot(
            pools=(Pool(name="a100", gpu_type="A100-40", zone="us-central1-a", nodes=2),)
        ),
        top_k=3,
    )
    result = make_plan(request)
    assert isinstance(result, Planned)
    for plan in (result.best, *result.alternatives):
        assert all(s.recompute == "none" and not s.optimizer_offload for s in plan.stages)


# A model whose embedding and head hold 3.2e9 parameters per GPU at TP 2: 16 bytes each
# (DEFAULT_TRAINING's half parameters and fp32 Adam) do not fit an L4's 24 GB, offload
# keeps 2 + 2 bytes and the largest tensor staged on the GPU (about 18 GiB) and puts
# (4 + 8 + 4 + 2) bytes and the staging buffer in host memory: about 60 GiB per GPU. Two
# nodes of 2 GPUs give embedding and head a TP-2 stage each.
WIDE_VOCABULARY = ModelSpec(
    name="wide-vocabulary",
    family="opt",
    hidden_size=4096,
    num_blocks=2,
    num_heads=32,
    vocab_size=1_562_500,
    sequence_length=64,
)


def _l4_request(gpus_per_node: int) -> PlanRequest:
    pool = Pool(
        name="l4", gpu_type="L4", zone="us-central1-a", nodes=2, gpus_per_node=gpus_per_node
    )
    return PlanRequest(
        model=WIDE_VOCABULARY,
        # one sample: no data parallelism, whose ZeRO partition would halve the host share
        global_batch_size=1,
        cluster=ClusterSnapshot(pools=(pool,)),
        top_k=1,
        memory_options=True,
    )


def test_offload_beyond_the_nodes_host_memory_is_refused_with_the_reason() -> None:
    catalog = default_catalog()
    # g2-standard-24: 2 L4 and 96 GB, 48 GiB per GPU (catalog host_memory_gib_by_gpus)
    assert catalog.gpu("L4").host_memory_gib_per_gpu_of(2) == 48
    refused = make_plan(_l4_request(gpus_per_node=2))
    assert isinstance(refused, Infeasible), refused
    assert refused.code == "OutOfMemory"
    assert "optimizer offload would fit it on the GPU but needs" in refused.reason
    assert "the nodes have 48.0 GiB" in refused.reason
    # the same nodes with more host memory per GPU take the offload plan
    roomy = load_catalog({"gpus": {"L4": {"host_memory_gib_per_gpu": 96}}})
    planned = make_plan(_l4_request(gpus_per_node=2), catalog=roomy)
    assert isinstance(planned, Planned), planned
    assert planned.best.predictions is not None
    offloaded = [
        predicted.host_memory_bytes
        for stage, predicted in zip(
            planned.best.stages, planned.best.predictions.stages, strict=True
        )
        if stage.optimizer_offload
    ]
    # what the refusal was about: more than the 48 GiB, within the 96
    assert offloaded and 48 * 2**30 < max(offloaded) <= 96 * 2**30


def test_host_memory_per_gpu_follows_the_pools_machine_shape() -> None:
    catalog = default_catalog()
    l4, v100, h100 = catalog.gpu("L4"), catalog.gpu("V100-16"), catalog.gpu("H100-80")
    assert l4.host_memory_gib_per_gpu_of(1) == 128  # g2-standard-32
    assert l4.host_memory_gib_per_gpu_of(8) == 48  # g2-standard-96
    assert v100.host_memory_gib_per_gpu_of(4) == 78  # N1 with 4 V100: 312 GB at most
    assert h100.host_memory_gib_per_gpu_of(8) == 234  # a3-highgpu-8g
    # a GPU count without a documented shape: the least per GPU of those documented
    assert l4.host_memory_gib_per_gpu_of(3) == 48
    # every GKE GPU type of the catalog now says its nodes' host memory
    for name in ("V100-16", "A100-40", "A100-80", "H100-80", "H200-141", "L4", "T4"):
        assert catalog.gpu(name).host_memory_gib_by_gpus, name
