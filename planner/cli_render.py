"""Human-readable output of `sailplan plan` and `sailplan simulate` (rich tables).

Called only by planner/cli.py. Kept apart from the command definitions so the layout of a
plan table is in one place; `--json` output does not come through here.
"""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.plan import Plan, Predictions, Stage

GIB = 1024**3

console = Console(highlight=False)


def _types(stage: Stage) -> str:
    counts = Counter(r.gpu_type for r in stage.replicas)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{gpu} x{n}" for gpu, n in sorted(counts.items()))


def _zones(stage: Stage) -> str:
    counts = Counter(r.zone for r in stage.replicas)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{zone} x{n}" for zone, n in sorted(counts.items()))


def stage_table(plan: Plan, predictions: Predictions | None, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("stage", justify="right")
    table.add_column("layers")
    table.add_column("TP", justify="right")
    table.add_column("DP", justify="right")
    table.add_column("GPU type")
    table.add_column("zone")
    table.add_column("fwd+bwd", justify="right")
    table.add_column("memory", justify="right")
    for index, stage in enumerate(plan.stages):
        seconds, memory = "-", "-"
        if predictions is not None and index < len(predictions.stages):
            stage_prediction = predictions.stages[index]
            seconds = f"{stage_prediction.forward_backward_seconds * 1e3:.1f} ms"
            memory = f"{stage_prediction.peak_memory_bytes / GIB:.1f} GiB"
        options = [
            name
            for name, used in (
                ("recompute", stage.recompute == "full"),
                ("selective", stage.recompute == "selective"),
                ("offload", stage.optimizer_offload),
            )
            if used
        ]
        if options:
            # the memory options the stage runs with (Stage.recompute, optimizer_offload)
            memory = f"{memory} ({', '.join(options)})"
        table.add_row(
            str(index),
            f"{stage.layer_start}-{stage.layer_end - 1}",
            str(stage.tensor_parallel),
            str(len(stage.replicas)),
            _types(stage),
            _zones(stage),
            seconds,
            memory,
        )
    return table


def summary_lines(plan: Plan, predictions: Predictions) -> list[str]:
    return [
        f"iteration {predictions.iteration_seconds:.3f} s "
        f"(pipeline {predictions.pipeline_seconds:.3f} s, all-reduce "
        f"{predictions.allreduce_seconds:.3f} s, update {predictions.update_seconds:.3f} s)",
        f"throughput {predictions.samples_per_second:.1f} samples/s; "
        f"global batch {plan.global_batch_size} = micro-batch {plan.micro_batch_size} x "
        f"{plan.num_micro_batches} micro-batches x DP {plan.data_parallel}",
        f"cost {predictions.usd_per_hour:.2f} USD/h, {predictions.usd_per_iteration:.4f} USD/iteration; "
        f"egress {predictions.egress_bytes_per_iteration / 1e9:.2f} GB/iteration",
        f"peak memory {predictions.peak_memory_bytes / GIB:.1f} GiB; "
        f"{plan.world_size} GPUs in {plan.pipeline_depth} stage(s)",
    ]


def render_plans(
    plans: list[Plan],
    cluster: ClusterSnapshot,
    evaluated: int,
    seconds: float,
    extra_lines: list[list[str]] | None = None,
) -> None:
    """The plans' tables and summaries; extra_lines[rank] (e.g. energy) follow plan rank's."""
    total = sum(p.gpus for p in cluster.pools)
    for rank, plan in enumerate(plans):
        title = "Best plan" if rank == 0 else f"Alternative {rank}"
        console.print(stage_table(plan, plan.predictions, title))
        if plan.predictions is not None:
            for line in summary_lines(plan, plan.predictions):
                console.print(f"  {line}")
        if extra_lines is not None and rank < len(extra_lines):
            for line in extra_lines[rank]:
                console.print(f"  {line}")
        if plan.reason:
            console.print(f"  why: {plan.reason}")
        estimated = plan.inputs.estimated
        if estimated:
            console.print(f"  estimated profiles (no measurement): {', '.join(estimated)}")
        else:
            console.print("  all profiles measured")
        console.print()
    console.print(
        f"full search over {total} GPUs in {len(cluster.pools)} pool(s): {evaluated} complete "
        f"candidate plans scored in {seconds:.2f} s"
    )


def render_simulation(
    plan: Plan,
    predictions: Predictions,
    measured_iteration_seconds: float | None = None,
    estimated: list[str] | None = None,
) -> None:
    console.print(stage_table(plan, predictions, "Simulated plan"))
    for line in summary_lines(plan, predictions):
        console.print(f"  {line}")
    for line in estimated or []:
        console.print(f"  estimated input: {line}")
    if measured_iteration_seconds:
        error = (
            predictions.iteration_seconds - measured_iteration_seconds
        ) / measured_iteration_seconds
        console.print(
            f"  the plan file's measured iteration: {measured_iteration_seconds:.3f} s "
            f"(prediction {error * 100:+.1f}%)"
        )
