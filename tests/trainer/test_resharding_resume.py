"""A checkpoint written under one plan resumes under another as if never interrupted.

Plan A: two stages (layers [0,3) | [3,6)), two replicas, TP 1, ZeRO-1 (each replica holds
half the Adam state). Plan B: two stages split elsewhere ([0,2) with TP 2 | [2,6) with
TP 1), one replica (the whole state on one rank), a different micro-batch size. Plan C:
split elsewhere again ([0,4) | [4,6)), two replicas under ZeRO-2.
A tied-embedding model resumes from one stage onto two, where the head's copy of the
embedding is rebuilt from layer 0's key.
The checkpoint holds the logical model and Adam moments, so B's steps 5..8 must equal those
of an uninterrupted single-process run up to float32 summation order (tolerance as in
test_parallel_equivalence.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from trainer_harness import TINY, TINY_TIED, make_plan, run_plan

from sailplan.planner.workerenv import TrainerConfig

pytestmark = pytest.mark.trainer


def config(steps: int, directory: Path, zero_stage: Literal[0, 1, 2] = 1) -> TrainerConfig:
    return TrainerConfig(
        steps=steps,
        learning_rate=1e-3,
        checkpoint_dir=str(directory),
        checkpoint_interval_steps=2,
        checkpoints_to_keep=2,
        zero_stage=zero_stage,
    )


def test_resume_under_a_different_plan_continues_the_loss_curve(tmp_path: Path) -> None:
    single = make_plan(TINY, [(0, 6, 1)], data_parallel=1, micro_batch_size=2, global_batch_size=8)
    uninterrupted = run_plan(single, config(8, tmp_path / "ref-ckpt"), tmp_path / "ref").losses

    shared = tmp_path / "ckpt"
    plan_a = make_plan(
        TINY, [(0, 3, 1), (3, 6, 1)], data_parallel=2, micro_batch_size=2, global_batch_size=8
    )
    first = run_plan(plan_a, config(4, shared), tmp_path / "a", generation=1)
    assert first.event("stopped")["last_checkpoint_step"] == 4

    plan_b = make_plan(
        TINY, [(0, 2, 2), (2, 6, 1)], data_parallel=1, micro_batch_size=4, global_batch_size=8
    )
    second = run_plan(plan_b, config(6, shared), tmp_path / "b", generation=2)
    assert second.event("restored")["step"] == 4
    assert sorted(second.losses) == [5, 6]

    plan_c = make_plan(
        TINY, [(0, 4, 1), (4, 6, 1)], data_parallel=2, micro_batch_size=1, global_batch_size=8
    )
    third = run_plan(plan_c, config(8, shared, zero_stage=2), tmp_path / "c", generation=3)
    assert third.event("restored")["step"] == 6
    assert sorted(third.losses) == [7, 8]
    resumed = first.losses | second.losses | third.losses
    for step in range(1, 9):
        assert resumed[step] == pytest.approx(uninterrupted[step], rel=1e-5)
    # keep 2: steps 6 and 8 remain (2 and 4 were pruned)
    assert sorted(p.name for p in shared.iterdir()) == ["step-000000006", "step-000000008"]


def test_tied_embeddings_resume_onto_a_split_between_stages(tmp_path: Path) -> None:
    # A: one stage, the head uses layer 0's embedding directly. B: the head is on a second
    # stage with TP 2 and its copy of the embedding must come from layer 0's checkpoint key.
    single = make_plan(
        TINY_TIED, [(0, 5, 1)], data_parallel=1, micro_batch_size=2, global_batch_size=8
    )
    uninterrupted = run_plan(single, config(6, tmp_path / "ref-ckpt"), tmp_path / "ref").losses
    shared = tmp_path / "ckpt"
    run_plan(single, config(3, shared), tmp_path / "a")
    split = make_plan(
        TINY_TIED, [(0, 2, 1), (2, 5, 2)], data_parallel=1, micro_batch_size=2, global_batch_size=8
    )
    resumed = run_plan(split, config(6, shared), tmp_path / "b")
    assert resumed.event("restored")["step"] == 3
    assert sorted(resumed.losses) == [4, 5, 6]
    for step in (4, 5, 6):
        assert resumed.losses[step] == pytest.approx(uninterrupted[step], rel=1e-5)
