"""The operator's own footprint while it plans a large job: the issue's case, OPT-30B over
the example's four GPUPools with objective Cost and maxUsdPerHour 1 (a search of minutes).

One real operator (subprocess, `operator run`) against the local control plane's API
server; the job is applied once the operator has written the GPUPools' statuses. Sampled
every second for --window seconds, then the operator gets SIGTERM. Printed:

  first status    seconds from apply to the job's first condition (Planning=True today)
  planning ended  seconds from apply to a plan or Unschedulable
  operator RSS    the operator process itself: idle (before apply) and peak
  operator CPU    CPU seconds the operator process itself used during the window
  children RSS    peak summed RSS of its descendants (the search processes, forkserver)
  SIGTERM exit    seconds from SIGTERM to the operator's exit (30 s at most, then SIGKILL)

    python benchmarks/planning_footprint.py [--window 150] [--kubeconfig PATH]
                                            [--source PYTHONPATH]

--source runs another source tree's operator (and installs its CRDs), e.g. a directory
holding `sailplan/{operator,planner,trainer}` links into an older checkout, to compare.
Without --kubeconfig a local cluster `planningbench` is brought up (and left running).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' helpers, as pytest's `pythonpath` gives them

from operator_process import install_crds  # noqa: E402
from waiting import wait_for  # noqa: E402

GROUP, VERSION = "sailplan.dev", "v1beta1"
NODE_POOLS = ("a100-ondemand", "a100-spot", "v100-ondemand", "v100-spot")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_and_cpu(pid: int) -> tuple[float, float]:
    """(resident MiB, CPU seconds) of one process; zeros once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0, 0.0
    rss = next((int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:")), 0.0)
    return rss, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            parents[int(entry.name)] = int(stat[1])
    found, frontier = [], [pid]
    while frontier:
        of = frontier.pop()
        children = [child for child, parent in parents.items() if parent == of]
        found += children
        frontier += children
    return found


def large_job(namespace: str, pools: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": "opt-30b", "namespace": namespace},
        "spec": {
            "model": {"name": "OPT-30B"},
            "training": {"globalBatchSize": 256, "steps": 10},
            "pools": {"names": pools},
            "objective": {"kind": "Cost", "maxUsdPerHour": 1},
            "trainer": {"image": "sailplan-trainer:test"},
            "checkpoint": {"storage": {"uri": "gs://bucket/test"}},
            "profiling": {"mode": "Skip"},
        },
    }


def run(api: Any, kubeconfig: str, source: str | None, window: float, workdir: Path) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    namespace = f"planning-bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    pools = [f"{node_pool}-{namespace[-6:]}" for node_pool in NODE_POOLS]
    for name, node_pool in zip(pools, NODE_POOLS, strict=True):
        custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "gpupools",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "GPUPool",
                "metadata": {"name": name},
                "spec": {"nodePool": node_pool},
            },
        )
    env = dict(os.environ, **({"PYTHONPATH": source} if source else {}))
    args = [sys.executable, "-m", "sailplan.operator", "operator", "run"]
    args += ["--kubeconfig", kubeconfig, "--namespace", namespace]
    args += ["--profile-namespace", namespace, "--metrics-port", "0", "--health-port", "0"]
    with (workdir / f"{namespace}.log").open("wb") as log:
        operator = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/")
    try:

        def pool_statuses() -> bool:
            return all(
                (
                    custom.get_cluster_custom_object(GROUP, VERSION, "gpupools", p).get("status")
                    or {}
                ).get("zones")
                for p in pools
            )

        wait_for("the operator writing GPUPool statuses", pool_statuses, 120)
        idle_rss, idle_cpu = rss_and_cpu(operator.pid)
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", large_job(namespace, pools)
        )
        applied = time.monotonic()
        first_status = ended = None
        peak_rss = peak_children = 0.0
        cpu = idle_cpu
        while time.monotonic() - applied < window:
            rss, cpu = rss_and_cpu(operator.pid)
            peak_rss = max(peak_rss, rss)
            children = sum(rss_and_cpu(child)[0] for child in descendants(operator.pid))
            peak_children = max(peak_children, children)
            status = (
                custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, "trainingjobs", "opt-30b"
                ).get("status")
                or {}
            )
            elapsed = time.monotonic() - applied
            if first_status is None and status.get("conditions"):
                first_status = elapsed
            if ended is None and (status.get("plan") or status.get("phase") == "Unschedulable"):
                ended = elapsed
                reasons = {c["type"]: c["reason"] for c in status["conditions"]}
                print(f"ended: phase {status['phase']}, conditions {reasons}")
            time.sleep(1.0)
        signalled = time.monotonic()
        operator.send_signal(signal.SIGTERM)
        try:
            operator.wait(timeout=30)
            exit_text = f"{time.monotonic() - signalled:.1f} s"
        except subprocess.TimeoutExpired:
            exit_text = "> 30 s (SIGKILLed)"
        print(
            f"first status {_seconds(first_status)}; planning ended {_seconds(ended)}; "
            f"operator RSS idle {idle_rss:.0f} MiB, peak {peak_rss:.0f} MiB; operator CPU "
            f"{cpu - idle_cpu:.1f} s in {window:.0f} s; children RSS peak {peak_children:.0f} "
            f"MiB; SIGTERM exit {exit_text}"
        )
    finally:
        if operator.poll() is None:
            for child in descendants(operator.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            operator.kill()
            operator.wait()
        core.delete_namespace(namespace)
        for name in pools:
            custom.delete_cluster_custom_object(GROUP, VERSION, "gpupools", name)


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=150.0)
    parser.add_argument("--kubeconfig", type=Path, default=None)
    parser.add_argument("--source", default=None, help="PYTHONPATH of another source tree")
    args = parser.parse_args()

    from sailplan_dev.localcluster.cluster import LocalCluster
    from sailplan_dev.localcluster.kubeconfig import api_client

    cluster = (
        LocalCluster.attach(args.kubeconfig)
        if args.kubeconfig
        else LocalCluster.up(name="planningbench", log=print)
    )
    api = api_client(cluster.kubeconfig)
    if args.source:
        # The CRDs of the tree whose operator runs (an older one may not know newer fields).
        subprocess.run(
            [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
             "from operator_process import install_crds; "
             "from sailplan_dev.localcluster.kubeconfig import api_client; "
             "from pathlib import Path; install_crds(api_client(Path(sys.argv[2])))",
             str(ROOT / "tests"), str(cluster.kubeconfig)],
            env=dict(os.environ, PYTHONPATH=args.source),
            check=True,
        )  # fmt: skip
    else:
        install_crds(api)
    with tempfile.TemporaryDirectory() as workdir:
        run(api, str(cluster.kubeconfig), args.source, args.window, Path(workdir))


if __name__ == "__main__":
    main()
