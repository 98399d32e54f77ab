"""Activation recomputation and optimizer offload give the single-process losses.

The plan shapes of test_parallel_equivalence.py (pipeline, data and tensor parallel, ZeRO-1
and ZeRO-2, tied embeddings), each with memory options on its stages: recomputation
(Stage.recompute = "full", torch.utils.checkpoint per layer) on even stages and the
optimizer offloaded to the CPU (Stage.optimizer_offload: DeepSpeed's ZeRO offload and CPU
Adam) on odd ones, a one-stage plan both; one shape also the other way round. Neither
option changes the arithmetic: recomputation runs the same forward again, CPU Adam is the
same update rule as torch's Adam, vectorised (another rounding of the same expression, a
few ulps per step). So the tolerance is test_parallel_equivalence's 1e-5 relative, far
below the 1e-2 a wrong gradient (a recomputed layer that lost its input's gradient, an
update applied twice or not at all) moves the loss after one update.

DeepSpeed builds its CPU Adam op on first use (ninja and g++; about 80 s on a 2-core VM,
then cached under ~/.cache/torch_extensions); the fixture builds it once in this process
so that the worker processes load it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from trainer_harness import TINY, TINY_LLAMA, TINY_TIED, make_plan, step_losses, trainer_config

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan

# The offloaded optimizer steps in DeepSpeedCPUAdam (built before the first test).
pytestmark = [pytest.mark.trainer, pytest.mark.cpu_adam]

STEPS = 4
RELATIVE = 1e-5


def _losses(plan: Plan, tmp: Path, zero_stage: Literal[0, 1, 2]) -> list[float]:
    return step_losses(plan, trainer_config(tmp, STEPS, zero_stage=zero_stage), tmp)


def _with_options(plan: Plan, options: list[tuple[bool, bool]]) -> Plan:
    """(recompute, offload) per stage."""
    stages = tuple(
        stage.model_copy(
            update={"recompute": "full" if recompute else "none", "optimizer_offload": offload}
        )
        for stage, (recompute, offload) in zip(plan.stages, options, strict=True)
    )
    return plan.model_copy(update={"stages": stages})


def _alternating(count: int) -> list[tuple[bool, bool]]:
    if count == 1:
        return [(True, True)]
    return [(i % 2 == 0, i % 2 == 1) for i in range(count)]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    """The reference: each model trained by one process, no options."""
    return {
        spec.name: _losses(
            make_plan(spec, [(0, spec.num_layers, 1)], 1, 2, 8),
            tmp_path_factory.mktemp(spec.name),
            1,
        )
        for spec in (TINY, TINY_LLAMA, TINY_TIED)
    }


SWAPPED = [(False, True), (True, False)]


@pytest.mark.parametrize(
    ("spec", "splits", "dp", "mbs", "zero_stage", "options"),
    [
        pytest.param(TINY, [(0, 2, 1), (2, 6, 1)], 2, 2, 1, None, id="opt-pp2-dp2-zero1"),
        pytest.param(TINY, [(0, 2, 1), (2, 6, 1)], 2, 2, 1, SWAPPED, id="opt-pp2-dp2-swapped"),
        pytest.param(TINY, [(0, 2, 1), (2, 6, 1)], 2, 2, 2, None, id="opt-pp2-dp2-zero2"),
        pytest.param(TINY, [(0, 1, 1), (1, 4, 1), (4, 6, 1)], 1, 4, 1, None, id="opt-pp3-m2"),
        # ZeRO-0: the offloaded stage runs DeepSpeed's ZeRO-1 (offload is part of it)
        pytest.param(TINY, [(0, 6, 1)], 2, 1, 0, None, id="opt-dp2-zero0"),
        pytest.param(TINY, [(0, 3, 1), (3, 6, 2)], 1, 2, 1, None, id="opt-pp2-tp1-tp2"),
        pytest.param(TINY_LLAMA, [(0, 2, 2), (2, 4, 1)], 2, 2, 1, None, id="llama-pp2-tp2-tp1-dp2"),
        pytest.param(TINY_TIED, [(0, 2, 1), (2, 5, 2)], 1, 2, 1, None, id="tied-pp2-tp1-tp2"),
        pytest.param(TINY_TIED, [(0, 2, 1), (2, 5, 1)], 2, 2, 2, None, id="tied-pp2-dp2-zero2"),
    ],
)
def test_memory_options_keep_the_single_process_losses(
    *,
    single_process: dict[str, list[float]],
    spec: ModelSpec,
    splits: list[tuple[int, int, int]],
    dp: int,
    mbs: int,
    zero_stage: Literal[0, 1, 2],
    options: list[tuple[bool, bool]] | None,
    tmp_path: Path,
) -> None:
    plan = make_plan(spec, splits, dp, mbs, 8)
    plan = _with_options(plan, options or _alternating(len(splits)))
    assert any(s.recompute == "full" for s in plan.stages)
    assert any(s.optimizer_offload for s in plan.stages)
    reference = single_process[spec.name]
    assert _losses(plan, tmp_path, zero_stage) == pytest.approx(reference, rel=RELATIVE)
    assert reference[-1] < reference[0] * (1 - 100 * RELATIVE)
