"""A planning pass reads capacity in several reads (its job's workers, the GPUPools, the
nodes, every job's live workers); what changes between them must not make the job's own
plan seem a node short. Both cases below were seen with Karpenter adding a job's two nodes
a moment apart: the job took a CapacityLost ("1 usable nodes, the plan needs 2"), replanned
onto other GPUs, and switched back a moment later.

- The nodes are read after the GPUPools (controller.observation.observe). The GPUPool
  status is written from the node index; read before the pools, the index could miss a node
  the status already counts as ready, which was then neither free (the pass counts free
  nodes from the index, at most the status's ready ones) nor possible (it exists).
- A worker bound between the read of its job's children and the read of every live worker
  holds its node in both (triggers.with_bindings): taken as unbound from the first read it
  held no node, and the second read counted its node busy and its GPUs no longer reserved.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from sailplan.operator.api import gpupool as api
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.controller.observation import observe
from sailplan.operator.reconcile.gpupool import pool_status
from sailplan.operator.reconcile.nodes import NodeInfo
from sailplan.operator.reconcile.snapshot import with_in_use, with_reservations
from sailplan.operator.replan.triggers import WorkerPod, capacity_snapshot, with_bindings
from sailplan.planner.catalog import default_catalog
from sailplan.planner.profiles.types import ProfileSet

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
ZONE = "us-central1-b"
POOL = GPUPool.model_validate(
    {
        "name": "a100",
        "generation": 1,
        "spec": {
            "nodePool": "a100",
            "autoscaling": {"zones": [ZONE], "machineType": "a2-highgpu-4g", "maxNodesPerZone": 2},
        },
    }
)


def karpenter_node(name: str, *, ready: bool) -> NodeInfo:
    """A node Karpenter created: no Ready condition until kwok (its kubelet) reports."""
    return NodeInfo(
        name=name,
        labels={api.NODEPOOL_LABEL: "a100", api.ZONE_LABEL: ZONE},
        ready=ready,
        starting=not ready,
        gpus_allocatable=4,
    )


class StatusWrittenMeanwhile:
    """The API server as one pass sees it: the job has no children yet, and while the pass
    lists the GPUPools, node a turns Ready and the pool status is rewritten from the index
    (the operator's own GPUPool refresh, on the node's event)."""

    def __init__(self, index: dict[str, list[NodeInfo]]) -> None:
        self.index = index

    def list_job_children(self, namespace: str, name: str) -> tuple[list[Any], list[Any], bool]:
        return [], [], False

    def list_profiling_jobs(self, namespace: str, name: str) -> list[Any]:
        return []

    def list_pools(self) -> list[dict[str, Any]]:
        self.index["a"] = [karpenter_node("a", ready=True)]
        nodes = [info for store in self.index.values() for info in store]
        status = pool_status(POOL, nodes, {}, default_catalog(), NOW)
        return [
            {
                "metadata": {"name": POOL.name, "generation": 1},
                "spec": POOL.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
                "status": status.model_dump(mode="json", by_alias=True, exclude_none=True),
            }
        ]


def test_a_node_turning_ready_during_the_pass_is_free_not_lost() -> None:
    index = {name: [karpenter_node(name, ready=False)] for name in ("a", "b")}
    job = TrainingJob.model_validate(
        {
            "name": "grow",
            "namespace": "team-a",
            "spec": {
                "model": {"name": "OPT-350M"},
                "training": {"globalBatchSize": 16, "steps": 10},
                "trainer": {"image": "trainer:test"},
                "checkpoint": {"storage": {"uri": "gs://bucket/ckpt"}},
            },
        }
    )
    observed = asyncio.run(observe(StatusWrittenMeanwhile(index), job, ProfileSet(), index))  # type: ignore[arg-type]
    (written,) = observed.pools[0].status.zones
    # The status: node a ready, node b still to come (possible).
    assert (written.nodes_ready, written.nodes_possible) == (1, 1)
    assert observed.nodes["a"].ready
    # What the pass plans on: node a free, node b obtainable; two nodes, as the job's plan
    # counted when it was made.
    (zone,) = with_in_use(observed.pools, observed.nodes, {})[0].status.zones
    assert (zone.nodes_free, zone.nodes_possible) == (1, 1)


def worker(index: int, node: str | None) -> WorkerPod:
    return WorkerPod(
        name=f"grow-g1-a0-w{index}",
        uid=f"uid-w{index}",
        generation=1,
        attempt=0,
        worker_index=index,
        node=node,
        gpupool=POOL.name,
        reservation=None if node else (POOL.name, ZONE, 4),
    )


def test_a_worker_bound_between_the_two_reads_holds_its_node_in_both() -> None:
    nodes = {name: karpenter_node(name, ready=True) for name in ("a", "b")}
    # The live read: both workers bound, a node each.
    in_use = {"a": 4, "b": 4}
    status = pool_status(POOL, list(nodes.values()), in_use, default_catalog(), NOW)
    pools = with_in_use(
        with_reservations([POOL.model_copy(update={"status": status})], []), nodes, in_use
    )
    # The job's children, listed a moment before: w1 not bound yet.
    listed = (worker(0, "a"), worker(1, None))
    (seemed,) = capacity_snapshot(pools, listed, nodes).pools
    assert seemed.nodes == 1  # what the pass planned on before: its plan a node short
    current = with_bindings(listed, {"uid-w0": "a", "uid-w1": "b"}, nodes)
    assert [(w.node, w.reservation) for w in current] == [("a", None), ("b", None)]
    (seen,) = capacity_snapshot(pools, current, nodes).pools
    assert (seen.nodes, seen.obtainable_nodes) == (2, 0)


def test_a_binding_onto_a_node_the_pass_does_not_know_is_left_out() -> None:
    # The node would read as gone (NodeLost) rather than as the worker's.
    known = {"a": karpenter_node("a", ready=True)}
    listed = (worker(0, None),)
    assert with_bindings(listed, {"uid-w0": "new"}, known) == listed
    # and a worker with no uid (never stored) or already bound keeps what it had
    unsaved = WorkerPod(name="x", generation=1, attempt=0, worker_index=0)
    assert with_bindings((unsaved,), {"": "a"}, known) == (unsaved,)
    bound = worker(0, "a")
    assert with_bindings((bound,), {"uid-w0": "b"}, {**known, "b": known["a"]}) == (bound,)
