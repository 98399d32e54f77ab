"""A job plans on the nodes it may preempt: a ready node whose GPUs only lower-priority pods
hold counts as free for a job of higher priority (reconcile.snapshot.with_preemptible)."""

from __future__ import annotations

from operator_builders import pool

from sailplan.operator.api.gpupool import NODEPOOL_LABEL, ZONE_LABEL, GPUPool
from sailplan.operator.reconcile.nodes import NodeInfo, pod_priority
from sailplan.operator.reconcile.snapshot import build_snapshot, with_preemptible

ZONE = "us-central1-a"


def node(name: str, *, ready: bool = True) -> NodeInfo:
    labels = {NODEPOOL_LABEL: "a100-ondemand", ZONE_LABEL: ZONE}
    return NodeInfo(name, labels, ready=ready, gpus_allocatable=4)


def busy_pool() -> GPUPool:
    """Four ready 4-GPU nodes: n0 free, n1..n3 with GPU pods."""
    base = pool("a100", "a100-ondemand", {ZONE: 4})
    zone = base.status.zones[0].model_copy(update={"nodes_free": 1})
    return base.model_copy(update={"status": base.status.model_copy(update={"zones": (zone,)})})


NODES = {n.name: n for n in (node("n0"), node("n1"), node("n2"), node("n3", ready=False))}
# n1's GPU pods have priority 100, n2's 1000; n3 holds priority-0 pods but is NotReady.
PRIORITIES = {"n1": 100, "n2": 1000, "n3": 0}


def free_nodes(priority: int) -> int:
    (adjusted,) = with_preemptible([busy_pool()], NODES, PRIORITIES, priority)
    (zone,) = adjusted.status.zones
    return zone.nodes_free


def test_only_nodes_of_strictly_lower_priority_become_free() -> None:
    assert free_nodes(0) == 1  # no priority: only the free node
    assert free_nodes(100) == 1  # equal priority never preempts
    assert free_nodes(101) == 2  # n1's pods give way
    assert free_nodes(5000) == 3  # n1 and n2; never the NotReady n3


def test_the_planner_sees_the_preemptible_nodes() -> None:
    (adjusted,) = with_preemptible([busy_pool()], NODES, PRIORITIES, 5000)
    (planner_pool,) = build_snapshot([adjusted]).pools
    assert planner_pool.nodes == 3


def test_priority_comes_from_the_pods_resolved_spec_priority() -> None:
    assert pod_priority({"spec": {"priority": 1000, "priorityClassName": "high"}}) == 1000
    assert pod_priority({"spec": {"priorityClassName": "high"}}) == 0  # not admitted yet
    assert pod_priority({}) == 0
