"""How long the local control plane takes to come up and go down, by cluster size.

Prints one row per size: seconds for `LocalCluster.up` (kwokctl starting etcd, API server,
scheduler, controller manager and kwok; nodes created through the API; waiting for /readyz,
the default service account and every node Ready), for a 1-GPU pod to be scheduled and
reported Running by kwok, and for `down`. Also the time `build` needs to confirm the cached
binaries (the cost every test session and CI run pays once the binaries exist).

    python benchmarks/cluster_up.py                 # 16 (the default node file) and 500 nodes
    python benchmarks/cluster_up.py --nodes 16 2000

Needs the binaries (`sailplan cluster build`). The machine's load average is printed: other
processes slow every figure.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from kubernetes import client
from rich.console import Console
from rich.table import Table

from sailplan_dev.localcluster import build
from sailplan_dev.localcluster.cluster import LocalCluster
from sailplan_dev.localcluster.nodes import generate_node_file, load_node_file


def _pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "probe"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "probe",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
    }


def _time_pod_running(cluster: LocalCluster) -> float:
    core = client.CoreV1Api(cluster.api)
    start = time.monotonic()
    core.create_namespaced_pod("default", _pod())
    while core.read_namespaced_pod("probe", "default").status.phase != "Running":
        if time.monotonic() - start > 120:
            raise RuntimeError("probe pod not Running after 120s")
        time.sleep(0.1)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 500])
    args = parser.parse_args()
    missing = build.missing_binaries()
    if missing:
        raise SystemExit(f"binaries not built ({', '.join(missing)}): run `sailplan cluster build`")

    start = time.monotonic()
    build.build(log=lambda _m: None)
    verify_s = time.monotonic() - start

    table = Table(
        title=f"local cluster (Kubernetes {build.K8S_VERSION}, kwok {build.KWOK_VERSION})"
    )
    for column in ("nodes", "up s", "pod Running s", "down s"):
        table.add_column(column, justify="right")
    for count in args.nodes:
        node_file = load_node_file() if count == 16 else generate_node_file(count, seed=0)
        name = f"bench-{count}"
        start = time.monotonic()
        cluster = LocalCluster.up(node_file, name=name, timeout_s=900)
        up_s = time.monotonic() - start
        try:
            pod_s = _time_pod_running(cluster)
        finally:
            start = time.monotonic()
            cluster.down()
            down_s = time.monotonic() - start
        table.add_row(str(node_file.node_count), f"{up_s:.1f}", f"{pod_s:.2f}", f"{down_s:.1f}")
    console = Console()
    console.print(table)
    console.print(
        f"build check of cached binaries: {verify_s:.1f}s; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
