"""An fp16 overflow skips the step on every optimizer, and leaves nothing behind.

`StageOptimizer.skip` must drop the step's gradients everywhere they live (param.grad, and
under ZeRO-2 DeepSpeed's reduced partitions and accumulation buffers): a skipped step
followed by a normal one must give exactly the weights of the normal step alone, and a
skip must not move the weights. Two gloo processes on the CPU per optimizer kind. The loss
scale's hooks are checked in one process: gradients reach the optimizer unscaled, and an
inf gradient makes `step_ok` say no and halves the scale.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from rank_memory import free_port, join, leave, spawn, stage, write_report

from sailplan.planner.modelspec import ModelSpec

pytestmark = pytest.mark.trainer

SPEC = ModelSpec(
    name="skip-probe",
    family="opt",
    hidden_size=32,
    num_blocks=2,
    num_heads=4,
    vocab_size=64,
    sequence_length=16,
)
REPLICAS = 2


def _train(rank: int, zero_stage: int, skip_first: bool) -> list[float]:
    model, params, optimizer = stage(
        SPEC,
        (0, SPEC.num_layers),
        zero_stage=zero_stage,
        micro_batches=2,
        bucket_elements=None,
        seed=3,
        lr=1e-2,
    )
    before = torch.cat([p.detach().reshape(-1).clone() for p in params])

    def backwards(seed: int) -> None:
        for micro in range(2):
            generator = torch.Generator().manual_seed(seed + 10 * micro + rank)
            tokens = torch.randint(
                0, SPEC.vocab_size, (2, SPEC.sequence_length), generator=generator
            )
            model(None, {"inputs": tokens, "targets": tokens}).backward()
            optimizer.after_backward(micro)

    if skip_first:
        backwards(seed=1000)  # gradients that must leave no trace
        optimizer.skip()
        after_skip = torch.cat([p.detach().reshape(-1) for p in params])
        assert torch.equal(after_skip, before)
    backwards(seed=0)
    optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in params]).tolist()


def _replica(rank: int, port: int, zero_stage: int, out: Path) -> None:
    join(rank, port)
    try:
        plain = _train(rank, zero_stage, skip_first=False)
        skipped = _train(rank, zero_stage, skip_first=True)
        write_report(out, rank, {"plain": plain, "skipped": skipped})
    finally:
        leave()


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_a_skipped_step_leaves_no_trace(zero_stage: int, tmp_path: Path) -> None:
    for report in spawn(_replica, tmp_path, zero_stage):
        assert report["skipped"] == report["plain"]


class _Scalar(torch.nn.Module):
    """A 'last stage': returns a 0-d loss."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # an fp32 loss, as autocast computes the trainer's (and its 2**16 scale fits)
        return (self.weight.float() * x).sum()


def test_fp16_hooks_unscale_gradients_and_flag_overflow() -> None:
    from sailplan.trainer.precision import INITIAL_SCALE, MixedPrecision

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        model = _Scalar()
        precision = MixedPrecision("fp16", torch.device("cpu"), list(model.parameters()), model)
        x = torch.tensor([1.0, 2.0, 3.0, 4.0])
        loss = model(x)
        assert float(loss) == 10.0 * INITIAL_SCALE  # the loss is scaled for the backward
        loss.backward()
        assert model.weight.grad is not None
        assert torch.equal(model.weight.grad, x)  # d(w.x)/dw, unscaled
        assert precision.step_ok(None)
        model.weight.grad = None
        model(torch.tensor([1.0, float("inf"), 0.0, 0.0])).backward()
        assert not precision.step_ok(None)
        assert precision.loss_scale == INITIAL_SCALE / 2
    finally:
        leave()


def test_fp16_hooks_leave_16_bit_gradients_scaled_for_the_optimizer() -> None:
    """With fp16 parameters the hooks only check: dividing an fp16 gradient by 2**16 would
    flush small values, so the optimizer divides by `grad_scale` in fp32."""
    from sailplan.trainer.precision import INITIAL_SCALE, MixedPrecision

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        model = _Scalar().to(torch.float16)
        precision = MixedPrecision(
            "fp16", torch.device("cpu"), list(model.parameters()), model, unscale_in_hooks=False
        )
        # gradients below fp16's smallest normal (2**-14): the scale keeps them exact
        x = torch.tensor([1.0, 2.0, 3.0, 4.0]) * 2**-16
        model(x).backward()
        assert model.weight.grad is not None
        expected = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float16)
        assert torch.equal(model.weight.grad, expected)  # still x times the scale 2**16
        assert precision.grad_scale == INITIAL_SCALE
        assert precision.step_ok(None)
    finally:
        leave()
