"""A checkpoint written by a plan with memory options resumes under other options.

Plan A: two stages ([0,3) | [3,6)), two replicas under ZeRO-1, stage 0 recomputing its
activations and stage 1 with its optimizer offloaded to the CPU (DeepSpeed's CPU Adam keeps
the moments in host memory; the checkpoint reads them through the same full-state
accessors). Plan B: split elsewhere ([0,2) | [2,6)), stage 0 offloaded (the moments are
restored into CPU Adam's state) and stage 1 plain. B's steps 5..8 must equal those of an
uninterrupted single-process run without options, to the tolerance of
test_parallel_equivalence.py: a moment lost or restored into the wrong slice moves the loss
by far more.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_harness import TINY, make_plan, run_plan

from sailplan.planner.plan import Plan
from sailplan.planner.workerenv import TrainerConfig

# Stage 0 of plan A steps in DeepSpeedCPUAdam (built before the first test).
pytestmark = [pytest.mark.trainer, pytest.mark.cpu_adam]

RELATIVE = 1e-5


@pytest.fixture(scope="module", autouse=True)
def _cpu_adam_built() -> None:
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(4))])


def _config(steps: int, directory: Path) -> TrainerConfig:
    return TrainerConfig(
        steps=steps,
        learning_rate=1e-3,
        checkpoint_dir=str(directory),
        checkpoint_interval_steps=2,
        checkpoints_to_keep=2,
        zero_stage=1,
    )


def _options(plan: Plan, options: list[tuple[bool, bool]]) -> Plan:
    stages = tuple(
        s.model_copy(update={"recompute": "full" if r else "none", "optimizer_offload": o})
        for s, (r, o) in zip(plan.stages, options, strict=True)
    )
    return plan.model_copy(update={"stages": stages})


def test_resume_across_memory_options_continues_the_loss_curve(tmp_path: Path) -> None:
    single = make_plan(TINY, [(0, 6, 1)], data_parallel=1, micro_batch_size=2, global_batch_size=8)
    uninterrupted = run_plan(single, _config(8, tmp_path / "ref-ckpt"), tmp_path / "ref").losses

    shared = tmp_path / "ckpt"
    plan_a = _options(
        make_plan(TINY, [(0, 3, 1), (3, 6, 1)], 2, 2, 8), [(True, False), (False, True)]
    )
    first = run_plan(plan_a, _config(4, shared), tmp_path / "a", generation=1)
    assert first.event("stopped")["last_checkpoint_step"] == 4

    plan_b = _options(
        make_plan(TINY, [(0, 2, 1), (2, 6, 1)], 2, 2, 8), [(False, True), (False, False)]
    )
    second = run_plan(plan_b, _config(8, shared), tmp_path / "b", generation=2)
    assert second.event("restored")["step"] == 4
    assert sorted(second.losses) == [5, 6, 7, 8]
    resumed = [second.losses[s] for s in range(5, 9)]
    assert resumed == pytest.approx([uninterrupted[s] for s in range(5, 9)], rel=RELATIVE)
    assert [first.losses[s] for s in range(1, 5)] == pytest.approx(
        [uninterrupted[s] for s in range(1, 5)], rel=RELATIVE
    )
