"""Where one global rank sits in a Plan, and which ranks it talks to.

The Plan fixes the rank numbering (Plan.workers(): stage-major workers, each a TP group of
consecutive ranks). Everything the engine needs to know about its neighbours derives from
that numbering: its stage, replica (= pipeline) and TP rank, the TP group of its worker, the
data-parallel group of its stage (same TP rank in every replica of the stage), and the TP
rank 0 of the previous and next stage of its pipeline, which carry the activations.

Pure (no torch) so the rank arithmetic is tested without processes. Called by the engine
when it builds process groups and by the pipeline schedule for its peers.
"""

from __future__ import annotations

from dataclasses import dataclass

from sailplan.planner.plan import Plan, Worker


@dataclass(frozen=True)
class RankLayout:
    """The position of one global rank in a plan."""

    rank: int
    worker: Worker
    tp_rank: int
    tp_ranks: tuple[int, ...]
    dp_ranks: tuple[int, ...]
    prev_stage_rank: int | None
    next_stage_rank: int | None
    num_stages: int

    @property
    def stage(self) -> int:
        return self.worker.stage

    @property
    def replica(self) -> int:
        return self.worker.replica

    @property
    def tp_size(self) -> int:
        return len(self.tp_ranks)

    @property
    def tp_root(self) -> int:
        """The TP group's rank 0, the one that does the pipeline send/recv."""
        return self.tp_ranks[0]

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.num_stages - 1


def worker_of_rank(plan: Plan, rank: int) -> Worker:
    for worker in plan.workers():
        if rank in worker.ranks:
            return worker
    raise ValueError(f"rank {rank} is outside the plan's world of {plan.world_size}")


def rank_layout(plan: Plan, rank: int) -> RankLayout:
    workers = plan.workers()
    worker = worker_of_rank(plan, rank)
    tp_rank = rank - worker.first_rank
    by_position = {(w.stage, w.replica): w for w in workers}
    same_stage = [w for w in workers if w.stage == worker.stage]
    prev_worker = by_position.get((worker.stage - 1, worker.replica))
    next_worker = by_position.get((worker.stage + 1, worker.replica))
    return RankLayout(
        rank=rank,
        worker=worker,
        tp_rank=tp_rank,
        tp_ranks=tuple(worker.ranks),
        dp_ranks=tuple(w.first_rank + tp_rank for w in same_stage),
        prev_stage_rank=prev_worker.first_rank if prev_worker else None,
        next_stage_rank=next_worker.first_rank if next_worker else None,
        num_stages=plan.pipeline_depth,
    )


def tp_groups(plan: Plan) -> list[tuple[int, ...]]:
    """Every TP group of the plan, in worker order (process groups are created in this order)."""
    return [tuple(w.ranks) for w in plan.workers()]


def dp_groups(plan: Plan) -> list[tuple[int, ...]]:
    """Every data-parallel group: per stage and TP rank, that TP rank of each replica."""
    groups: list[tuple[int, ...]] = []
    for stage_index, stage in enumerate(plan.stages):
        replicas = [w for w in plan.workers() if w.stage == stage_index]
        for tp_rank in range(stage.tensor_parallel):
            groups.append(tuple(w.first_rank + tp_rank for w in replicas))
    return groups
