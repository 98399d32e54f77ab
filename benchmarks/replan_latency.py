"""Replan latency on the local cluster: how long training stands still when the cluster changes.

The real operator (subprocess), the local control plane's API server and scheduler, and real
`sailplan-train` processes for the operator's pods, run by the pod runner on 1-GPU runner
nodes of two GPUPools (the setup of tests/e2e/replan_harness.py, a tiny GPT). Two scenarios,
each repeated `--runs` times:

  preempt  the node of rank 0 is preempted (SIGTERM, DisruptionTarget, node deleted) once
           generation 1 has a complete checkpoint; the operator replans onto the node left;
  switch   the job runs on a V100 node, an A100 node joins; the operator judges the gain,
           asks for a checkpoint, and switches (planned switch through the annotation).

Columns (medians over the runs, wall-clock seconds from the test's side):
  trigger -> new pods    node loss / node added to generation 2's pods existing
  trigger -> Running     ... to all of generation 2's pods reported Running
  Running -> first step  generation 2 Running to rank 0 logging its first step (restore
                         included: process start, rendezvous, checkpoint load)

    python benchmarks/replan_latency.py [--runs 3] [--kubeconfig PATH]

Without --kubeconfig a local cluster `replanbench` is brought up (and left running for reuse).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
# The e2e tests' harness and the helpers it imports, as pytest's `pythonpath` gives them.
for helpers in ("tests", "tests/trainer", "tests/e2e"):
    sys.path.insert(0, str(ROOT / helpers))

from operator_process import install_crds  # noqa: E402
from replan_harness import A100, INTERVAL, V100, Cluster, replan_cluster  # noqa: E402
from runner_harness import events_of, pod_runner  # noqa: E402
from waiting import wait_for  # noqa: E402


def _all_running(cluster: Cluster, generation: int) -> bool:
    pods = cluster.pods(generation)
    return bool(pods) and all(p.status.phase == "Running" for p in pods)


def _first_step(log: Path) -> bool:
    return any(e.get("event") == "step" for e in events_of(log))


def one_run(api: Any, kubeconfig: str, scenario: str, workdir: Path) -> dict[str, float]:
    namespace = f"replan-bench-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        with (
            pod_runner(api, workdir / namespace) as runner,
            replan_cluster(
                api, kubeconfig, namespace, runner, workdir / f"{namespace}.log"
            ) as cluster,
        ):
            return _measure(cluster, scenario)
    finally:
        core.delete_namespace(namespace)


def _measure(cluster: Cluster, scenario: str) -> dict[str, float]:
    cluster.gpupool(A100)
    cluster.gpupool(V100)
    if scenario == "preempt":
        cluster.add_node(A100)
    cluster.add_node(V100)
    cluster.create_job(cluster.job_spec())
    first, log = cluster.rank0(1)
    cluster.wait_checkpoint(log, INTERVAL)
    started = time.monotonic()
    if scenario == "preempt":
        cluster.runner.preempt_node(first.spec.node_name, grace_s=5.0)
    else:
        cluster.add_node(A100)
    wait_for("generation 2 pods", lambda: cluster.pods(2), 60, cluster.explain)
    created = time.monotonic() - started
    wait_for("generation 2 Running", lambda: _all_running(cluster, 2), 60, cluster.explain)
    running_at = time.monotonic()
    _, new_log = cluster.rank0(2)
    wait_for("generation 2 first step", lambda: _first_step(new_log), 60, cluster.explain)
    stepped_at = time.monotonic()
    return {
        "created": created,
        "running": running_at - started,
        "first_step": stepped_at - running_at,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kubeconfig", type=Path, default=None)
    args = parser.parse_args()
    console = Console()
    from sailplan_dev.localcluster.cluster import LocalCluster

    cluster = (
        LocalCluster.attach(args.kubeconfig)
        if args.kubeconfig
        else LocalCluster.up(name="replanbench", log=console.print)
    )
    api = cluster.api
    install_crds(api)
    results: dict[str, list[dict[str, float]]] = {"preempt": [], "switch": []}
    with tempfile.TemporaryDirectory(prefix="replan-bench-") as tmp:
        for scenario, runs in results.items():
            for index in range(args.runs):
                run = one_run(api, str(cluster.kubeconfig), scenario, Path(tmp))
                console.print(f"{scenario} run {index + 1}: {run}")
                runs.append(run)
    table = Table(title=f"Replan latency, local cluster, median of {args.runs} runs (seconds)")
    table.add_column("scenario")
    table.add_column("trigger -> new pods", justify="right")
    table.add_column("trigger -> Running", justify="right")
    table.add_column("Running -> first step", justify="right")
    for scenario, runs in results.items():
        table.add_row(
            scenario,
            *(
                f"{statistics.median(r[key] for r in runs):.2f}"
                for key in ("created", "running", "first_step")
            ),
        )
    console.print(table)


if __name__ == "__main__":
    main()
