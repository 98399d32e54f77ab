"""Uneven data split across mixed replicas (Metis' data load balancer).

When the data-parallel replicas of a plan run on GPUs of different speed, an even split of
the global batch makes every pipeline wait for the slowest one at the gradient all-reduce.
Giving each pipeline micro-batches in proportion to its speed (Plan.pipeline_micro_batches)
lets the fast ones do more of the batch. `balance_data_split` turns an even plan with
mixed replicas into that split when simulate() predicts it faster and every stage still
fits in memory, and says why in the plan's reason: for a plan someone already has (a
file, a Sailor plan). The search finds such plans itself, with the split priced in before
anything is pruned (search/uneven.py, which uses its optimal min-max counts rather than
these proportional ones).
"""

from __future__ import annotations

import math

from sailplan.planner.plan import Plan
from sailplan.planner.simulator import PlanningContext, simulate


def proportional_counts(total: int, speeds: list[float]) -> tuple[int, ...]:
    """`total` micro-batches shared in proportion to `speeds`, each pipeline at least one.

    Largest-remainder rounding; ties go to the lower pipeline index (deterministic).
    """
    if total < len(speeds):
        raise ValueError(f"{total} micro-batches cannot give each of {len(speeds)} pipelines one")
    spare = total - len(speeds)
    weight = sum(speeds)
    exact = [spare * s / weight for s in speeds]
    counts = [1 + math.floor(x) for x in exact]
    left = total - sum(counts)
    order = sorted(range(len(speeds)), key=lambda i: (-(exact[i] - math.floor(exact[i])), i))
    for i in order[:left]:
        counts[i] += 1
    return tuple(counts)


def _pipeline_cycle_seconds(plan: Plan, context: PlanningContext, pipeline: int) -> float:
    """Seconds per micro-batch of one pipeline in steady state: its slowest stage."""
    costs = context.costs
    return max(
        costs.require_table(
            stage.replicas[pipeline].gpu_type, stage.tensor_parallel, plan.micro_batch_size
        ).forward_backward_seconds(stage.layer_start, stage.layer_end)
        for stage in plan.stages
    )


def balance_data_split(plan: Plan, context: PlanningContext) -> Plan | None:
    """`plan` with micro-batches in proportion to each pipeline's speed, or None when that
    is not predicted faster than the even split (or does not fit in memory)."""
    if plan.data_parallel <= 1 or plan.pipeline_micro_batches is not None:
        return None
    cycles = [_pipeline_cycle_seconds(plan, context, r) for r in range(plan.data_parallel)]
    if max(cycles) <= min(cycles) * (1 + 1e-9):
        return None
    total = plan.num_micro_batches * plan.data_parallel
    counts = proportional_counts(total, [1.0 / c for c in cycles])
    if len(set(counts)) == 1:
        return None
    candidate = Plan.model_validate(
        plan.model_dump()
        | {"pipeline_micro_batches": counts, "num_micro_batches": max(counts), "predictions": None}
    )
    even = plan.predictions or simulate(plan, context)
    uneven = simulate(candidate, context)
    if uneven.iteration_seconds >= even.iteration_seconds * (1 - 1e-9):
        return None
    for stage, predicted in zip(candidate.stages, uneven.stages, strict=True):
        smallest = min(context.costs.gpu_memory_bytes(r.gpu_type) for r in stage.replicas)
        if predicted.peak_memory_bytes > smallest:
            return None
    gain = even.iteration_seconds / uneven.iteration_seconds - 1.0
    why = (
        f"uneven data split {list(counts)} micro-batches per pipeline: pipelines on faster "
        f"GPUs take more of the batch, {100 * gain:.1f}% faster than the even split"
    )
    reason = f"{plan.reason}; {why}" if plan.reason else why
    return candidate.model_copy(update={"predictions": uneven, "reason": reason})
