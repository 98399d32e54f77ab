"""An uneven data split (Plan.pipeline_micro_batches) trains like one process on the batch.

Pipelines of an uneven split run different micro-batch counts on consecutive slices of
the same global batch (sailplan.trainer.data), and each divides its micro-batch losses by
the mean count, so the DP average of the gradients is the gradient of the mean loss over
the whole global batch: the same as the single-process run (one stage, TP 1, DP 1) on the
same samples, up to float32 summation order. The tolerance is the one
test_parallel_equivalence.py derives (1e-5 relative); a pipeline that averaged over its own
count instead (the even split's arithmetic) would weight the 3-micro-batch pipeline's
samples 5/3 times the others' and move the loss by far more after one Adam step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import pytest
from trainer_harness import (
    TINY,
    make_plan,
    plan_losses,
    run_fresh,
    step_losses,
    trainer_config,
)

from sailplan.planner import workerenv as env
from sailplan.planner.plan import Plan
from sailplan.planner.workerenv import TrainerConfig

STEPS = 4
RELATIVE = 1e-5
GLOBAL_BATCH = 8  # trainer_harness.plan_losses' batch


def _uneven(splits: list[tuple[int, int, int]], counts: tuple[int, ...], mbs: int) -> Plan:
    even = make_plan(
        TINY,
        splits,
        data_parallel=len(counts),
        micro_batch_size=mbs,
        global_batch_size=mbs * len(counts) * max(counts),
    )
    return Plan.model_validate(
        even.model_dump()
        | {
            "global_batch_size": GLOBAL_BATCH,
            "num_micro_batches": max(counts),
            "pipeline_micro_batches": counts,
        }
    )


@pytest.fixture(scope="module")
def single_process(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    return plan_losses(
        TINY,
        [(0, TINY.num_layers, 1)],
        dp=1,
        mbs=2,
        tmp=tmp_path_factory.mktemp("reference"),
        steps=STEPS,
    )


@pytest.mark.trainer
@pytest.mark.parametrize(
    ("splits", "counts", "mbs", "zero_stage"),
    [
        # plain DP: 5 + 3 micro-batches of one sample, every replica keeps all the state
        pytest.param([(0, 6, 1)], (5, 3), 1, 0, id="dp2-5-3-zero0"),
        # two stages x 2 replicas, 3 + 1 micro-batches of two samples: the short pipeline
        # has fewer micro-batches than stages (no steady 1F1B phase); ZeRO-1 partitions the
        # optimizer state and reduces once per step
        pytest.param([(0, 2, 1), (2, 6, 1)], (3, 1), 2, 1, id="pp2-dp2-3-1-zero1"),
    ],
)
def test_uneven_split_matches_single_process(
    *,
    single_process: list[float],
    splits: list[tuple[int, int, int]],
    counts: tuple[int, ...],
    mbs: int,
    zero_stage: Literal[0, 1],
    tmp_path: Path,
) -> None:
    plan = _uneven(splits, counts, mbs)
    assert plan.micro_batch_size * sum(counts) == GLOBAL_BATCH
    config = trainer_config(tmp_path, STEPS, zero_stage=zero_stage)
    losses = step_losses(plan, config, tmp_path)
    assert losses == pytest.approx(single_process, rel=RELATIVE)
    # it trains, so equal losses are not just equal initial losses
    assert single_process[-1] < single_process[0] * (1 - 100 * RELATIVE)


def test_zero2_refuses_an_uneven_split(tmp_path: Path) -> None:
    """ZeRO-2 reduces after every micro-batch, which pipelines of different counts cannot
    agree on: one line naming the split and the fix, exit status 2."""
    plan_path, config_path = tmp_path / "plan.json", tmp_path / "trainer.json"
    plan_path.write_text(_uneven([(0, 6, 1)], (5, 3), 1).to_json())
    config_path.write_text(
        TrainerConfig(steps=1, checkpoint_dir=str(tmp_path), zero_stage=2).model_dump_json()
    )
    result = run_fresh(
        {
            **os.environ,
            env.PLAN_PATH: str(plan_path),
            env.TRAINER_CONFIG_PATH: str(config_path),
            env.WORKER_INDEX: "0",
        }
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "pipeline_micro_batches [5, 3]" in lines[0] and "zero_stage 0 or 1" in lines[0]
