"""The simulator's model-state memory (planner/simulator/memory.py) against what a rank holds.

Two gloo processes on the CPU build the trainer's stage (StageModel + make_optimizer, i.e.
DeepSpeed's ZeRO optimizer with the trainer's arguments; rank_memory.py) with fp32
parameters and with bf16 ones (Plan.half_parameters: DeepSpeed's bf16 mode, 2-byte
weights and gradients, the fp32 partition as master), and train two steps of two
micro-batches. At every point where DeepSpeed allocates or frees (after each backward,
around each bucket reduction and flatten, before the Adam update, after the step) each rank
sums the bytes of the storages it really holds, reached from the parameters (and their
.grad) and from the optimizer's attributes (DeepSpeed's flat buffers, fp32 partition,
grads_in_partition, accumulation buffers, ipg buckets, torch Adam's state), deduplicated
by storage. Meta tensors (DeepSpeed's shape records) hold no memory and are skipped.

The expected numbers are those measurements; the simulator's terms must match them:
weights, fp32 master partition and Adam state exactly up to DeepSpeed's alignment padding
(2 x DP elements per flat buffer), and the peak within what the reduction moves: a
gradient that enters a bucket, or a tensor larger than the bucket that DeepSpeed reduces on
its own, frees its own storage, so the simulator's sum (gradients + buckets) may exceed the
measured peak by the buckets plus one bucket or largest tensor of gradients, and must never
fall short of it by more than a bucket. The bucket is 2**16 elements here (the trainer's 2**24 would be 64 MiB, larger than
the whole test model) so the stage's 660k parameters dominate, as a real model's do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from rank_memory import (
    BUCKET_ELEMENTS,
    PADDING_ELEMENTS,
    REPLICAS,
    SPEC,
    held_bytes,
    join,
    leave,
    spawn,
    stage,
    train,
    write_report,
)

from sailplan.planner.simulator.memory import (
    TRAINER_BUCKET_ELEMENTS,
    TrainingSetup,
    model_state_bytes,
)

pytestmark = pytest.mark.trainer

FP32 = 4
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _replica(rank: int, port: int, zero_stage: int, dtype: str, out: Path) -> None:

    join(rank, port)
    try:
        model, params, optimizer = stage(
            SPEC, (0, SPEC.num_layers), zero_stage=zero_stage, dtype=DTYPES[dtype]
        )
        inner = getattr(optimizer, "inner")  # noqa: B009 (DeepSpeedZeroOptimizer)
        peak = {"total": 0, "optimizer_states": 0}
        temporaries: list[Any] = []

        def measure() -> None:
            peak["total"] = max(peak["total"], held_bytes(params, optimizer, temporaries))
            states = held_bytes(list(inner.optimizer.state.values()))
            peak["optimizer_states"] = max(peak["optimizer_states"], states)

        for name in ("flatten", "reduce_ipg_grads", "_optimizer_step", "get_flat_partition"):
            original = getattr(inner, name)

            def wrapped(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                measure()
                result = _original(*args, **kwargs)
                temporaries.append(result)
                measure()
                temporaries.pop()
                return result

            setattr(inner, name, wrapped)
        inner.optimizer.register_step_pre_hook(lambda *_: measure())
        train(model, optimizer, rank, after_micro=measure, after_step=measure)
        write_report(
            out,
            rank,
            {
                "parameters": sum(p.numel() for p in params),
                "largest_tensor": max(p.numel() for p in params),
                "parameter_bytes": params[0].element_size(),
                "weights": held_bytes(inner.bit16_groups_flat),
                "master_weights": held_bytes(
                    [t.detach() for t in inner.single_partition_of_fp32_groups]
                ),
                **peak,
            },
        )
    finally:
        leave()


def test_the_trainer_bucket_is_the_one_the_simulator_prices() -> None:
    from sailplan.trainer import zero

    assert zero.BUCKET_ELEMENTS == TRAINER_BUCKET_ELEMENTS


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("zero_stage", [1, 2])
def test_model_state_terms_match_the_tensors_a_rank_holds(
    zero_stage: int, dtype: str, tmp_path: Path
) -> None:
    reports = spawn(_replica, tmp_path, zero_stage, dtype)
    parameters = reports[0]["parameters"]
    # the simulator's parameter count is the spec's, the trainer's model has exactly that
    assert parameters == sum(SPEC.layer_parameters(i, 1) for i in range(SPEC.num_layers))
    setup = TrainingSetup.trainer(
        zero_stage=1 if zero_stage == 1 else 2,
        precision="bf16" if dtype == "bf16" else "fp32",
        bucket_elements=BUCKET_ELEMENTS,
        half_parameters=dtype == "bf16",
    )
    # the premise: the stage really holds parameters of the dtype priced
    w = setup.parameter_bytes
    assert reports[0]["parameter_bytes"] == w == (2 if dtype == "bf16" else FP32)
    predicted = model_state_bytes(
        parameters, REPLICAS, setup, "adam", largest_tensor=reports[0]["largest_tensor"]
    )
    bucket = w * BUCKET_ELEMENTS
    largest = w * reports[0]["largest_tensor"]
    # gradients that left their own storage for a bucket, or one tensor reduced on its own
    moved = predicted.buckets + max(bucket, largest)
    # the premise: model states, not buckets, dominate the peak
    assert predicted.total > 10 * bucket
    padding = FP32 * PADDING_ELEMENTS
    for r in reports:
        assert abs(r["weights"] - predicted.weights) <= w * PADDING_ELEMENTS
        assert abs(r["master_weights"] - predicted.master_weights) <= padding
        assert abs(r["optimizer_states"] - predicted.optimizer_states) <= 2 * padding
        # DeepSpeed keeps whole-tensor gradients of the tensors its partition boundary cuts,
        # so one replica may hold up to a tensor less than the other
        assert predicted.total - moved - largest - padding <= r["total"]
        assert r["total"] <= predicted.total + bucket
    # the simulator predicts the stage's largest replica: within what the reduction moves
    peak = max(r["total"] for r in reports)
    assert predicted.total - moved - padding <= peak <= predicted.total + bucket


def test_replicated_optimizer_over_16_bit_parameters_holds_the_zero_0_terms() -> None:
    """ZeRO-0 (one replica, in this process): 2-byte weights and gradients, the optimizer's
    fp32 copy and Adam on it, 2 + 2 + 12 bytes per parameter; during the step one tensor's
    fp32 gradient at a time on top."""
    from sailplan.trainer.model import StageModel
    from sailplan.trainer.optimizer import ReplicatedOptimizer
    from sailplan.trainer.tp import TPGroup

    model = StageModel(SPEC, 0, SPEC.num_layers, TPGroup(rank=0, size=1, group=None))
    model.initialise(seed=1)
    model.to(dtype=torch.bfloat16)
    params = list(model.parameters())
    optimizer = ReplicatedOptimizer(params, kind="adam", lr=1e-3, dp_group=None, dp_size=1)
    measured = {"before_step": 0, "peak_in_step": 0}
    inner_step = optimizer.inner.step

    def step(*args: Any, **kwargs: Any) -> Any:
        result = inner_step(*args, **kwargs)
        in_step = held_bytes(params, optimizer)
        measured["peak_in_step"] = max(measured["peak_in_step"], in_step)
        return result

    optimizer.inner.step = step  # type: ignore[method-assign]

    def before_step() -> None:
        measured["before_step"] = held_bytes(params, optimizer)

    train(model, optimizer, 0, before_step=before_step)
    parameters = sum(p.numel() for p in params)
    setup = TrainingSetup.trainer(zero_stage=0, precision="bf16", half_parameters=True)
    predicted = model_state_bytes(parameters, 1, setup, "adam")
    assert predicted.total == 16 * parameters
    # before the second step: weights, gradients, masters and Adam state, exactly, and
    # Adam's step counter (a 4-byte tensor per parameter tensor) that no term counts
    assert measured["before_step"] == predicted.total + FP32 * len(params)
    largest = FP32 * max(p.numel() for p in params)
    assert measured["peak_in_step"] <= predicted.total + FP32 * len(params) + largest
