"""The local control plane behaves like a GKE cluster to a client: real scheduling, real controllers.

Expected values come from the node file (read here as plain YAML, independently of the code
that turns it into Node objects) and from Kubernetes' documented behaviour: the scheduler
honours taints, node affinity and extended resources; the node lifecycle controller taints
NotReady nodes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from kubernetes import client
from typer.testing import CliRunner
from waiting import wait_for

from sailplan_dev.cli import register
from sailplan_dev.localcluster import build, kwokctl
from sailplan_dev.localcluster.cluster import LocalCluster
from sailplan_dev.localcluster.kubeconfig import server
from sailplan_dev.localcluster.nodes import load_node_file

pytestmark = pytest.mark.cluster

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _default_file() -> dict[str, Any]:
    text = (
        resources.files("sailplan_dev.localcluster")
        .joinpath("data", "gke-default.yaml")
        .read_text()
    )
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def _eventually(check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    return wait_for("the cluster to converge", check, timeout_s, interval_s=0.5)


def _gpu_pod(name: str, gpus: int, match: dict[str, str], tolerate: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "worker",
                    "image": "sailplan/trainer:test",
                    "resources": {
                        "requests": {"nvidia.com/gpu": str(gpus)},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
            "tolerations": [GPU_TOLERATION] if tolerate else [],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": k, "operator": "In", "values": [v]}
                                    for k, v in match.items()
                                ]
                            }
                        ]
                    }
                }
            },
        },
    }


def test_control_plane_components_are_running(k8s_api: Any, local_cluster: LocalCluster) -> None:
    version = client.VersionApi(k8s_api).get_code()
    assert version.git_version == build.K8S_VERSION

    # The scheduler and controller manager each hold their leader-election lease: proof the
    # real components run against this API server, not just etcd + apiserver. A component
    # takes its lease a moment after the cluster answers, so a fresh cluster may not show it.
    def holders() -> dict[str, str] | None:
        leases = client.CoordinationV1Api(k8s_api).list_namespaced_lease("kube-system").items
        found = {lease.metadata.name: lease.spec.holder_identity for lease in leases}
        wanted = ("kube-scheduler", "kube-controller-manager")
        return found if all(found.get(name) for name in wanted) else None

    wait_for("the scheduler's and controller manager's leases", holders, 60)
    # The controller manager's service-account controller made the default account.
    core = client.CoreV1Api(k8s_api)
    assert core.read_namespaced_service_account("default", "default").metadata.name == "default"


def test_nodes_carry_the_gke_labels_taints_and_allocatable_of_the_node_file(
    k8s_api: Any, local_cluster: LocalCluster
) -> None:
    local_cluster.reset_nodes()
    core = client.CoreV1Api(k8s_api)
    spec = _default_file()
    for pool in spec["pools"]:
        nodes = core.list_node(label_selector=f"cloud.google.com/gke-nodepool={pool['name']}").items
        per_zone: dict[str, int] = {}
        for node in nodes:
            labels = node.metadata.labels
            zone = labels["topology.kubernetes.io/zone"]
            per_zone[zone] = per_zone.get(zone, 0) + 1
            assert labels["topology.kubernetes.io/region"] == zone.rsplit("-", 1)[0]
            assert labels["node.kubernetes.io/instance-type"] == pool["machine_type"]
            assert labels["cloud.google.com/gke-spot"] == str(pool.get("spot", False)).lower()
            allocatable = node.status.allocatable
            assert allocatable["cpu"] == pool["cpu"]
            assert allocatable["memory"] == pool["memory"]
            assert node.status.capacity["cpu"] == pool["cpu"]
            taints = [(t.key, t.value, t.effect) for t in node.spec.taints or ()]
            if "accelerator" in pool:
                assert labels["cloud.google.com/gke-accelerator"] == pool["accelerator"]
                assert allocatable["nvidia.com/gpu"] == str(pool["gpus_per_node"])
                assert ("nvidia.com/gpu", "present", "NoSchedule") in taints
            else:
                assert "nvidia.com/gpu" not in allocatable
                assert "cloud.google.com/gke-accelerator" not in labels
            assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        assert per_zone == pool["zones"]


def test_scheduler_binds_a_gpu_pod_to_exactly_its_pool_and_zone(
    k8s_api: Any, namespace: str, local_cluster: LocalCluster
) -> None:
    core = client.CoreV1Api(k8s_api)
    # v100-ondemand spans us-central1-a and us-west1-b; v100-spot is also in us-west1-b: only
    # the affinity on both labels narrows the choice to three nodes.
    want = {
        "cloud.google.com/gke-nodepool": "v100-ondemand",
        "topology.kubernetes.io/zone": "us-west1-b",
    }
    core.create_namespaced_pod(namespace, _gpu_pod("w0", 2, want))

    def running() -> Any:
        pod = core.read_namespaced_pod("w0", namespace)
        return pod if pod.status.phase == "Running" else None

    pod = _eventually(running)
    node = core.read_node(pod.spec.node_name)
    for key, value in want.items():
        assert node.metadata.labels[key] == value
    # kwok's pod stage reports the container as started, as a kubelet would.
    assert pod.status.container_statuses[0].ready is True


def test_gpu_pod_without_toleration_is_kept_off_gpu_nodes(
    k8s_api: Any, namespace: str, local_cluster: LocalCluster
) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_pod(
        namespace,
        _gpu_pod("untolerated", 1, {"cloud.google.com/gke-nodepool": "a100-ondemand"}, False),
    )
    condition = _eventually(lambda: _unschedulable(core, namespace, "untolerated"))
    assert "untolerated taint" in condition.message
    assert core.read_namespaced_pod("untolerated", namespace).spec.node_name is None


def _unschedulable(core: Any, namespace: str, name: str) -> Any:
    pod = core.read_namespaced_pod(name, namespace)
    for condition in pod.status.conditions or ():
        if condition.type == "PodScheduled" and condition.status == "False":
            return condition
    return None


def test_pod_asking_more_gpus_than_any_node_stays_pending(
    k8s_api: Any, namespace: str, local_cluster: LocalCluster
) -> None:
    core = client.CoreV1Api(k8s_api)
    most = max(p.get("gpus_per_node", 0) for p in _default_file()["pools"])
    core.create_namespaced_pod(
        namespace, _gpu_pod("greedy", most + 1, {"kubernetes.io/os": "linux"})
    )
    condition = _eventually(lambda: _unschedulable(core, namespace, "greedy"))
    assert condition.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in condition.message
    assert core.read_namespaced_pod("greedy", namespace).status.phase == "Pending"


def test_added_node_takes_pods_and_deleting_it_is_reflected(
    k8s_api: Any, namespace: str, local_cluster: LocalCluster
) -> None:
    core = client.CoreV1Api(k8s_api)
    try:
        # a100-spot has no node in us-central1-c yet: the pool scales into a new zone.
        name = local_cluster.add_node("a100-spot", "us-central1-c")
        assert name == "a100-spot-us-central1-c-0"
        assert (
            local_cluster.core.read_node(name).metadata.labels["topology.kubernetes.io/zone"]
            == "us-central1-c"
        )
        want = {"kubernetes.io/hostname": name}
        core.create_namespaced_pod(namespace, _gpu_pod("on-new", 4, want))
        _eventually(lambda: core.read_namespaced_pod("on-new", namespace).spec.node_name == name)

        local_cluster.delete_node(name)
        assert name not in local_cluster.node_names()
        core.create_namespaced_pod(namespace, _gpu_pod("after", 1, want))
        condition = _eventually(lambda: _unschedulable(core, namespace, "after"))
        assert "didn't match Pod's node affinity" in condition.message
    finally:
        local_cluster.reset_nodes()


def test_not_ready_node_is_tainted_by_the_node_lifecycle_controller(
    local_cluster: LocalCluster,
) -> None:
    core = local_cluster.core
    name = local_cluster.node_names("cloud.google.com/gke-nodepool=v100-spot")[0]
    try:
        local_cluster.set_node_ready(name, False)

        def tainted() -> bool:
            taints = core.read_node(name).spec.taints or ()
            return any(t.key == "node.kubernetes.io/not-ready" for t in taints)

        _eventually(tainted)
        local_cluster.set_node_ready(name, True)
        _eventually(lambda: not tainted())
    finally:
        local_cluster.reset_nodes()


def test_cordon_marks_the_node_unschedulable(local_cluster: LocalCluster) -> None:
    name = local_cluster.node_names("cloud.google.com/gke-nodepool=a100-ondemand")[0]
    try:
        local_cluster.cordon(name)
        node = local_cluster.core.read_node(name)
        assert node.spec.unschedulable is True
        # The node lifecycle controller mirrors cordoning into the unschedulable taint.
        _eventually(
            lambda: any(
                t.key == "node.kubernetes.io/unschedulable"
                for t in local_cluster.core.read_node(name).spec.taints or ()
            )
        )
    finally:
        local_cluster.reset_nodes()


def test_cluster_env_prints_a_usable_export_line(local_cluster: LocalCluster) -> None:
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    result = CliRunner().invoke(app, ["cluster", "env", "--name", local_cluster.name])
    assert result.exit_code == 0, result.output
    line = result.output.strip()
    assert line.startswith("export KUBECONFIG=")
    kubectl = build.binary_path("kubectl")
    shell = f'{line}\n"{kubectl}" get nodes -o name --request-timeout=20s'
    out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True)
    assert sorted(out.stdout.split()) == [f"node/{n}" for n in local_cluster.node_names()]


def test_a_second_cluster_coexists_and_up_is_idempotent(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        "pools:\n"
        "  - {name: l4, accelerator: nvidia-l4, gpus_per_node: 1, machine_type: g2-standard-8,"
        " zones: {europe-west4-a: 1}}\n"
    )
    second = LocalCluster.up(load_node_file(nodes), name=f"pytest-{os.getpid()}-second")
    try:
        assert server(second.kubeconfig) != server(local_cluster.kubeconfig)
        assert second.node_names() == ["l4-europe-west4-a-0"]
        assert "l4-europe-west4-a-0" not in local_cluster.node_names()
        # up again: same processes (same API server), the deleted node is created again.
        second.delete_node("l4-europe-west4-a-0")
        again = LocalCluster.up(load_node_file(nodes), name=second.name)
        assert server(again.kubeconfig) == server(second.kubeconfig)
        assert again.node_names() == ["l4-europe-west4-a-0"]
        # Killed API server and etcd (a crash, a reboot): up restarts the processes and the
        # objects survive in etcd's data directory (same node uid: not recreated).
        uid = again.core.read_node("l4-europe-west4-a-0").metadata.uid
        pids = kwokctl.cluster_dir(second.name) / "pids"
        for component in ("kube-apiserver", "etcd"):
            os.kill(int((pids / f"{component}.pid").read_text()), signal.SIGKILL)
        assert not again.healthy(within_s=1)
        restarted = LocalCluster.up(load_node_file(nodes), name=second.name)
        assert restarted.core.read_node("l4-europe-west4-a-0").metadata.uid == uid
    finally:
        second.down()
    assert not second.healthy()
    assert local_cluster.healthy()


def test_spot_preemption_fails_pods_with_disruption_target_and_removes_the_node(
    k8s_api: Any, namespace: str, local_cluster: LocalCluster
) -> None:
    core = client.CoreV1Api(k8s_api)
    name = local_cluster.node_names("cloud.google.com/gke-nodepool=a100-spot")[0]
    core.create_namespaced_pod(namespace, _gpu_pod("spot", 4, {"kubernetes.io/hostname": name}))
    _eventually(lambda: core.read_namespaced_pod("spot", namespace).status.phase == "Running")
    try:
        assert local_cluster.preempt_node(name) == [f"{namespace}/spot"]
        pod = core.read_namespaced_pod("spot", namespace)
        # What the kubelet's graceful node shutdown reports on a preempted spot VM.
        assert pod.status.phase == "Failed"
        disruption = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
        assert [(c.status, c.reason) for c in disruption] == [("True", "TerminationByKubelet")]
        assert name not in local_cluster.node_names()
        # kwok no longer owns the pod: it stays Failed instead of being revived.
        time.sleep(2)
        assert core.read_namespaced_pod("spot", namespace).status.phase == "Failed"
    finally:
        local_cluster.reset_nodes()


@pytest.mark.slow
def test_node_taken_from_kwok_goes_unknown_after_the_grace_period(
    local_cluster: LocalCluster,
) -> None:
    # The hand-over contract for the e2e runner: a node whose node-agent label is not "kwok"
    # gets no heartbeat from kwok, so the node lifecycle controller marks it Unknown once
    # --node-monitor-grace-period (50 s, upstream default) has passed since the last lease
    # renewal (every 10 s: a quarter of the 40 s lease), i.e. 40-50 s later.
    name = local_cluster.add_node("v100-spot", "us-west1-b")
    core = local_cluster.core
    try:
        start = time.monotonic()
        local_cluster.set_node_agent(name, "runner")
        assert core.read_node(name).metadata.labels["sailplan.dev/node-agent"] == "runner"

        def ready_status() -> str:
            node = core.read_node(name)
            return next(c.status for c in node.status.conditions if c.type == "Ready")

        _eventually(lambda: ready_status() == "Unknown", timeout_s=150)
        assert time.monotonic() - start > 30
    finally:
        local_cluster.reset_nodes()
