"""A burst of TrainingJobs on autoscaled GPUPools of hundreds of possible nodes, grown by Karpenter.

Issue 11's sharing benchmark: N jobs submitted at once on M GPUPools that start at zero nodes
and may grow to `--max-nodes-per-zone` a2-highgpu-4g nodes (4 A100s) in each of two zones
(the issue's case: 20 jobs, 2 pools, 125 per zone = 500 possible nodes; the defaults are a
smaller burst that runs in a few minutes on two cores), on the local control plane
with the real operator and the real Karpenter (kwok provider). Job i plans on pool i mod M,
each held to at most 8 A100s by its cost limit unless `--max-usd-per-hour` says otherwise.

It measures the time from submitting until every job is Running or queued with a reason
(phase Unschedulable, its condition naming why, e.g. NoCapacity), and checks that no
capacity is booked twice: the GPUs the operator planned per pool and zone (the jobs' worker
pods, bound or not, and their ProvisioningRequests) never exceed what the zone can hold, and
on every node the GPUs of the pods bound there never exceed its GPUs (no two jobs' workers on
the same GPUs). The operator's CPU seconds and peak memory come from /proc: the operator
process and the plan-search processes it starts.

    python benchmarks/autoscale_burst.py [--jobs 6] [--pools 2] [--max-nodes-per-zone 25]
    python benchmarks/autoscale_burst.py --jobs 20 --max-nodes-per-zone 125   # the issue's
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
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
    worker_zone,
)
from kubernetes import client
from rich.console import Console
from rich.table import Table

from sailplan.operator.api.common import GROUP, VERSION

CLUSTER = "autoscaleburst"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass
class Settled:
    """When a job got to Running or to a reason for waiting, and which."""

    at: float
    state: str  # "Running" or "<phase>: <reason>"


@dataclass
class ProcessTree:
    """CPU seconds and memory of a process and its descendants, sampled from /proc (a child
    that exits between samples keeps its last CPU reading)."""

    root: int
    cpu: dict[int, float] = field(default_factory=dict)  # pid -> last utime+stime seconds
    peak_rss_mib: float = 0.0  # the tree's largest summed RSS seen

    def sample(self) -> None:
        parents: dict[int, int] = {}
        stats: dict[int, list[str]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
            parents[int(entry)] = int(fields[1])
            stats[int(entry)] = fields
        tree = {self.root}
        grew = True
        while grew:
            found = {pid for pid, ppid in parents.items() if ppid in tree} - tree
            tree |= found
            grew = bool(found)
        rss = 0.0
        for pid in tree & stats.keys():
            fields = stats[pid]
            # fields[11], [12]: utime, stime (clock ticks); [21]: rss (pages)
            self.cpu[pid] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
            rss += int(fields[21]) * PAGE_KIB / 1024
        self.peak_rss_mib = max(self.peak_rss_mib, rss)

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())


def settled_state(status: dict[str, Any], pods: list[Any]) -> str | None:
    """Running (phase and every worker), or Unschedulable with the reason it waits for."""
    phase = status.get("phase")
    if phase == "Running" and pods and all(p.status.phase == "Running" for p in pods):
        return "Running"
    if phase == "Unschedulable" and not pods:
        for condition in status.get("conditions", []):
            if condition["type"] == "Unschedulable" and condition["status"] == "True":
                return f"Unschedulable: {condition.get('reason') or '?'}"
    return None


def booking_problems(
    core: client.CoreV1Api, custom: client.CustomObjectsApi, possible: dict[tuple[str, str], int]
) -> list[str]:
    """Capacity booked twice, if any: per pool and zone, the planned GPUs (workers and
    waiting ProvisioningRequests) over what the zone can hold; per node, bound GPUs over its
    GPUs."""
    planned: dict[tuple[str, str], int] = defaultdict(int)
    per_node: dict[str, int] = defaultdict(int)
    for pod in core.list_namespaced_pod(NAMESPACE, label_selector=ROLE_WORKER).items:
        if pod.metadata.deletion_timestamp or pod.status.phase in ("Succeeded", "Failed"):
            continue
        gpus = int(pod.spec.containers[0].resources.limits["nvidia.com/gpu"])
        planned[(pod.metadata.labels["sailplan.dev/gpupool"], worker_zone(pod))] += gpus
        if pod.spec.node_name:
            per_node[pod.spec.node_name] += gpus
    try:
        requests = custom.list_namespaced_custom_object(
            "autoscaling.x-k8s.io", "v1", NAMESPACE, "provisioningrequests"
        )["items"]
    except client.ApiException as error:
        if error.status != 404:
            raise
        requests = []
    for request in requests:
        labels = request["metadata"]["labels"]
        conditions = {
            c["type"]: c["status"] for c in request.get("status", {}).get("conditions", [])
        }
        if "True" not in (conditions.get("Provisioned"), conditions.get("Failed")):
            gpus = int(request["metadata"]["annotations"]["sailplan.dev/gpus"])
            planned[(labels["sailplan.dev/gpupool"], labels["sailplan.dev/zone"])] += gpus
    problems = [
        f"{pool}/{zone}: {gpus} GPUs planned, {possible.get((pool, zone), 0)} possible"
        for (pool, zone), gpus in sorted(planned.items())
        if gpus > possible.get((pool, zone), 0)
    ]
    allocatable = {
        n.metadata.name: int((n.status.allocatable or {}).get("nvidia.com/gpu", 0))
        for n in core.list_node().items
    }
    problems += [
        f"node {node}: {gpus} GPUs bound, {allocatable.get(node, 0)} exist"
        for node, gpus in sorted(per_node.items())
        if gpus > allocatable.get(node, 0)
    ]
    return problems


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], jobs=6, max_nodes_per_zone=25, timeout=600)
    parser.add_argument("--max-usd-per-hour", type=float, default=31.0)
    args = parser.parse_args()
    console = Console(width=150)

    with autoscaled_cluster(console, args, cluster_name=CLUSTER, pool_prefix="burst") as bench:
        pools, core, custom = bench.pools, bench.core, bench.custom
        possible = {
            (p, zone): args.max_nodes_per_zone * GPUS_PER_NODE for p in pools for zone in ZONES
        }
        core, custom = bench.core, bench.custom
        assert bench.operator.process is not None
        usage = ProcessTree(bench.operator.process.pid)
        usage.sample()
        idle_cpu = usage.cpu_seconds

        names = [f"job-{i:02d}" for i in range(args.jobs)]
        settled: dict[str, Settled] = {}
        problems: list[str] = []
        t0 = time.monotonic()
        for i, name in enumerate(names):
            body = job(name, pools[i % len(pools)])
            body["spec"]["objective"]["maxUsdPerHour"] = args.max_usd_per_hour
            custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "trainingjobs", body)
        while time.monotonic() - t0 < args.timeout and len(settled) < len(names):
            usage.sample()
            problems += booking_problems(core, custom, possible)
            pods_by_job: dict[str, list[Any]] = defaultdict(list)
            for pod in core.list_namespaced_pod(NAMESPACE, label_selector=ROLE_WORKER).items:
                pods_by_job[pod.metadata.labels["sailplan.dev/job"]].append(pod)
            for item in custom.list_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, "trainingjobs"
            )["items"]:
                name = item["metadata"]["name"]
                state = settled_state(item.get("status") or {}, pods_by_job[name])
                if state is None:
                    settled.pop(name, None)  # a job may leave a waiting state again
                elif name not in settled or settled[name].state != state:
                    settled[name] = Settled(time.monotonic() - t0, state)
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
        usage.sample()
        nodes = [
            n
            for n in core.list_node().items
            if (n.metadata.labels or {}).get("karpenter.sh/nodepool")
        ]
        _report(
            console,
            args,
            settled,
            names,
            elapsed=elapsed,
            nodes=len(nodes),
            problems=problems,
            cpu=usage.cpu_seconds - idle_cpu,
            rss=usage.peak_rss_mib,
        )


def _report(
    console: Console,
    args: Any,
    settled: dict[str, Settled],
    names: list[str],
    *,
    elapsed: float,
    nodes: int,
    problems: list[str],
    cpu: float,
    rss: float,
) -> None:
    states: dict[str, int] = defaultdict(int)
    for name in names:
        states[settled[name].state if name in settled else "not settled"] += 1
    last = max((s.at for s in settled.values()), default=None)
    table = Table(
        title=f"{args.jobs} jobs submitted at once on {args.pools} GPUPools of "
        f"{args.max_nodes_per_zone * len(ZONES) * args.pools} possible {MACHINE} nodes "
        "(Karpenter, from zero)"
    )
    for column in ("measure", "value"):
        table.add_column(column, justify="right")
    table.add_row(
        "submit -> every job Running or queued with a reason",
        f"{last:.1f} s" if last is not None and len(settled) == len(names) else "timed out",
    )
    for state, count in sorted(states.items()):
        table.add_row(f"jobs {state}", str(count))
    table.add_row("nodes Karpenter created", str(nodes))
    table.add_row("capacity booked twice (checks every 0.5 s)", str(len(problems)))
    table.add_row("operator CPU over the burst (with plan searches)", f"{cpu:.1f} s")
    table.add_row("operator peak RSS (with plan searches)", f"{rss:.0f} MiB")
    table.add_row("benchmark wall time after submit", f"{elapsed:.1f} s")
    console.print(table)
    for problem in problems[:10]:
        console.print(f"[red]booked twice: {problem}[/red]")


if __name__ == "__main__":
    main()
