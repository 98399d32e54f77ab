"""A real node autoscaler under the operator: Karpenter (kwok provider) grows an autoscaled
GPUPool from zero nodes for a job and shrinks it back once the job is gone.

The operator plans on the capacity the pool may add and creates worker pods pinned to the
pool and zone; Karpenter sees them pending and creates nodes labelled as GKE labels the node
pool's nodes (node pool, accelerator, zone, nvidia.com/gpu allocatable, GPU taint), the
cluster's kwok makes them Ready, the scheduler binds the pods and the job runs. Deleting the
job leaves the nodes empty and Karpenter removes them: nothing the operator leaves behind
pins a node. Karpenter runs only in this module's fixture (it watches every pending pod).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_process import OperatorProcess
from test_autoscaled_pools_cluster import pod_gpus, pool_status, submit, zone_of
from test_operator_cluster import pods_of, wait_phase
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.api.gpupool import GPUPool
from sailplan_dev.localcluster.karpenter import Karpenter
from sailplan_dev.localcluster.karpenter_shapes import (
    NODEPOOL_OF_NODE_LABEL,
    instance_types,
    node_pools,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ZONE = "us-central1-b"
GPUS_PER_NODE = 4  # a2-highgpu-4g
MAX_NODES = 2
AUTOSCALING: dict[str, Any] = {
    "zones": [ZONE],
    "machineType": "a2-highgpu-4g",
    "minNodesPerZone": 0,
    "maxNodesPerZone": MAX_NODES,
    "provisioningSeconds": 30,
}


@pytest.fixture
def karpenter(
    kubeconfig: str, k8s_api: Any, local_cluster: Any, tmp_path: Path
) -> Iterator[Karpenter]:
    """Karpenter against the session's local cluster (its kwok must play the new nodes'
    kubelets, hence local_cluster), stopped after the test with its nodes removed."""
    running = Karpenter(Path(kubeconfig), k8s_api, tmp_path / "karpenter")
    running.start(instance_types([ZONE]))
    try:
        yield running
    finally:
        running.stop()


def nodes_of(k8s_api: Any, node_pool: str) -> list[Any]:
    nodes: list[Any] = (
        client.CoreV1Api(k8s_api)
        .list_node(label_selector=f"cloud.google.com/gke-nodepool={node_pool}")
        .items
    )
    return nodes


def ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ())


def explainer(
    k8s_api: Any, karpenter: Karpenter, namespace: str, job: str, node_pool: str
) -> Callable[[], str]:
    """What a timeout shows: the node claims, the pool's nodes, the job's pods, Karpenter's
    last log lines (why it did or did not provision or remove)."""

    def explain() -> str:
        claims = [
            f"  {c['metadata']['name']} "
            + " ".join(
                f"{k['type']}={k['status']}" for k in (c.get("status") or {}).get("conditions", [])
            )
            for c in karpenter.node_claims()
        ]
        nodes = [
            f"  {n.metadata.name} ready={ready(n)} deleting={n.metadata.deletion_timestamp}"
            f" taints={[t.key for t in n.spec.taints or ()]}"
            for n in nodes_of(k8s_api, node_pool)
        ]
        pods = [
            f"  {p.metadata.name} {p.status.phase} on {p.spec.node_name}"
            for p in pods_of(k8s_api, namespace, job)
        ]
        return "\n".join(
            [
                "node claims:",
                *claims,
                "nodes:",
                *nodes,
                "pods:",
                *pods,
                "karpenter log:",
                karpenter.log_tail(),
            ]
        )

    return explain


def test_karpenter_grows_a_pool_from_zero_for_a_job_and_removes_the_nodes_after(
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
    karpenter: Karpenter,
) -> None:
    node_pool = f"karp-{uuid.uuid4().hex[:6]}"
    name = gpupools(node_pool, autoscaling=AUTOSCALING)
    pool = GPUPool.model_validate(
        {"name": name, "spec": {"nodePool": node_pool, "autoscaling": AUTOSCALING}}
    )
    karpenter.apply_node_pools(node_pools(pool, consolidate_after_s=0))
    explain = explainer(k8s_api, karpenter, namespace, "grow", node_pool)
    assert not nodes_of(k8s_api, node_pool)

    submit(k8s_api, namespace, "grow", name)
    pods = wait_for("worker pods created", lambda: pods_of(k8s_api, namespace, "grow"), 120)
    assert {zone_of(p) for p in pods} == {ZONE}

    def running() -> list[Any] | None:
        current = pods_of(k8s_api, namespace, "grow")
        ok = current and all(p.status.phase == "Running" for p in current)
        return current if ok else None

    bound = wait_for("worker pods Running on nodes Karpenter added", running, 120, explain)
    nodes = {n.metadata.name: n for n in nodes_of(k8s_api, node_pool)}
    used = {p.spec.node_name for p in bound}
    assert used <= set(nodes)
    # Nodes as GKE would label and size them, in the zone the pods are pinned to.
    for node in nodes.values():
        labels = node.metadata.labels
        assert labels["cloud.google.com/gke-accelerator"] == "nvidia-tesla-a100"
        assert labels["topology.kubernetes.io/zone"] == ZONE
        assert labels["node.kubernetes.io/instance-type"] == "a2-highgpu-4g"
        assert labels[NODEPOOL_OF_NODE_LABEL] == name  # the NodePool made from the GPUPool
        assert node.status.allocatable["nvidia.com/gpu"] == str(GPUS_PER_NODE)
        assert ("nvidia.com/gpu", "NoSchedule") in {(t.key, t.effect) for t in node.spec.taints}
    # The workers fill whole nodes (no node half used while another is added), and the
    # pool's limit holds: nodes of a plan the job replaced before they came count too.
    assert len(used) == -(-pod_gpus(bound) // GPUS_PER_NODE)
    assert len(nodes) <= MAX_NODES
    wait_phase(k8s_api, namespace, "grow", {"Running"}, 60)
    # The GPUPool counts Karpenter's nodes as its own (they carry what it selects) and holds
    # no reservation once the workers are bound.
    wait_for(
        "the GPUPool status to count the new nodes, nothing reserved",
        lambda: (
            (s := pool_status(k8s_api, name)).get("nodesReady", 0) >= len(used)
            and s.get("gpusReserved", 0) == 0
        ),
        60,
        lambda: str(pool_status(k8s_api, name)),
    )

    client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", "grow"
    )
    wait_for(
        "Karpenter to remove the emptied nodes",
        lambda: not nodes_of(k8s_api, node_pool),
        120,
        explain,
    )
