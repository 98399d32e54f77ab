"""Autoscaling: N TrainingJobs on M GPUPools that start at zero nodes, grown by Karpenter.

On the local control plane with the real operator and the real Karpenter (kwok provider,
`sailplan_dev.localcluster.karpenter`): M GPUPools of a2-highgpu-4g nodes (4 A100s) in two
zones, each allowed `--max-nodes-per-zone` nodes per zone and starting with none; N jobs
submitted together, job i on pool i mod M, each held to at most 8 A100s by its cost limit
(objective.maxUsdPerHour), so two jobs fit a pool at the default limits. Measures per job the time from submit to its
worker pods created, to all of them Running (Karpenter added nodes, the scheduler bound the
pods, kwok runs them) and to phase Running; the nodes Karpenter created against the nodes
the Running workers fill (GPUs per pool and zone over 4, rounded up); and, once every job
is deleted, how long until Karpenter has removed every node.

    python benchmarks/autoscale.py [--jobs 4] [--pools 2] [--max-nodes-per-zone 2]
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from autoscale_setup import (
    GPUS_PER_NODE,
    MACHINE,
    NAMESPACE,
    ROLE_WORKER,
    ZONES,
    arguments,
    autoscaled_cluster,
    job,
    poll,
    worker_zone,
)
from rich.console import Console
from rich.table import Table

from sailplan.operator.api.common import GROUP, VERSION
from sailplan_dev.localcluster.karpenter_shapes import NODEPOOL_OF_NODE_LABEL

CLUSTER = "autoscalebench"


@dataclass
class JobMarks:
    pool: str
    created: float | None = None
    running: float | None = None
    phase: float | None = None
    gpus: dict[str, int] = field(default_factory=dict)  # zone -> GPUs of its Running workers


def main() -> None:
    args = arguments(
        __doc__.splitlines()[0], jobs=4, max_nodes_per_zone=2, timeout=180
    ).parse_args()
    console = Console(width=150)

    with autoscaled_cluster(console, args, cluster_name=CLUSTER, pool_prefix="as") as bench:
        pools, core, custom = bench.pools, bench.core, bench.custom
        core, custom = bench.core, bench.custom
        marks = {f"job-{i}": JobMarks(pools[i % len(pools)]) for i in range(args.jobs)}
        seen_nodes: set[str] = set()
        t0 = time.monotonic()
        for name, mark in marks.items():
            custom.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, "trainingjobs", job(name, mark.pool)
            )
        while time.monotonic() - t0 < args.timeout:
            now = time.monotonic() - t0
            seen_nodes |= {
                n.metadata.name
                for n in core.list_node().items
                if (n.metadata.labels or {}).get(NODEPOOL_OF_NODE_LABEL)
            }
            for name, mark in marks.items():
                pods = core.list_namespaced_pod(
                    NAMESPACE, label_selector=f"sailplan.dev/job={name},{ROLE_WORKER}"
                ).items
                if pods and mark.created is None:
                    mark.created = now
                if pods and all(p.status.phase == "Running" for p in pods):
                    mark.running = mark.running if mark.running is not None else now
                status = (
                    custom.get_namespaced_custom_object(
                        GROUP, VERSION, NAMESPACE, "trainingjobs", name
                    ).get("status")
                    or {}
                )
                if status.get("phase") == "Running" and mark.phase is None:
                    mark.phase = now
            if all(m.phase is not None and m.running is not None for m in marks.values()):
                break
            time.sleep(0.25)

        # What the workers running now fill: GPUs per pool and zone, in whole nodes.
        for name, mark in marks.items():
            for pod in core.list_namespaced_pod(
                NAMESPACE, label_selector=f"sailplan.dev/job={name},{ROLE_WORKER}"
            ).items:
                if pod.status.phase == "Running":
                    limits = pod.spec.containers[0].resources.limits
                    zone = worker_zone(pod)
                    mark.gpus[zone] = mark.gpus.get(zone, 0) + int(limits["nvidia.com/gpu"])
        per_cell: dict[tuple[str, str], int] = defaultdict(int)
        for mark in marks.values():
            for zone, gpus in mark.gpus.items():
                per_cell[(mark.pool, zone)] += gpus
        needed = sum(-(-gpus // GPUS_PER_NODE) for gpus in per_cell.values())

        for name in marks:
            custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "trainingjobs", name)
        t_delete = time.monotonic()
        gone = poll(
            lambda: (
                not [
                    n
                    for n in core.list_node().items
                    if (n.metadata.labels or {}).get(NODEPOOL_OF_NODE_LABEL)
                ]
            ),
            args.timeout,
            interval_s=0.5,
        )
        scale_down = time.monotonic() - t_delete if gone else None
        _report(console, args, marks, created=len(seen_nodes), needed=needed, scale_down=scale_down)


def _seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "timed out"


def _report(
    console: Console,
    args: Any,
    marks: dict[str, JobMarks],
    *,
    created: int,
    needed: int,
    scale_down: float | None,
) -> None:
    table = Table(
        title=f"Autoscaling: {args.jobs} jobs on {args.pools} GPUPools from zero nodes "
        f"({MACHINE}, max {args.max_nodes_per_zone} nodes per zone in {len(ZONES)} zones)"
    )
    for column in (
        "job",
        "pool",
        "submit -> pods",
        "-> pods Running",
        "-> phase Running",
        "GPUs per zone",
    ):
        table.add_column(column, justify="right")
    for name, mark in marks.items():
        table.add_row(
            name,
            mark.pool,
            _seconds(mark.created),
            _seconds(mark.running),
            _seconds(mark.phase),
            ", ".join(f"{z}: {g}" for z, g in sorted(mark.gpus.items())) or "-",
        )
    console.print(table)
    console.print(f"nodes Karpenter created: {created}; nodes the Running workers fill: {needed}")
    console.print(f"all jobs deleted -> every Karpenter node removed: {_seconds(scale_down)}")


if __name__ == "__main__":
    main()
