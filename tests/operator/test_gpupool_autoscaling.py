"""Autoscaled GPUPools: status from the spec's limits and shape, obtainable capacity in the
planner's snapshot, and reservations by unbound workers so two jobs never count the same
GPUs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from operator_builders import pool
from pydantic import ValidationError

from sailplan.operator.api import gpupool as api
from sailplan.operator.api.common import find_condition
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.reconcile.gpupool import pool_status
from sailplan.operator.reconcile.nodes import NodeInfo, node_info, pod_gpu_reservation
from sailplan.operator.reconcile.snapshot import build_snapshot, usable_nodes, with_reservations
from sailplan.operator.replan.triggers import capacity_snapshot, pod_facts
from sailplan.planner.catalog import Catalog, default_catalog

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return default_catalog()


def autoscaled(gpu_type: str | None = None, **autoscaling: Any) -> GPUPool:
    spec: dict[str, Any] = {
        "nodePool": "a100",
        "autoscaling": {"zones": [ZONE_A, ZONE_B]} | autoscaling,
    }
    if gpu_type is not None:
        spec["gpuType"] = gpu_type
    return GPUPool.model_validate({"name": "a100", "generation": 1, "spec": spec})


def node(name: str, zone: str, *, ready: bool = True) -> NodeInfo:
    return NodeInfo(
        name=name,
        labels={api.NODEPOOL_LABEL: "a100", api.ZONE_LABEL: zone},
        ready=ready,
        gpus_allocatable=4,
    )


def test_pool_at_zero_takes_type_and_size_from_the_machine_type(catalog: Catalog) -> None:
    spec = autoscaled(machineType="a2-highgpu-4g", maxNodesPerZone=2, provisioningSeconds=480)
    status = pool_status(spec, [], {}, catalog, NOW)
    assert status.gpu_type == "A100-40"
    assert [(z.zone, z.nodes_possible, z.gpus_possible, z.gpus_per_node) for z in status.zones] == [
        (ZONE_A, 2, 8, 4),
        (ZONE_B, 2, 8, 4),
    ]
    ready = find_condition(status.conditions, api.READY)
    assert ready is not None and (ready.status, ready.reason) == ("True", api.REASON_CAN_GROW)
    snapshot = build_snapshot([spec.model_copy(update={"status": status})])
    assert [
        (p.name, p.nodes, p.obtainable_nodes, p.provisioning_seconds) for p in snapshot.pools
    ] == [
        (f"a100/{ZONE_A}", 2, 2, 480.0),
        (f"a100/{ZONE_B}", 2, 2, 480.0),
    ]


def test_existing_and_provisioning_nodes_count_against_the_maximum(catalog: Catalog) -> None:
    spec = autoscaled("A100", gpusPerNode=4, maxNodesPerZone=3)
    nodes = [node("a1", ZONE_A), node("a2", ZONE_A, ready=False)]
    status = pool_status(spec, nodes, {}, catalog, NOW)
    a, b = status.zones
    assert (a.nodes_ready, a.nodes_provisioning, a.nodes_possible) == (1, 1, 1)
    assert (b.nodes_ready, b.nodes_possible) == (0, 3)
    # The planner sees the free ready node plus the one the zone may still add.
    pools = build_snapshot([spec.model_copy(update={"status": status})]).pools
    assert (pools[0].nodes, pools[0].obtainable_nodes, pools[0].ready_nodes) == (2, 1, 1)


def test_a_node_still_starting_stays_capacity_the_pool_may_add(catalog: Catalog) -> None:
    # Karpenter creates the Node before its kubelet reports (no Ready condition): at the
    # maximum, a job planned on both nodes must still see two while the second comes up,
    # or it replans for capacity it never lost
    spec = autoscaled("A100", gpusPerNode=4, maxNodesPerZone=2)
    starting = NodeInfo(
        name="a2",
        labels={api.NODEPOOL_LABEL: "a100", api.ZONE_LABEL: ZONE_A},
        gpus_allocatable=4,
        starting=True,
    )
    status = pool_status(spec, [node("a1", ZONE_A), starting], {}, catalog, NOW)
    a = status.zones[0]
    assert (a.nodes_ready, a.nodes_provisioning, a.nodes_possible) == (1, 1, 1)
    pools = build_snapshot([spec.model_copy(update={"status": status})]).pools
    assert (pools[0].nodes, pools[0].obtainable_nodes) == (2, 1)
    # a node whose kubelet stopped answering (Ready False) is not coming back by itself
    lost = pool_status(
        spec, [node("a1", ZONE_A), node("a2", ZONE_A, ready=False)], {}, catalog, NOW
    )
    assert lost.zones[0].nodes_possible == 0


def test_node_info_tells_a_starting_node_from_a_lost_one() -> None:
    def info(conditions: list[dict[str, str]]) -> NodeInfo:
        return node_info({"metadata": {"name": "n"}, "status": {"conditions": conditions}})

    assert info([]).starting and not info([]).ready
    assert not info([{"type": "Ready", "status": "False"}]).starting
    assert not info([{"type": "Ready", "status": "Unknown"}]).starting
    assert info([{"type": "Ready", "status": "True"}]).ready


def test_a_pool_wide_maximum_is_split_over_the_zones_never_exceeding_it(catalog: Catalog) -> None:
    spec = autoscaled(machineType="a3-highgpu-8g", totalMaxNodes=5)
    status = pool_status(spec, [node("a1", ZONE_A)], {}, catalog, NOW)
    assert status.gpu_type == "H100-80"
    assert sum(z.nodes_possible for z in status.zones) == 4
    assert sorted(z.nodes_possible for z in status.zones) == [2, 2]


def test_gpu_type_contradicting_the_machine_type_is_a_condition(catalog: Catalog) -> None:
    spec = autoscaled("A100", machineType="g2-standard-48", maxNodesPerZone=1)
    status = pool_status(spec, [], {}, catalog, NOW)
    condition = find_condition(status.conditions, api.GPU_TYPE_RESOLVED)
    assert status.gpu_type is None
    assert condition is not None and condition.reason == api.REASON_SHAPE_MISMATCH
    assert build_snapshot([spec.model_copy(update={"status": status})]).pools == ()


def test_unknown_machine_type_is_refused_by_the_model() -> None:
    with pytest.raises(ValidationError, match="unknown machine type"):
        autoscaled(machineType="a9-imaginary-4g", maxNodesPerZone=1)


@pytest.mark.parametrize(
    ("free", "obtainable", "reserved", "expected"),
    [
        (2, 3, 0, (2, 3)),
        (2, 3, 4, (1, 3)),  # one whole node of the free ones
        (2, 3, 5, (0, 3)),  # 5 GPUs take two 4-GPU nodes
        (1, 3, 12, (0, 1)),  # free first, then obtainable
        (0, 1, 16, (0, 0)),
    ],
)
def test_reserved_gpus_take_whole_nodes_free_first(
    free: int, obtainable: int, reserved: int, expected: tuple[int, int]
) -> None:
    assert usable_nodes(free, obtainable, reserved, 4) == expected


def worker_pod(
    job: str, pool_name: str, zone: str, gpus: int, *, node: str | None = None, **status: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": api.NODEPOOL_LABEL,
                                    "operator": "In",
                                    "values": [pool_name],
                                },
                                {"key": api.ZONE_LABEL, "operator": "In", "values": [zone]},
                            ]
                        }
                    ]
                }
            }
        },
        "containers": [{"name": "trainer", "resources": {"limits": {api.GPU_RESOURCE: str(gpus)}}}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": f"{job}-g1-a0-w0",
            "labels": {
                "sailplan.dev/job": job,
                "sailplan.dev/gpupool": pool_name,
                "sailplan.dev/plan-generation": "1",
                "sailplan.dev/attempt": "0",
                "sailplan.dev/worker-index": "0",
            },
        },
        "spec": spec,
        "status": status or {"phase": "Pending"},
    }


def test_only_unbound_live_workers_reserve() -> None:
    assert pod_gpu_reservation(worker_pod("a", "a100", ZONE_A, 4)) == ("a100", ZONE_A, 4)
    assert pod_gpu_reservation(worker_pod("a", "a100", ZONE_A, 4, node="n1")) is None
    assert pod_gpu_reservation(worker_pod("a", "a100", ZONE_A, 4, phase="Failed")) is None
    deleting = worker_pod("a", "a100", ZONE_A, 4)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_gpu_reservation(deleting) is None


def test_a_second_job_never_counts_gpus_the_first_one_reserved() -> None:
    # One free 4-GPU node: job A's two unbound workers (2 GPUs each) reserve all of it.
    pools = [pool("a100", "a100", {ZONE_A: 1})]
    a_pods = [worker_pod("a", "a100", ZONE_A, 2), worker_pod("a", "a100", ZONE_A, 2)]
    reservations = [r for r in map(pod_gpu_reservation, a_pods) if r is not None]
    live = with_reservations(pools, reservations)
    assert live[0].status.zones[0].gpus_reserved == 4

    job_b = capacity_snapshot(live, (), {})
    assert job_b.pools == ()  # nothing left for B
    # Job A still sees its own reservation as its capacity (it does not replan away).
    own = [p for p in map(pod_facts, a_pods) if p is not None]
    job_a = capacity_snapshot(live, own, {})
    assert [(p.name, p.nodes) for p in job_a.pools] == [(f"a100/{ZONE_A}", 1)]


def test_bound_or_removed_workers_leave_nothing_pinned() -> None:
    pools = [pool("a100", "a100", {ZONE_A: 1})]
    gone = with_reservations(pools, [])
    bound = [pod_gpu_reservation(worker_pod("a", "a100", ZONE_A, 4, node="n1"))]
    assert bound == [None]
    assert [p.nodes for p in capacity_snapshot(gone, (), {}).pools] == [1]
