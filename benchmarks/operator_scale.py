"""Operator scale: a 64-worker TrainingJob on a 500-node fake GKE cluster.

Measures, on the local control plane (etcd, kube-apiserver, scheduler, controller manager,
kwok; `sailplan_dev.localcluster`):
  - operator start to indices filled and GPUPool statuses written (500 nodes watched),
  - operator start to all worker pods created, and to all of them Running (bound by the
    kube-scheduler to nodes of the planned pools and zones, marked Running by kwok),
  - operator start to the TrainingJob reporting phase Running,
  - with the operator warm, a second job from `apply` to all pods Running,
  - the operator process's CPU seconds and peak resident memory over the run.

The plan is pre-seeded as the job's plan ConfigMap (generation 1) before the operator
starts, so the operator takes its adoption path (the same one it takes after a crash) and
the figures measure the operator, not the planner's search (benchmarks/search_speed.py
measures that). `--plan-live` lets the operator plan itself instead.

    python benchmarks/operator_scale.py [--nodes 500] [--workers 64] [--keep-cluster]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from rich.console import Console
from rich.table import Table

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.children import render_configmap
from sailplan.planner.catalog import default_catalog
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan_dev.apply import apply
from sailplan_dev.localcluster.cluster import LocalCluster
from sailplan_dev.localcluster.nodes import NodeFile, generate_node_file

# The tests' operator subprocess and wait loop, so the benchmark runs the operator as they do.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from operator_process import OperatorProcess, install_crds
from waiting import poll

NAMESPACE = "bench"
JOB = "scale"
CLUSTER = "opbench"


def build_plan(node_file: NodeFile, workers: int) -> tuple[Plan, list[str]]:
    """A 4-stage, TP-1 OPT-350M plan whose `workers` replicas fill on-demand (pool, zone)
    cells in order of size, each cell up to its GPU count."""
    catalog = default_catalog()
    cells: list[tuple[str, str, str, int]] = []
    for pool in node_file.pools:
        if pool.spot or not pool.accelerator:
            continue
        gpu = catalog.resolve_gpu(pool.accelerator)
        for zone, nodes in pool.zones.items():
            cells.append((pool.name, gpu, zone, nodes * pool.gpus_per_node))
    cells.sort(key=lambda c: (-c[3], c[0], c[2]))
    replicas: list[Replica] = []
    for name, gpu, zone, gpus in cells:
        # At most 16 workers per cell, so the job spans several pools and zones.
        for _ in range(min(gpus, 16, workers - len(replicas))):
            replicas.append(Replica(pool=f"{name}/{zone}", gpu_type=gpu, zone=zone))
    if len(replicas) < workers:
        raise SystemExit(f"only {len(replicas)} on-demand GPUs for {workers} workers")
    depth = 4
    data_parallel = workers // depth
    model = catalog.model("OPT-350M")
    bounds = [round(i * model.num_layers / depth) for i in range(depth + 1)]
    stages = tuple(
        Stage(
            layer_start=bounds[s],
            layer_end=bounds[s + 1],
            tensor_parallel=1,
            replicas=tuple(replicas[s * data_parallel : (s + 1) * data_parallel]),
        )
        for s in range(depth)
    )
    plan = Plan(
        model=model,
        global_batch_size=data_parallel * 4,
        micro_batch_size=1,
        num_micro_batches=4,
        stages=stages,
        reason="benchmark seed",
    )
    pools = sorted({r.pool.split("/")[0] for r in replicas})
    return plan, pools


def warm_apply(
    api: Any, plan: Plan, pools: list[str], body: dict[str, Any], timeout: float
) -> dict[str, float]:
    """With the operator running: free the GPUs, then time a second job from apply to all
    pods Running. Its plan ConfigMap is written just before the job (without an owner, as
    the job does not exist yet), so the operator adopts it instead of searching."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "trainingjobs", JOB)
    deadline = time.monotonic() + timeout
    freed = poll(
        lambda: (
            not core.list_namespaced_pod(NAMESPACE, label_selector="sailplan.dev/role=worker").items
        ),
        timeout,
        interval_s=0.5,
    )
    if not freed:
        return {}
    name = f"{JOB}-warm"
    seed = TrainingJob.model_validate(
        {"name": name, "namespace": NAMESPACE, "uid": "", "spec": body["spec"]}
    )
    configmap = render_configmap(seed, plan, 1)
    configmap["metadata"].pop("ownerReferences")
    core.create_namespaced_config_map(NAMESPACE, configmap)
    warm = body | {"metadata": {"name": name, "namespace": NAMESPACE}}
    t0 = time.monotonic()
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "trainingjobs", warm)
    selector = f"sailplan.dev/job={name},sailplan.dev/role=worker"

    def all_running() -> bool:
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        return len(pods) >= len(plan.workers()) and all(p.status.phase == "Running" for p in pods)

    if not poll(all_running, deadline - time.monotonic()):
        return {}
    return {"warm": time.monotonic() - t0}


def cpu_and_peak_rss(pid: int) -> tuple[float, float]:
    """(CPU seconds, peak RSS MiB) of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    peak = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    return cpu, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--plan-live", action="store_true", help="let the operator plan")
    parser.add_argument("--keep-cluster", action="store_true")
    args = parser.parse_args()
    console = Console()

    node_file = generate_node_file(nodes=args.nodes, seed=0)
    started = time.monotonic()
    cluster = LocalCluster.up(node_file, name=CLUSTER, timeout_s=900, log=console.print)
    cluster_seconds = time.monotonic() - started
    api = cluster.api
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    log = Path("/tmp/sailplan-operator-scale.log")
    log.unlink(missing_ok=True)  # the operator appends; one run's log per file
    operator = OperatorProcess(str(cluster.kubeconfig), NAMESPACE, log)
    try:
        install_crds(api)
        plan, pools = build_plan(node_file, args.workers)
        apply(
            api,
            [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "GPUPool",
                    "metadata": {"name": p},
                    "spec": {"nodePool": p},
                }
                for p in pools
            ]
            + [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}],
        )
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingJob",
            "metadata": {"name": JOB, "namespace": NAMESPACE},
            "spec": {
                "model": {"name": "OPT-350M"},
                "training": {"globalBatchSize": plan.global_batch_size, "steps": 100},
                "pools": {"names": pools},
                "trainer": {"image": "sailplan-trainer:bench"},
                "checkpoint": {"storage": {"uri": "gs://bench/scale"}},
                # The plan is supplied: this measures pods, not profiling (kwok runs nothing).
                "profiling": {"mode": "Skip"},
            },
        }
        created = custom.create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, "trainingjobs", body
        )
        if not args.plan_live:
            job = TrainingJob.model_validate(
                {
                    "name": JOB,
                    "namespace": NAMESPACE,
                    "uid": created["metadata"]["uid"],
                    "spec": body["spec"],
                }
            )
            core.create_namespaced_config_map(NAMESPACE, render_configmap(job, plan, 1))

        t0 = time.monotonic()
        operator.start()
        marks: dict[str, float] = {}
        expected = args.workers
        while time.monotonic() - t0 < args.timeout:
            now = time.monotonic() - t0
            if "pools" not in marks:
                statuses = [
                    (
                        custom.get_cluster_custom_object(GROUP, VERSION, "gpupools", p).get(
                            "status"
                        )
                        or {}
                    )
                    for p in pools
                ]
                if all(s.get("nodesTotal") for s in statuses):
                    marks["pools"] = now
            pods = core.list_namespaced_pod(
                NAMESPACE, label_selector="sailplan.dev/role=worker"
            ).items
            if len(pods) >= expected and "created" not in marks:
                marks["created"] = now
            running = sum(p.status.phase == "Running" for p in pods)
            if running >= expected and "running" not in marks:
                marks["running"] = now
            phase = (
                custom.get_namespaced_custom_object(
                    GROUP, VERSION, NAMESPACE, "trainingjobs", JOB
                ).get("status")
                or {}
            ).get("phase")
            if phase == "Running" and "job" not in marks:
                marks["job"] = now
            if {"pools", "created", "running", "job"} <= set(marks):
                break
            time.sleep(0.2)
        marks |= warm_apply(api, plan, pools, body, args.timeout)
        assert operator.process is not None
        cpu, peak = cpu_and_peak_rss(operator.process.pid)
        _report(
            console,
            args,
            cluster_s=cluster_seconds,
            marks=marks,
            cpu=cpu,
            peak=peak,
            pools=len(pools),
        )
    finally:
        operator.stop()
        if not args.keep_cluster:
            cluster.down()


def _report(
    console: Console,
    args: Any,
    *,
    cluster_s: float,
    marks: dict[str, float],
    cpu: float,
    peak: float,
    pools: int,
) -> None:
    table = Table(
        title=f"Operator scale: {args.workers}-worker TrainingJob, {args.nodes} fake nodes"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")

    def seconds(key: str) -> str:
        return f"{marks[key]:.2f} s" if key in marks else "timed out"

    table.add_row("cluster up (not the operator)", f"{cluster_s:.1f} s")
    table.add_row("GPUPools used", str(pools))
    table.add_row("plan", "live (operator plans)" if args.plan_live else "pre-seeded (adopted)")
    table.add_row("operator start -> GPUPool statuses written", seconds("pools"))
    table.add_row("operator start -> all worker pods created", seconds("created"))
    table.add_row("operator start -> all worker pods Running", seconds("running"))
    table.add_row("operator start -> TrainingJob phase Running", seconds("job"))
    table.add_row("warm operator: apply -> all worker pods Running", seconds("warm"))
    table.add_row("operator CPU time over both runs", f"{cpu:.2f} s")
    table.add_row("operator peak RSS", f"{peak:.0f} MiB")
    console.print(table)


if __name__ == "__main__":
    main()
