"""The autoscaling benchmarks' shared set-up: a local cluster with the real operator and the
real Karpenter (kwok provider) growing GPUPools that start at zero nodes.

benchmarks/autoscale.py (time to Running, scale-down) and benchmarks/autoscale_burst.py (a
burst of jobs on hundreds of possible nodes) measure different things on the same cluster:
M GPUPools of a2-highgpu-4g nodes (4 A100s) in two zones, each allowed a number of nodes
per zone and starting with none, and TrainingJobs each held to a few A100s by a cost limit.
`autoscaled_cluster` brings that cluster up (CRDs, pools, namespace, Karpenter with one
NodePool per GPUPool, the operator), waits until the operator has seen every pool's possible
capacity, and takes it all down again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from rich.console import Console

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.api.gpupool import GPUPool
from sailplan_dev.apply import apply
from sailplan_dev.localcluster.cluster import LocalCluster
from sailplan_dev.localcluster.karpenter import Karpenter
from sailplan_dev.localcluster.karpenter_shapes import instance_types, node_pools

# The tests' operator subprocess and wait loop, so the benchmarks run the operator as they do.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from operator_process import OperatorProcess, install_crds
from waiting import poll

NAMESPACE = "bench"
ZONES = ("us-central1-a", "us-central1-b")
MACHINE = "a2-highgpu-4g"
GPUS_PER_NODE = 4
ROLE_WORKER = "sailplan.dev/role=worker"
# At most 8 A100s (on-demand list price 3.67 USD per GPU-hour): two jobs fit a pool of 16
# GPUs, else the first job on a pool plans on all of it.
MAX_USD_PER_HOUR = 31.0


def gpupool(name: str, max_nodes: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUPool",
        "metadata": {"name": name},
        "spec": {
            "nodePool": name,
            "autoscaling": {
                "zones": list(ZONES),
                "machineType": MACHINE,
                "minNodesPerZone": 0,
                "maxNodesPerZone": max_nodes,
                # What Karpenter takes here (a few seconds), not a cloud VM's boot.
                "provisioningSeconds": 30,
            },
        },
    }


def job(name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "OPT-350M"},
            "training": {"globalBatchSize": 16, "steps": 100},
            "pools": {"names": [pool]},
            "trainer": {"image": "sailplan-trainer:bench"},
            "checkpoint": {"storage": {"uri": "gs://bench/autoscale"}},
            "profiling": {"mode": "Skip"},  # kwok's nodes run nothing to profile
            "objective": {"maxUsdPerHour": MAX_USD_PER_HOUR},
        },
    }


def worker_zone(pod: Any) -> str:
    terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    for expression in terms.node_selector_terms[0].match_expressions:
        if expression.key == "topology.kubernetes.io/zone":
            return str(expression.values[0])
    return "?"


def arguments(
    description: str, *, jobs: int, max_nodes_per_zone: int, timeout: float
) -> argparse.ArgumentParser:
    """The options both benchmarks take (with their own defaults); a benchmark adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--jobs", type=int, default=jobs)
    parser.add_argument("--pools", type=int, default=2)
    parser.add_argument("--max-nodes-per-zone", type=int, default=max_nodes_per_zone)
    parser.add_argument("--timeout", type=float, default=timeout)
    parser.add_argument("--keep-cluster", action="store_true")
    return parser


@dataclass(frozen=True)
class Autoscaled:
    """The cluster a benchmark runs on: its GPUPools, API clients and the operator process."""

    pools: list[str]
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    operator: OperatorProcess


@contextmanager
def autoscaled_cluster(
    console: Console, args: argparse.Namespace, *, cluster_name: str, pool_prefix: str
) -> Iterator[Autoscaled]:
    """The local cluster with `args.pools` GPUPools (at zero nodes, at most
    `args.max_nodes_per_zone` each), Karpenter and the operator running, once the operator
    shows every pool's possible capacity; stopped (and the cluster removed unless
    `args.keep_cluster`) on exit. The operator's log: /tmp/sailplan-<cluster_name>."""
    pools = [f"{pool_prefix}-{i}" for i in range(args.pools)]
    max_nodes_per_zone = args.max_nodes_per_zone
    workdir = Path(f"/tmp/sailplan-{cluster_name}")
    cluster = LocalCluster.up(name=cluster_name, log=console.print)
    api = cluster.api
    custom = client.CustomObjectsApi(api)
    workdir.mkdir(exist_ok=True)
    (workdir / "operator.log").unlink(missing_ok=True)
    operator = OperatorProcess(str(cluster.kubeconfig), NAMESPACE, workdir / "operator.log")
    karpenter = Karpenter(cluster.kubeconfig, api, workdir)
    try:
        install_crds(api)
        manifests = [gpupool(p, max_nodes_per_zone) for p in pools]
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        apply(api, [*manifests, namespace])
        karpenter.start(instance_types(ZONES))
        for manifest in manifests:
            pool = GPUPool.model_validate(
                {"name": manifest["metadata"]["name"], "spec": manifest["spec"]}
            )
            karpenter.apply_node_pools(node_pools(pool, consolidate_after_s=0))
        operator.start()
        # The operator has seen the pools (their possible capacity) before the jobs come.
        poll(
            lambda: all(
                (
                    custom.get_cluster_custom_object(GROUP, VERSION, "gpupools", p).get("status")
                    or {}
                ).get("gpusPossible")
                for p in pools
            ),
            60,
        )
        yield Autoscaled(pools, client.CoreV1Api(api), custom, operator)
    finally:
        karpenter.stop()
        operator.stop()
        if not args.keep_cluster:
            cluster.down()
