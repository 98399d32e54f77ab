"""Rank arithmetic of sailplan.trainer.layout against hand-derived layouts of a small plan."""

from __future__ import annotations

from trainer_harness import TINY, make_plan

from sailplan.trainer.layout import dp_groups, rank_layout, tp_groups

# Plan: stage 0 = layers [0, 2) TP 1, stage 1 = layers [2, 6) TP 2, two replicas each.
# Workers (stage-major): w0 = s0r0 rank 0, w1 = s0r1 rank 1, w2 = s1r0 ranks 2-3,
# w3 = s1r1 ranks 4-5.
PLAN = make_plan(
    TINY, [(0, 2, 1), (2, 6, 2)], data_parallel=2, micro_batch_size=2, global_batch_size=8
)


def test_groups_follow_the_stage_major_numbering() -> None:
    assert PLAN.world_size == 6
    assert tp_groups(PLAN) == [(0,), (1,), (2, 3), (4, 5)]
    assert dp_groups(PLAN) == [(0, 1), (2, 4), (3, 5)]


def test_pipeline_neighbours_are_tp_rank_zero_of_the_same_replica() -> None:
    first = rank_layout(PLAN, 1)
    assert (first.stage, first.replica, first.tp_rank) == (0, 1, 0)
    assert first.prev_stage_rank is None
    assert first.next_stage_rank == 4
    last = rank_layout(PLAN, 5)
    assert (last.stage, last.replica, last.tp_rank, last.tp_root) == (1, 1, 1, 4)
    assert last.prev_stage_rank == 1
    assert last.next_stage_rank is None
    assert last.dp_ranks == (3, 5)
    assert last.is_last_stage and not last.is_first_stage
