"""A worker that has just bound holds its node before the GPUPool status says so: the
planning pass reads the live workers fresh (reconcile.nodes.gpu_use) and lowers the
statuses' free nodes with them (reconcile.snapshot.with_in_use), so no other job's plan is
offered those GPUs in the moment between the binding and the status write."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from test_gpupool_autoscaling import node, worker_pod

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.reconcile.gpupool import pool_status
from sailplan.operator.reconcile.nodes import (
    busiest,
    gpu_use,
    held_priorities,
    other_pod_gpu_request,
)
from sailplan.operator.reconcile.snapshot import with_in_use, with_reservations
from sailplan.operator.replan.triggers import capacity_snapshot, pod_facts
from sailplan.planner.catalog import Catalog

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ZONE = "us-central1-a"
NODES = {n.name: n for n in (node("n1", ZONE), node("n2", ZONE))}


def written(
    catalog: Catalog, in_use: dict[str, int], nodes: Sequence[str] = ("n1", "n2")
) -> GPUPool:
    """The a100 GPUPool with the status the operator wrote when `nodes` and `in_use` were
    its view."""
    spec = GPUPool.model_validate(
        {"name": "a100", "generation": 1, "spec": {"nodePool": "a100", "gpuType": "A100-40"}}
    )
    status = pool_status(spec, [NODES[n] for n in nodes], in_use, catalog, NOW)
    return spec.model_copy(update={"status": status})


def pass_view(
    pools: list[GPUPool], live: list[dict[str, Any]], index: dict[str, int]
) -> list[GPUPool]:
    """The pools as the runtime's planning pass corrects them (controller.runtime): `live`
    the fresh list of workers, `index` the GPU use of the other pods (the "others" index)."""
    use = gpu_use(live)
    return list(
        with_in_use(with_reservations(pools, use.reservations), NODES, busiest(index, use.in_use))
    )


def free_nodes(pools: list[GPUPool], own: Sequence[dict[str, Any]] = ()) -> int:
    facts = [f for f in map(pod_facts, own) if f is not None]
    return sum(p.nodes for p in capacity_snapshot(pools, facts, NODES).pools)


def test_a_just_bound_worker_is_not_offered_to_another_job(catalog: Catalog) -> None:
    # The status was written before job A's worker bound to n1: both nodes free there.
    stale = written(catalog, {})
    assert stale.status.zones[0].nodes_free == 2
    bound = worker_pod("a", "a100", ZONE, 4, node="n1", phase="Running")
    # Neither the status nor an unbound-worker reservation counts it...
    assert free_nodes([stale]) == 2
    assert gpu_use([bound]).reservations == ()
    # ... the fresh list of live workers does: job B is offered n2 only.
    view = pass_view([stale], [bound], index={})
    assert free_nodes(view) == 1
    # Job A still counts its own node as its capacity, once (n1 held plus n2 free).
    assert free_nodes(view, own=[bound]) == 2
    # Once the status is rewritten with the worker counted, the view is the same.
    fresh = written(catalog, {"n1": 4})
    assert free_nodes(pass_view([fresh], [bound], index={})) == 1


def test_every_gpu_pod_the_index_has_counts_too(catalog: Catalog) -> None:
    # A GPU pod that is no Sailplan worker (not in the list) bound to n2 after the status.
    other = worker_pod("x", "a100", ZONE, 1, node="n2", phase="Running")
    del other["metadata"]["labels"]["sailplan.dev/gpupool"]
    assert other_pod_gpu_request(other) == ("n2", 1)
    assert other_pod_gpu_request(worker_pod("a", "a100", ZONE, 4, node="n1")) is None
    view = pass_view([written(catalog, {})], [], index={"n2": 1})
    assert free_nodes(view) == 1


def test_a_node_freed_since_the_status_was_written_counts_free(catalog: Catalog) -> None:
    # n1's worker finished after the status was written: the list no longer has it, the
    # status still counts n1 busy.
    stale = written(catalog, {"n1": 4})
    assert free_nodes([stale]) == 1
    assert free_nodes(pass_view([stale], [], index={})) == 2


def test_a_node_the_status_does_not_know_yet_is_not_counted(catalog: Catalog) -> None:
    # n2 joined after the status was written (with n1 only): not before the status counts
    # it ready, or an autoscaled pool would count it both free and still to be added.
    view = pass_view([written(catalog, {}, nodes=["n1"])], [], index={})
    assert free_nodes(view) == 1


def test_live_workers_hold_when_bound_and_reserve_when_not() -> None:
    pending = worker_pod("b", "a100", ZONE, 2)
    first = worker_pod("a", "a100", ZONE, 2, node="n1", phase="Running")
    second = worker_pod("a", "a100", ZONE, 2, node="n1", phase="Running")
    second["spec"]["priority"] = 1000
    done = worker_pod("c", "a100", ZONE, 4, node="n2", phase="Succeeded")
    use = gpu_use([pending, first, second, done])
    assert dict(use.in_use) == {"n1": 4}
    assert dict(use.priorities) == {"n1": 1000}
    assert use.reservations == (("a100", ZONE, 2),)
    assert busiest({"n1": 2, "n2": 1}, {"n1": 4}) == {"n1": 4, "n2": 1}


def test_a_node_whose_pods_are_gone_is_not_preemptible_as_well() -> None:
    # The priorities index still has n2's finished low-priority worker; the fresh view
    # counts n2 free, so it must not also count as a node to preempt.
    assert held_priorities({"n1": 10, "n2": 10}, {"n1": 4}) == {"n1": 10}
