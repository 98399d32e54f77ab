"""Mixed precision in the trainer: bf16 and fp16 autocast with fp32 master weights.

A plan's precision (planner/precision.py picks it) makes every rank run forward and backward
under torch.autocast while the optimizer updates fp32 parameters; fp16 adds the dynamic
loss scale (sailplan.trainer.precision). The loss curves are compared with the fp32
single-process reference on the CPU (gloo; the CPU's autocast runs bf16 and fp16 matrix
products):

- they must differ from it by more than the 1e-5 relative tolerance within which fp32
  parallel runs reproduce it (test_parallel_equivalence), which shows the half-precision
  arithmetic ran;
- and stay within 2e-2 relative: bf16 keeps 8 significand bits (unit roundoff 2**-9, about
  0.2%), fp16 11 (2**-12); each logit passes through a few half-precision products per
  layer of this 4-block model, and the loss, a mean over 128 tokens, averages the rounding
  rather than adding it up, so a few roundoffs, not tens, separate the curves over the
  run; 2e-2 leaves about ten bf16 roundoffs of room while a wrong scale (a loss off by 2**16
  or an unscaled gradient step) misses it by orders of magnitude.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from trainer_harness import TINY, make_plan, run_plan

from sailplan.planner.workerenv import TrainerConfig
from sailplan.trainer.precision import INITIAL_SCALE, LossScale

pytestmark = pytest.mark.trainer

STEPS = 8
FP32_PARALLEL_RTOL = 1e-5
HALF_RTOL = 2e-2


def _losses(
    precision: Literal["fp32", "bf16", "fp16"],
    splits: list[tuple[int, int, int]],
    dp: int,
    zero_stage: Literal[0, 1, 2],
    tmp: Path,
) -> list[float]:
    plan = make_plan(TINY, splits, data_parallel=dp, micro_batch_size=2, global_batch_size=8)
    plan = plan.model_copy(update={"precision": precision})
    config = TrainerConfig(
        steps=STEPS,
        learning_rate=1e-2,
        checkpoint_dir=str(tmp / "ckpt"),
        checkpoint_interval_steps=100,
        zero_stage=zero_stage,
    )
    losses = run_plan(plan, config, tmp).losses
    assert sorted(losses) == list(range(1, STEPS + 1))
    return [losses[s] for s in range(1, STEPS + 1)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    return _losses("fp32", [(0, TINY.num_layers, 1)], 1, 1, tmp_path_factory.mktemp("fp32"))


Case = tuple[Literal["fp32", "bf16", "fp16"], list[tuple[int, int, int]], int, Literal[0, 1, 2]]
CASES: dict[str, Case] = {
    "bf16-pp2-dp2-zero1": ("bf16", [(0, 3, 1), (3, TINY.num_layers, 1)], 2, 1),
    "fp16-dp2-zero2": ("fp16", [(0, TINY.num_layers, 1)], 2, 2),  # loss scale 2**16
    "fp16-one-process": ("fp16", [(0, TINY.num_layers, 1)], 1, 0),  # replicated optimizer
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_half_precision_follows_the_fp32_curve(
    reference: list[float], case: Case, tmp_path: Path
) -> None:
    losses = _losses(*case, tmp_path)
    differences = [abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True)]
    assert max(differences) > FP32_PARALLEL_RTOL, (losses, reference)
    assert max(differences) < HALF_RTOL, (losses, reference)
    assert losses[-1] < losses[0]  # it trains


def test_the_loss_scale_halves_on_overflow_and_doubles_after_clean_steps() -> None:
    scale = LossScale(growth_interval=3)
    assert scale.value == INITIAL_SCALE
    scale.update(overflow=True)
    assert scale.value == INITIAL_SCALE / 2
    for _ in range(3):
        scale.update(overflow=False)
    assert scale.value == INITIAL_SCALE
    tiny = LossScale(initial=1.0)
    tiny.update(overflow=True)
    assert tiny.value == 1.0  # DeepSpeed's min_loss_scale
