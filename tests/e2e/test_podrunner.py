"""The pod runner plays the kubelet for real pods on the real API server and scheduler.

Each test creates pods directly (not through the operator), pinned by node affinity to a
fresh node the runner plays, and checks what a kubelet guarantees: the container sees its
ConfigMap files, downward API files and env at the paths the pod spec names, cluster DNS
names reach this machine, the exit code lands in the pod status, a preempted spot node
SIGTERMs its processes and fails their pods with DisruptionTarget, annotation changes reach
the downward API file. Expected values are the ones written into the pod specs here.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from waiting import wait_for

from sailplan_dev.localcluster.nodes import NODEPOOL_LABEL, NodePool, node_manifest
from sailplan_dev.localcluster.podrunner import PodRunner, runner_node_manifest

pytestmark = pytest.mark.cluster

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ZONE = "us-central1-a"


@pytest.fixture
def runner(k8s_api: Any, tmp_path: Path) -> Iterator[PodRunner]:
    # Heartbeats faster than the kubelet's 10 s: tests are short, but must see the lease work.
    pod_runner = PodRunner(k8s_api, tmp_path / "runner", heartbeat_s=2.0, retry_s=0.5)
    try:
        yield pod_runner
    finally:
        left = pod_runner.nodes()
        pod_runner.close(grace_s=2.0)
        core = client.CoreV1Api(k8s_api)
        for name in left:
            try:
                core.delete_node(name)
            except client.ApiException as error:
                if error.status != 404:
                    raise


@dataclass(frozen=True)
class RunnerNode:
    name: str
    pool: str


@pytest.fixture
def runner_node(runner: PodRunner) -> RunnerNode:
    pool = NodePool(
        name=f"pr-{uuid.uuid4().hex[:8]}",
        accelerator="nvidia-tesla-a100",
        gpus_per_node=4,
        machine_type="a2-highgpu-4g",
        cpu="48",
        memory="340Gi",
        spot=True,
        zones={ZONE: 1},
    )
    name = runner.add_node(runner_node_manifest(pool, ZONE, 0))
    return RunnerNode(name=name, pool=pool.name)


def eventually(check: Callable[[], Any], timeout_s: float = 30.0, what: str = "") -> Any:
    return wait_for(what or str(check), check, timeout_s)


class Pods:
    def __init__(self, api: Any) -> None:
        self.core = client.CoreV1Api(api)

    def manifest(
        self,
        name: str,
        pool: str,
        command: list[str],
        *,
        env: list[dict[str, Any]] | None = None,
        volumes: list[dict[str, Any]] | None = None,
        mounts: list[dict[str, Any]] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        """A pod that only a node of `pool` can take: node affinity + the GPU toleration."""
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": NODEPOOL_LABEL, "operator": "In", "values": [pool]}
                            ]
                        }
                    ]
                }
            }
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "affinity": affinity,
                "tolerations": [GPU_TOLERATION],
                "containers": [
                    {
                        "name": "main",
                        "image": "sailplan/test:none",
                        "command": command,
                        "env": env or [],
                        "volumeMounts": mounts or [],
                        "resources": {
                            "requests": {"nvidia.com/gpu": "1"},
                            "limits": {"nvidia.com/gpu": "1"},
                        },
                    }
                ],
                "volumes": volumes or [],
                **spec,
            },
        }

    def create(self, namespace: str, manifest: dict[str, Any]) -> None:
        # A fresh namespace gets its `default` ServiceAccount from the controller manager a
        # moment later; pod admission refuses pods until then.
        eventually(lambda: self._service_account(namespace), 30.0, f"default SA in {namespace}")
        self.core.create_namespaced_pod(namespace, manifest)

    def _service_account(self, namespace: str) -> bool:
        try:
            self.core.read_namespaced_service_account("default", namespace)
        except client.ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def read(self, namespace: str, name: str) -> Any:
        return self.core.read_namespaced_pod(name, namespace)

    def wait_phase(
        self, namespace: str, name: str, phases: tuple[str, ...], timeout_s: float = 30.0
    ) -> Any:
        def check() -> Any:
            pod = self.read(namespace, name)
            return pod if pod.status.phase in phases else None

        return eventually(check, timeout_s, f"pod {name} in {phases}")


@pytest.fixture
def pods(k8s_api: Any) -> Pods:
    return Pods(k8s_api)


OUT = {"name": "out", "emptyDir": {}}
OUT_MOUNT = {"name": "out", "mountPath": "/out"}

# Reads what a trainer reads, by the in-container paths; writes it as JSON to argv[1].
_REPORT = """
import json, os, socket, sys
seen = {
    "greeting": open("/etc/cfg/greeting").read(),
    "labels": open("/etc/podinfo/labels").read(),
    "name_file": open("/etc/podinfo/name").read(),
    "pod_name": os.environ["MY_POD_NAME"],
    "namespace": os.environ["MY_NAMESPACE"],
    "node": os.environ["MY_NODE"],
    "pod_ip": os.environ["MY_POD_IP"],
    "team_label": os.environ["MY_TEAM"],
    "color": os.environ["COLOR"],
    "expanded": os.environ["EXPANDED"],
    "master_addr": os.environ["MASTER_ADDR"],
    "master_ip": socket.gethostbyname(os.environ["MASTER_ADDR"]),
    "cfg_dir_exists": os.path.isdir(os.environ["CFG_DIR"]),
    "argv_name": sys.argv[2],
}
open(sys.argv[1], "w").write(json.dumps(seen))
"""


def _out_dir(runner: PodRunner, namespace: str, name: str) -> Path:
    return runner.pod_dir(namespace, name) / "volumes" / "out"


def _terminated(pod: Any) -> Any:
    return pod.status.container_statuses[0].state.terminated


def test_pod_sees_configmap_downward_api_and_env_then_succeeds(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str, k8s_api: Any
) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {"name": "cfg"},
            "data": {"greeting": "hello from a ConfigMap", "color": "teal"},
        },
    )
    # MASTER_ADDR is how the operator names worker 0: hostname.subdomain.namespace.svc.
    master = f"job-w0.job-workers.{namespace}.svc"
    manifest = pods.manifest(
        "reader",
        runner_node.pool,
        ["python", "-c", _REPORT, "/out/seen.json", "$(MY_POD_NAME)"],
        env=[
            {"name": "MY_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "MY_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "MY_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {
                "name": "MY_TEAM",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}},
            },
            {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "color"}}},
            {"name": "EXPANDED", "value": "pod=$(MY_POD_NAME) literal=$$(MY_POD_NAME)"},
            {"name": "MASTER_ADDR", "value": master},
            {"name": "CFG_DIR", "value": "/etc/cfg"},
        ],
        volumes=[
            {
                "name": "cfg",
                "configMap": {"name": "cfg", "items": [{"key": "greeting", "path": "greeting"}]},
            },
            {
                "name": "podinfo",
                "downwardAPI": {
                    "items": [
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    ]
                },
            },
            OUT,
        ],
        mounts=[
            {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True},
            {"name": "podinfo", "mountPath": "/etc/podinfo", "readOnly": True},
            OUT_MOUNT,
        ],
    )
    manifest["metadata"]["labels"] = {"team": "sailplan", "app": "reader"}
    pods.create(namespace, manifest)

    pod = pods.wait_phase(namespace, "reader", ("Succeeded", "Failed"))
    log = runner.log_path(namespace, "reader").read_text()
    assert pod.status.phase == "Succeeded", log
    assert pod.spec.node_name == runner_node.name  # placed by the scheduler
    # Its own loopback address (podrunner_net), not the node's.
    assert pod.status.pod_ip.startswith("127.") and pod.status.pod_ip != pod.status.host_ip
    terminated = _terminated(pod)
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    assert {"app": "reader", "team": "sailplan"}.items() <= pod.metadata.labels.items()
    seen = json.loads((_out_dir(runner, namespace, "reader") / "seen.json").read_text())
    assert seen == {
        "greeting": "hello from a ConfigMap",
        # The kubelet's format: sorted key="value" lines. Binding adds the node's topology
        # labels to the pod (PodTopologyLabelsAdmission), so the expected set is the pod's.
        "labels": "\n".join(f'{k}="{v}"' for k, v in sorted(pod.metadata.labels.items())),
        "name_file": "reader",
        "pod_name": "reader",
        "namespace": namespace,
        "node": runner_node.name,
        "pod_ip": pod.status.pod_ip,
        "team_label": "sailplan",
        "color": "teal",
        "expanded": "pod=reader literal=$(MY_POD_NAME)",
        "master_addr": "127.0.0.1",
        "master_ip": "127.0.0.1",
        "cfg_dir_exists": True,
        "argv_name": "reader",
    }


def test_failing_command_fails_the_pod_with_its_exit_code(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str
) -> None:
    script = "import sys; print('about to fail'); sys.exit(3)"
    pods.create(namespace, pods.manifest("failing", runner_node.pool, ["python", "-c", script]))

    pod = pods.wait_phase(namespace, "failing", ("Succeeded", "Failed"))
    assert pod.status.phase == "Failed"
    terminated = _terminated(pod)
    assert (terminated.exit_code, terminated.reason) == (3, "Error")
    assert "about to fail" in runner.log_path(namespace, "failing").read_text()


# Installs a SIGTERM handler that leaves a marker, says it is ready, then waits; on SIGTERM
# it dies of the signal as an unhandled one would (exit code 143).
_PREEMPTIBLE = """
import os, signal, time
def on_term(signum, frame):
    open("/out/marker", "w").write("SIGTERM")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
signal.signal(signal.SIGTERM, on_term)
open("/out/ready", "w").write("ready")
time.sleep(300)
"""


def test_preempt_node_sigterms_and_fails_pod_with_disruption_target(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str, k8s_api: Any
) -> None:
    manifest = pods.manifest(
        "victim",
        runner_node.pool,
        ["python", "-c", _PREEMPTIBLE],
        volumes=[OUT],
        mounts=[OUT_MOUNT],
    )
    pods.create(namespace, manifest)
    running = pods.wait_phase(namespace, "victim", ("Running",))
    assert running.status.container_statuses[0].state.running.started_at is not None
    eventually(lambda: _ready(runner, namespace), 30.0, "SIGTERM handler installed")

    affected = runner.preempt_node(runner_node.name, grace_s=10.0)

    assert affected == [f"{namespace}/victim"]
    assert (_out_dir(runner, namespace, "victim") / "marker").read_text() == "SIGTERM"
    pod = pods.read(namespace, "victim")
    assert pod.status.phase == "Failed"
    assert _terminated(pod).exit_code == 143  # 128 + SIGTERM
    disruption = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
    assert [(c.status, c.reason) for c in disruption] == [("True", "TerminationByKubelet")]
    core = client.CoreV1Api(k8s_api)

    def node_gone() -> bool:
        try:
            core.read_node(runner_node.name)
        except client.ApiException as error:
            return error.status == 404
        return False

    eventually(node_gone, 10.0, "preempted node deleted")


def _ready(runner: PodRunner, namespace: str) -> bool:
    try:
        return (_out_dir(runner, namespace, "victim") / "ready").exists()
    except KeyError:
        return False


# Waits until the downward API annotations file carries the checkpoint request, then
# reports the file's content and exits 0.
_ANNOTATION_WAITER = """
import sys, time
path = "/etc/podinfo/annotations"
while 'sailplan.dev/checkpoint-request="7"' not in open(path).read():
    time.sleep(0.05)
open("/out/annotations", "w").write(open(path).read())
"""


def test_annotation_change_reaches_the_downward_api_file(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str, k8s_api: Any
) -> None:
    manifest = pods.manifest(
        "watcher",
        runner_node.pool,
        ["python", "-c", _ANNOTATION_WAITER],
        volumes=[
            {
                "name": "podinfo",
                "downwardAPI": {
                    "items": [
                        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
                    ]
                },
            },
            OUT,
        ],
        mounts=[{"name": "podinfo", "mountPath": "/etc/podinfo"}, OUT_MOUNT],
    )
    manifest["metadata"]["annotations"] = {"first": "1"}
    pods.create(namespace, manifest)
    pods.wait_phase(namespace, "watcher", ("Running",))

    client.CoreV1Api(k8s_api).patch_namespaced_pod(
        "watcher",
        namespace,
        {"metadata": {"annotations": {"sailplan.dev/checkpoint-request": "7"}}},
    )
    patched = time.monotonic()
    pod = pods.wait_phase(namespace, "watcher", ("Succeeded", "Failed"), timeout_s=10.0)
    elapsed = time.monotonic() - patched

    assert pod.status.phase == "Succeeded", runner.log_path(namespace, "watcher").read_text()
    seen = (_out_dir(runner, namespace, "watcher") / "annotations").read_text()
    assert seen == 'first="1"\nsailplan.dev/checkpoint-request="7"'
    assert elapsed < 5.0


# Saves "step" into the claim, then on SIGTERM records it there and exits cleanly, as a
# trainer checkpointing on a preemption notice would.
_CHECKPOINTER = """
import signal, sys, time
def on_term(signum, frame):
    open("/ckpt/terminated", "w").write("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open("/ckpt/step", "w").write("42")
time.sleep(300)
"""
_RESUMER = """
import json
import os
import socket
seen = {"step": open("/ckpt/step").read(), "terminated": open("/ckpt/terminated").read()}
open("/ckpt/seen.json", "w").write(json.dumps(seen))
"""


def test_graceful_delete_then_replacement_pod_finds_the_claim_data(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str
) -> None:
    shared = runner.provision_claim(namespace, "ckpt")
    claim = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    mount = [{"name": "ckpt", "mountPath": "/ckpt"}]
    first = pods.manifest(
        "first", runner_node.pool, ["python", "-c", _CHECKPOINTER], volumes=claim, mounts=mount
    )
    pods.create(namespace, first)
    pods.wait_phase(namespace, "first", ("Running",))
    eventually((shared / "step").exists, 30.0, "first pod wrote its step")

    pods.core.delete_namespaced_pod("first", namespace, grace_period_seconds=10)

    def deleted() -> bool:
        try:
            pods.read(namespace, "first")
        except client.ApiException as error:
            return error.status == 404
        return False

    # The kubelet removes the object itself (grace 0) once the process is gone: well before
    # the 10 s grace period when the process exits on SIGTERM.
    eventually(deleted, 8.0, "pod object removed after its process exited")
    second = pods.manifest(
        "second", runner_node.pool, ["python", "-c", _RESUMER], volumes=claim, mounts=mount
    )
    pods.create(namespace, second)
    pod = pods.wait_phase(namespace, "second", ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded", runner.log_path(namespace, "second").read_text()
    assert json.loads((shared / "seen.json").read_text()) == {"step": "42", "terminated": "SIGTERM"}


_PID_WRITER = """
import os, signal, time
signal.signal(signal.SIGTERM, lambda *_: open("/out/marker", "w").write("SIGTERM"))
open("/out/pid", "w").write(str(os.getpid()))
time.sleep(300)
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_kill_node_kills_processes_without_notice_and_removes_the_node(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str, k8s_api: Any
) -> None:
    manifest = pods.manifest(
        "doomed", runner_node.pool, ["python", "-c", _PID_WRITER], volumes=[OUT], mounts=[OUT_MOUNT]
    )
    pods.create(namespace, manifest)
    pods.wait_phase(namespace, "doomed", ("Running",))
    out = _out_dir(runner, namespace, "doomed")
    pid = int(eventually(lambda: (out / "pid").exists() and (out / "pid").read_text(), 30.0))

    assert runner.kill_node(runner_node.name) == [f"{namespace}/doomed"]

    eventually(lambda: _gone(pid), 5.0, "process killed")
    assert not (out / "marker").exists()  # SIGKILL: no handler ran
    core = client.CoreV1Api(k8s_api)
    with pytest.raises(client.ApiException) as error:
        core.read_node(runner_node.name)
    assert error.value.status == 404
    # Nobody plays this node's kubelet any more: the pod's last reported state stands until
    # the control plane's pod GC acts on the missing node.
    assert pods.read(namespace, "doomed").status.phase == "Running"


def test_heartbeat_renews_the_node_lease_and_keeps_it_ready(
    runner: PodRunner, runner_node: RunnerNode, k8s_api: Any
) -> None:
    coordination = client.CoordinationV1Api(k8s_api)
    first = coordination.read_namespaced_lease(runner_node.name, "kube-node-lease").spec
    assert first.holder_identity == runner_node.name
    time.sleep(runner.heartbeat_s * 1.5)
    second = coordination.read_namespaced_lease(runner_node.name, "kube-node-lease").spec
    assert second.renew_time > first.renew_time
    node = client.CoreV1Api(k8s_api).read_node(runner_node.name)
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert [c.status for c in ready] == ["True"]
    assert node.metadata.labels["sailplan.dev/node-agent"] == "podrunner"  # not kwok's


def test_pod_waits_for_its_configmap_then_runs(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str, k8s_api: Any
) -> None:
    manifest = pods.manifest(
        "late",
        runner_node.pool,
        ["python", "-c", "import sys; sys.exit(open('/cfg/x').read() != 'arrived')"],
        volumes=[{"name": "cfg", "configMap": {"name": "late-cm"}}],
        mounts=[{"name": "cfg", "mountPath": "/cfg"}],
    )
    pods.create(namespace, manifest)

    def waiting() -> Any:
        statuses = pods.read(namespace, "late").status.container_statuses or []
        return statuses and statuses[0].state.waiting

    assert eventually(waiting, 30.0, "container waiting").reason == "ContainerCreating"
    assert pods.read(namespace, "late").status.phase == "Pending"
    client.CoreV1Api(k8s_api).create_namespaced_config_map(
        namespace, {"metadata": {"name": "late-cm"}, "data": {"x": "arrived"}}
    )
    pod = pods.wait_phase(namespace, "late", ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded", runner.log_path(namespace, "late").read_text()


# Asks the API server who it is, with the kubeconfig the runner gives the process.
_WHOAMI = """
import json, sys
from kubernetes import client, config
config.load_kube_config()
review = client.AuthenticationV1Api().create_self_subject_review({"metadata": {}})
open("/out/whoami", "w").write(review.status.user_info.username)
"""


def test_process_talks_to_the_api_server_as_the_pods_service_account(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str
) -> None:
    manifest = pods.manifest(
        "whoami", runner_node.pool, ["python", "-c", _WHOAMI], volumes=[OUT], mounts=[OUT_MOUNT]
    )
    pods.create(namespace, manifest)
    pod = pods.wait_phase(namespace, "whoami", ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded", runner.log_path(namespace, "whoami").read_text()
    whoami = (_out_dir(runner, namespace, "whoami") / "whoami").read_text()
    assert whoami == f"system:serviceaccount:{namespace}:default"


# Fails on its first run, succeeds on the second: the emptyDir outlives a container restart.
_FLAKY = """
import os, sys
runs = "/out/runs"
count = int(open(runs).read()) + 1 if os.path.exists(runs) else 1
open(runs, "w").write(str(count))
print(f"run {count}")
sys.exit(0 if count > 1 else 5)
"""


def test_restart_policy_on_failure_restarts_the_container(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str
) -> None:
    manifest = pods.manifest(
        "flaky",
        runner_node.pool,
        ["python", "-c", _FLAKY],
        volumes=[OUT],
        mounts=[OUT_MOUNT],
        restartPolicy="OnFailure",
    )
    pods.create(namespace, manifest)
    pod = pods.wait_phase(namespace, "flaky", ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded"
    status = pod.status.container_statuses[0]
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 5
    assert (_out_dir(runner, namespace, "flaky") / "runs").read_text() == "2"
    # Each run has its own log, as with the kubelet: `previous` is the failed first run's.
    read = pods.core.read_namespaced_pod_log
    assert read("flaky", namespace, container="main") == "run 2\n"
    assert read("flaky", namespace, container="main", previous=True) == "run 1\n"


# Listens on the metrics port the env names, on every address as the trainer's Prometheus
# server does, answers each connection with its pod's name until /out/stop appears.
_LISTENER = """
import os, socket, time
sock = socket.create_server(("0.0.0.0", int(os.environ["SAILPLAN_METRICS_PORT"])))
sock.settimeout(0.2)
open("/out/port", "w").write(os.environ["SAILPLAN_METRICS_PORT"])
while not os.path.exists("/out/stop"):
    try:
        connection, _ = sock.accept()
    except TimeoutError:
        continue
    with connection:
        connection.sendall(os.environ["NAME"].encode())
"""


def _read_from(address: tuple[str, int]) -> bytes:
    with socket.create_connection(address, timeout=10) as connection:
        received = b""
        while chunk := connection.recv(1024):
            received += chunk
        return received


def test_metrics_ports_do_not_collide_between_pods(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str, k8s_api: Any
) -> None:
    # Both pods ask for the trainer's default port; on one machine only one could bind it.
    for name in ("m1", "m2"):
        env = [
            {"name": "SAILPLAN_METRICS_PORT", "value": "9400"},
            {"name": "NAME", "value": name},
        ]
        manifest = pods.manifest(
            name,
            runner_node.pool,
            ["python", "-c", _LISTENER],
            env=env,
            volumes=[OUT],
            mounts=[OUT_MOUNT],
        )
        pods.create(namespace, manifest)
    core = client.CoreV1Api(k8s_api)
    for name in ("m1", "m2"):
        pods.wait_phase(namespace, name, ("Running",))
    ports = [runner.ports(namespace, name)["SAILPLAN_METRICS_PORT"] for name in ("m1", "m2")]
    assert ports[0] != ports[1]
    deadline = time.monotonic() + 30
    while not all((_out_dir(runner, namespace, n) / "port").exists() for n in ("m1", "m2")):
        assert time.monotonic() < deadline, "the listeners did not start"
        time.sleep(0.1)
    seen = [int((_out_dir(runner, namespace, n) / "port").read_text()) for n in ("m1", "m2")]
    assert seen == ports
    # A client that knows only the Pod reaches each process at podIP:9400, as in a cluster.
    ips = [core.read_namespaced_pod(n, namespace).status.pod_ip for n in ("m1", "m2")]
    assert ips[0] != ips[1]
    assert [_read_from((ip, 9400)) for ip in ips] == [b"m1", b"m2"]
    for name in ("m1", "m2"):
        (_out_dir(runner, namespace, name) / "stop").write_text("")
        pod = pods.wait_phase(namespace, name, ("Succeeded", "Failed"))
        assert pod.status.phase == "Succeeded", runner.log_path(namespace, name).read_text()


def test_adopting_a_kwok_node_reports_its_fake_pods_lost_and_runs_new_ones(
    runner: PodRunner, pods: Pods, namespace: str, k8s_api: Any
) -> None:
    core = client.CoreV1Api(k8s_api)
    pool = NodePool(
        name=f"pr-{uuid.uuid4().hex[:8]}",
        accelerator="nvidia-tesla-a100",
        gpus_per_node=4,
        machine_type="a2-highgpu-4g",
        zones={ZONE: 1},
    )
    manifest = node_manifest(pool, ZONE, 0)  # labelled for kwok
    name = manifest["metadata"]["name"]
    core.create_node(manifest)
    try:
        core.patch_node_status(name, {"status": manifest["status"]})
        pods.create(namespace, pods.manifest("faked", pool.name, ["python", "-c", "pass"]))
        # kwok "runs" it: Running, no process anywhere.
        pods.wait_phase(namespace, "faked", ("Running",))

        assert runner.adopt(f"{NODEPOOL_LABEL}={pool.name}") == [name]

        # kwok's addresses and kubelet port are replaced by the runner's, so the API server
        # dials this runner for the node's pod logs.
        status = core.read_node(name).status
        assert [(a.type, a.address) for a in status.addresses] == [("InternalIP", "127.0.0.1")]
        assert status.daemon_endpoints.kubelet_endpoint.port == runner.kubelet_port
        faked = pods.wait_phase(namespace, "faked", ("Failed",))
        terminated = faked.status.container_statuses[0].state.terminated
        assert (terminated.reason, terminated.exit_code) == ("ContainerStatusUnknown", 137)
        script = "import sys; print('ran here'); sys.exit(4)"
        pods.create(namespace, pods.manifest("real", pool.name, ["python", "-c", script]))
        real = pods.wait_phase(namespace, "real", ("Succeeded", "Failed"))
        assert real.status.container_statuses[0].state.terminated.exit_code == 4
        assert core.read_namespaced_pod_log("real", namespace) == "ran here\n"
    finally:
        if name not in runner.nodes():
            core.delete_node(name)


def test_node_deleted_from_outside_is_treated_as_lost(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str, k8s_api: Any
) -> None:
    manifest = pods.manifest(
        "orphan", runner_node.pool, ["python", "-c", _PID_WRITER], volumes=[OUT], mounts=[OUT_MOUNT]
    )
    pods.create(namespace, manifest)
    pods.wait_phase(namespace, "orphan", ("Running",))
    out = _out_dir(runner, namespace, "orphan")
    pid = int(eventually(lambda: (out / "pid").exists() and (out / "pid").read_text(), 30.0))

    client.CoreV1Api(k8s_api).delete_node(runner_node.name)  # as `kubectl delete node` would

    # Noticed at the next heartbeat (2 s in these tests).
    eventually(
        lambda: _gone(pid), runner.heartbeat_s * 3, "process killed after its node was deleted"
    )
    assert runner.nodes() == []
