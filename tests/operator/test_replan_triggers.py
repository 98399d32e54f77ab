"""Trigger classification: preemption vs real failure vs node loss, capacity and price changes.

Pure: worker pods are API dicts shaped as the kubelet and scheduler leave them.
"""

from __future__ import annotations

from typing import Any

from operator_builders import JOB_SPEC, pool

from sailplan.operator.api.gpupool import NODEPOOL_LABEL, ZONE_LABEL
from sailplan.operator.api.trainingjob import TrainingJobSpec
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.nodes import NodeInfo
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.operator.replan import triggers as t

ZONE = "us-central1-a"


def body(name: str, *, index: int = 0, node: str | None = "n0", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {
                naming.LABEL_GENERATION: "1",
                naming.LABEL_ATTEMPT: "0",
                naming.LABEL_WORKER: str(index),
                naming.LABEL_GPUPOOL: "a100",
            },
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": "Running", **status},
    }


def facts(name: str, **kwargs: Any) -> t.WorkerPod:
    parsed = t.pod_facts(body(name, **kwargs))
    assert parsed is not None
    return parsed


def node(name: str, *, ready: bool = True, cordoned: bool = False) -> NodeInfo:
    labels = {ZONE_LABEL: ZONE, NODEPOOL_LABEL: "a100-ondemand"}
    return NodeInfo(name, labels, ready=ready, unschedulable=cordoned, gpus_allocatable=4)


NODES = {"n0": node("n0"), "n1": node("n1")}
FAILED_EXIT_1 = {
    "phase": "Failed",
    "containerStatuses": [{"state": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
}


def test_disruption_target_is_a_preemption_not_a_failure() -> None:
    # GKE spot preemption: the pod ends Failed (exit 137 from SIGKILL) AND carries the
    # DisruptionTarget condition; the condition is what tells the two apart.
    pod = facts(
        "w0",
        phase="Failed",
        conditions=[
            {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
        ],
        containerStatuses=[{"state": {"terminated": {"exitCode": 137}}}],
    )
    fate, why = t.pod_fate(pod, NODES)
    assert fate is t.PodFate.PREEMPTED
    assert "TerminationByKubelet" in why


def test_eviction_reason_without_condition_is_a_preemption() -> None:
    # Clusters before 1.26 leave only status.reason = Evicted.
    fate, _ = t.pod_fate(facts("w0", phase="Failed", reason="Evicted"), NODES)
    assert fate is t.PodFate.PREEMPTED


def test_non_zero_exit_without_disruption_is_a_real_failure() -> None:
    fate, why = t.pod_fate(facts("w0", **FAILED_EXIT_1), NODES)
    assert fate is t.PodFate.FAILED
    assert "exit code 1" in why


def test_node_gone_or_not_ready_is_node_loss_and_cordon_is_its_own_fate() -> None:
    # The pod still says Running: the kubelet that would update it is gone with the node.
    assert t.pod_fate(facts("w0", node="vanished"), NODES)[0] is t.PodFate.NODE_LOST
    not_ready = {"n0": node("n0", ready=False)}
    assert t.pod_fate(facts("w0"), not_ready)[0] is t.PodFate.NODE_LOST
    cordoned = {"n0": node("n0", cordoned=True)}
    assert t.pod_fate(facts("w0"), cordoned)[0] is t.PodFate.CORDONED
    assert t.pod_fate(facts("w0"), NODES)[0] is t.PodFate.OK


def test_peer_failures_after_a_preemption_are_collateral() -> None:
    # Worker 1 is preempted; worker 0 then dies with exit 1 because its NCCL peer vanished.
    # Counting that as a real failure would spend the budget on a preemption.
    preempted = facts(
        "w1",
        index=1,
        node="n1",
        phase="Failed",
        conditions=[{"type": "DisruptionTarget", "status": "True"}],
    )
    report = t.classify_pods([facts("w0", **FAILED_EXIT_1), preempted], NODES)
    assert [p.name for p, _ in report.disrupted] == ["w1"]
    assert report.failed == ()


def test_capacity_snapshot_counts_the_jobs_own_healthy_nodes() -> None:
    # 3 nodes ready, the job's two workers hold n0 and n1 (so only 1 is free); one of the
    # job's nodes goes NotReady after the status was computed. Capacity for replanning:
    # the free node + the job's healthy node = 2, not 1 (free only) nor 3 (stale status).
    gpupool = pool("a100", "a100-ondemand", {ZONE: 3})
    zone = gpupool.status.zones[0].model_copy(update={"nodes_free": 1})
    gpupool = gpupool.model_copy(
        update={"status": gpupool.status.model_copy(update={"zones": (zone,)})}
    )
    pods = [facts("w0", node="n0"), facts("w1", index=1, node="n1")]
    nodes = {"n0": node("n0"), "n1": node("n1", ready=False)}
    snapshot = t.capacity_snapshot([gpupool], pods, nodes)
    assert [(p.name, p.nodes) for p in snapshot.pools] == [(f"a100/{ZONE}", 2)]


def test_nodes_needed_packs_tensor_parallel_groups_first_fit_decreasing() -> None:
    # Two TP-2 groups fill one 4-GPU node, four TP-1 groups the next: 2 nodes.
    assert t.nodes_needed([1, 2, 1, 2, 1, 1], 4) == 2
    # A TP-4 group never fits a 2-GPU node.
    assert t.nodes_needed([4], 2) > 1000


def test_compare_snapshots_tells_added_removed_and_repriced_apart() -> None:
    old = build_snapshot([pool("a100", "a", {ZONE: 2}), pool("v100", "v", {"us-west1-b": 2})])
    new = build_snapshot(
        [
            pool("a100", "a", {ZONE: 3}, pricing={"onDemandUsdPerGpuHour": 2.5}),
            pool("v100", "v", {"us-west1-b": 1}),
        ]
    )
    change = t.compare_snapshots(old, new)
    assert change.added == (f"a100/{ZONE}: +4 GPUs",)  # one more 4-GPU node
    assert change.removed == ("v100/us-west1-b: -4 GPUs",)
    assert change.repriced == (f"a100/{ZONE}: catalog price -> $2.50/GPU-h",)


def _voluntary(
    spec: TrainingJobSpec, old_pools: list[Any], new_pools: list[Any]
) -> t.Trigger | None:
    old = build_snapshot(old_pools)
    return t.voluntary_trigger(
        spec=spec,
        evaluated_spec=t.spec_fingerprint(TrainingJobSpec.model_validate(JOB_SPEC)),
        cluster=build_snapshot(new_pools),
        evaluated_hash=old.content_hash(),
        evaluated_cluster=old,
    )


def test_voluntary_triggers() -> None:
    spec = TrainingJobSpec.model_validate(JOB_SPEC)
    two, three = pool("a100", "a", {ZONE: 2}), pool("a100", "a", {ZONE: 3})
    cheaper = pool("a100", "a", {ZONE: 2}, pricing={"onDemandUsdPerGpuHour": 1.0})
    other = pool("v100", "v", {"us-west1-b": 2})
    added = _voluntary(spec, [two], [three])
    assert added is not None and added.name == t.CAPACITY_ADDED and not added.involuntary
    repriced = _voluntary(spec, [two], [cheaper])
    assert repriced is not None and repriced.name == t.PRICE_CHANGED
    # Fewer GPUs in a pool the plan may not even use cannot make a better plan.
    assert _voluntary(spec, [two, other], [two]) is None
    edited = TrainingJobSpec.model_validate(JOB_SPEC | {"objective": {"kind": "Cost"}})
    objective = _voluntary(edited, [two], [two])
    assert objective is not None and objective.name == t.OBJECTIVE_CHANGED
    # The checkpoint interval does not enter the plan: not a trigger.
    interval = JOB_SPEC | {"checkpoint": JOB_SPEC["checkpoint"] | {"intervalSteps": 5}}
    assert _voluntary(TrainingJobSpec.model_validate(interval), [two], [two]) is None
