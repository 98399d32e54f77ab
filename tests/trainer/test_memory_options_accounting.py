"""The simulator's memory for a recomputed stage and an offloaded stage against the trainer's.

Offload: two gloo processes build the trainer's stage with `make_optimizer(offload=True)`
(DeepSpeed ZeRO with offload_optimizer on the CPU, CPU Adam) at ZeRO-1 and ZeRO-2 and train
two steps of two micro-batches. Each rank then reports the bytes of the tensors DeepSpeed
holds, by attribute: the flat weights (the GPU's), and what offload puts in host memory
(DeepSpeed allocates it on `device = "cpu"` whatever the accelerator): the fp32 master
partition, its gradient, the Adam moments, the copy-back buffer and the host staging
buffer; and at ZeRO-1 the gradients a GPU holds before the step (the parameters' .grad and
the device staging buffer). Those must equal simulator/memory.py's terms up to DeepSpeed's
alignment padding (2 x DP elements per flat buffer), and the terms it moves to the host
must be zero on the GPU.

Recomputation: the stage [1, 4) of a 4-layer model (two blocks and the head, receiving its
input) runs one forward with and without `StageModel.recompute`, and every storage the
forward's operations created that is still alive afterwards (the autograd graph's saved
tensors, checkpoint's inputs, the output; parameters excluded) is summed through storage
weak references: the activations a micro-batch keeps for its backward, measured. With
recomputation they must be within 10% of the simulator's (CostModel.stage_memory_bytes's
kept term, fp32 as the trainer computes), and far below the measured bytes without. Its
model states (one replica, torch Adam) must equal the simulator's terms exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kept_storage import kept_after
from rank_memory import (
    BUCKET_ELEMENTS,
    MICRO_BATCH_SIZE,
    PADDING_ELEMENTS,
    REPLICAS,
    SPEC,
    join,
    leave,
    spawn,
    stage,
    tensor_bytes,
    train,
    write_report,
)

from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance
from sailplan.planner.simulator import PlanningContext, SimulatorConstants
from sailplan.planner.simulator.memory import TrainingSetup, model_state_bytes

# The offloaded optimizer steps in DeepSpeedCPUAdam (built before the first test).
pytestmark = [pytest.mark.trainer, pytest.mark.cpu_adam]

FP32 = 4
PADDING = FP32 * PADDING_ELEMENTS
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _offload_replica(rank: int, port: int, zero_stage: int, dtype: str, out: Path) -> None:

    join(rank, port)
    try:
        model, params, optimizer = stage(
            SPEC, (0, SPEC.num_layers), zero_stage=zero_stage, dtype=DTYPES[dtype], offload=True
        )
        inner = getattr(optimizer, "inner")  # noqa: B009 (DeepSpeedZeroOptimizer)
        grads_before_step = [0, 0]

        def before_step() -> None:
            grads_before_step[0] = tensor_bytes([p.grad for p in params if p.grad is not None])
            # ZeRO-2 over 16-bit parameters: the share accumulates in a flat fp32 partition
            # gradient on the device
            flat = [getattr(g, "flat_partition", None) for g in inner.averaged_gradients.values()]
            grads_before_step[1] = tensor_bytes([t for t in flat if t is not None])

        train(model, optimizer, rank, before_step=before_step)
        fp32 = inner.single_partition_of_fp32_groups
        write_report(
            out,
            rank,
            {
                "optimizer_on": str(inner.device),
                "cpu_adam": type(inner.optimizer).__name__,
                "parameters": sum(p.numel() for p in params),
                "largest_tensor": max(p.numel() for p in params),
                "weights": tensor_bytes(inner.bit16_groups_flat),
                "master_weights": tensor_bytes([t.detach() for t in fp32]),
                "master_gradient": tensor_bytes([t.grad for t in fp32]),
                "optimizer_states": tensor_bytes(list(inner.optimizer.state.values())),
                "copy_back": tensor_bytes(inner.param_buffer_of_bit16_for_cpu_offload_groups),
                "host_staging": tensor_bytes(inner.temp_grad_buffer_for_cpu_offload),
                "device_staging": tensor_bytes(inner.temp_grad_buffer_for_gpu_offload),
                # ZeRO-2 with more than one micro-batch: each partition parameter's
                # gradient accumulated on the host between micro-batches
                "host_accumulation": tensor_bytes(list(inner.accumulated_grads_in_cpu.values())),
                "grads_before_step": grads_before_step[0],
                "device_partition": grads_before_step[1],
            },
        )
    finally:
        leave()


@pytest.mark.parametrize(
    ("zero_stage", "dtype"),
    [
        (1, "fp32"),
        (2, "fp32"),
        # 16-bit parameters (Plan.half_parameters): DeepSpeed's bf16 mode with the fp32
        # master partition and the moments on the host
        (1, "bf16"),
        (2, "bf16"),
    ],
)
def test_offloaded_stage_terms_match_what_deepspeed_holds(
    zero_stage: int, dtype: str, tmp_path: Path
) -> None:
    reports = spawn(_offload_replica, tmp_path, zero_stage, dtype)
    first = reports[0]
    setup = TrainingSetup.trainer(
        zero_stage=1 if zero_stage == 1 else 2,
        precision=dtype,  # type: ignore[arg-type]
        bucket_elements=BUCKET_ELEMENTS,
        half_parameters=dtype != "fp32",
    )
    predicted = model_state_bytes(
        first["parameters"],
        REPLICAS,
        setup,
        "adam",
        largest_tensor=first["largest_tensor"],
        offload=True,
    )
    w = DTYPES[dtype].itemsize
    p, d, largest = first["parameters"], REPLICAS, w * first["largest_tensor"]
    # nothing of the optimizer on the GPU
    assert predicted.master_weights == predicted.optimizer_states == 0
    for report in reports:
        # DeepSpeed put the optimizer on the host and updates with its CPU Adam
        assert (report["optimizer_on"], report["cpu_adam"]) == ("cpu", "DeepSpeedCPUAdam")
        assert abs(report["weights"] - w * p) <= PADDING
        assert abs(report["weights"] - predicted.weights) <= PADDING
        host = (
            report["master_weights"]
            + report["master_gradient"]
            + report["optimizer_states"]
            + report["copy_back"]
            + report["host_staging"]
            + report["host_accumulation"]
        )
        # the host terms one by one: 4P/D fp32 master and 4P/D its gradient, 8P/D moments
        # whatever the parameters' dtype; wP/D copy-back and the largest tensor staged in
        # the parameters' dtype; then their sum
        assert abs(report["master_weights"] - FP32 * p / d) <= PADDING
        assert abs(report["master_gradient"] - FP32 * p / d) <= PADDING
        assert abs(report["optimizer_states"] - 2 * FP32 * p / d) <= 2 * PADDING
        assert abs(report["copy_back"] - w * p / d) <= PADDING
        assert report["host_staging"] == largest
        # ZeRO-2 accumulates the share across micro-batches: fp32 parameters on the host
        # (whole tensors, so up to the two straddling the partition's ends more), 16-bit
        # ones in an fp32 partition on the device
        if zero_stage == 2 and dtype == "fp32":
            assert 0 <= report["host_accumulation"] - w * p / d <= 2 * largest + PADDING
        else:
            assert report["host_accumulation"] == 0
        if zero_stage == 2 and dtype != "fp32":
            assert abs(report["device_partition"] - FP32 * p / d) <= PADDING
        else:
            assert report["device_partition"] == 0
        # ZeRO-2: the host accumulation holds the tensors straddling the partition's ends
        # whole (memory.py does not count them)
        straddling = 2 * largest if zero_stage == 2 and dtype == "fp32" else 0
        assert 0 <= host - predicted.host + 5 * PADDING <= 10 * PADDING + straddling
        assert report["device_staging"] == largest
        if zero_stage == 1:
            # the GPU's gradients before the step: every parameter's, plus the staging buffer
            assert report["grads_before_step"] + report["device_staging"] == predicted.gradients
        else:
            # what the GPU holds at the step (the gradients still waiting are reduced by
            # then) stays within the predicted peak, which adds the bucket's wait
            at_step = report["grads_before_step"] + report["device_staging"]
            assert at_step + report["device_partition"] <= predicted.gradients + PADDING


def _kept_bytes(recompute: bool) -> tuple[int, dict[str, int]]:
    """Activation bytes one micro-batch of stage [1, 4) keeps after its forward, with its
    received input; and the stage's model-state bytes after a step (one replica)."""
    from sailplan.trainer.model import StageModel
    from sailplan.trainer.optimizer import make_optimizer
    from sailplan.trainer.tp import TPGroup

    model = StageModel(SPEC, 1, SPEC.num_layers, TPGroup(rank=0, size=1, group=None))
    model.initialise(seed=1)
    model.recompute = recompute
    params = list(model.parameters())
    optimizer = make_optimizer(
        params,
        kind="adam",
        lr=1e-3,
        zero_stage=1,
        dp_group=None,
        dp_size=1,
        tp_group=None,
        num_micro_batches=1,
    )
    received = torch.randn(
        MICRO_BATCH_SIZE, SPEC.sequence_length, SPEC.hidden_size, requires_grad=True
    )
    targets = torch.randint(0, SPEC.vocab_size, (MICRO_BATCH_SIZE, SPEC.sequence_length))
    loss, kept = kept_after(lambda: model((received,), {"targets": targets}), params)
    assert isinstance(loss, torch.Tensor)
    loss.backward()  # type: ignore[no-untyped-call]
    states = {
        "weights": tensor_bytes(params),
        "gradients": tensor_bytes([p.grad for p in params]),
    }
    optimizer.step()
    states["optimizer_states"] = optimizer.state_bytes()
    return kept + received.numel() * FP32, states


def _context() -> PlanningContext:
    n = SPEC.num_layers
    profile = ComputeProfile(
        model=SPEC.name,
        gpu_type="A100-40",
        tensor_parallel=1,
        micro_batch_size=MICRO_BATCH_SIZE,
        forward_s=(1e-3,) * n,
        backward_s=(2e-3,) * n,
        update_s=(1e-4,) * n,
        provenance=Provenance(source="measured", tool="test"),
    )
    return PlanningContext(
        model=SPEC,
        cluster=ClusterSnapshot(
            pools=(Pool(name="a", gpu_type="A100-40", zone="us-central1-a", nodes=1),)
        ),
        profiles=ProfileSet(compute=(profile,)),
        catalog=default_catalog(),
        constants=SimulatorConstants(framework_overhead_bytes=0.0, activation_allocator_factor=1.0),
        training=TrainingSetup.trainer(zero_stage=1),
    )


def test_recomputed_stage_keeps_what_the_simulator_predicts() -> None:
    costs = _context().costs
    table = costs.require_table("A100-40", 1, MICRO_BATCH_SIZE)
    a, b = 1, SPEC.num_layers
    # the kept term of CostModel.stage_memory_bytes: the layers' outputs and the input
    predicted = table.recompute_kept_bytes(a, b) + costs.boundary_bytes(MICRO_BATCH_SIZE, a)
    with_recompute, states = _kept_bytes(recompute=True)
    without, _ = _kept_bytes(recompute=False)
    assert abs(with_recompute - predicted) <= 0.1 * predicted
    # the premise: recomputation keeps far less than the plain forward
    assert with_recompute < without / 5
    # model states of the stage (one replica, torch Adam, fp32): exactly the simulator's
    terms = costs.model_states(table.parameters(a, b), 1, 1)
    assert states["weights"] == terms.weights
    assert states["gradients"] == terms.gradients
    assert states["optimizer_states"] == terms.optimizer_states
    assert terms.master_weights == 0
