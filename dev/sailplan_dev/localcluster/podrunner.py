"""PodRunner: plays the kubelet for a few nodes, running their pods as local processes.

kwok's fake nodes run nothing. End-to-end tests (and `sailplan demo --preempt`) need the
real trainer processes for the pods the real operator creates and the real kube-scheduler
binds, so this runner takes over nodes that kwok does not manage (label
nodes.MANAGER_LABEL=RUNNER_AGENT, which kwok's selector excludes) and, per node, like a
kubelet:

- keeps the node Ready: a Lease in kube-node-lease and the Ready condition are renewed
  every `heartbeat_s`, so the node lifecycle controller does not mark it NotReady;
- watches the pods bound to it (`spec.nodeName`), materializes their volumes once under a
  per-pod directory (an emptyDir is one directory for all of the pod's containers), then
  runs each init container to completion, in order, and then the first app container
  (podrunner_pod.run_order; one process per pod at a time): each with its own
  environment and argv (podrunner_pod), in its own process group, with stdout/stderr in a
  per-run log file `logs/<container>/<restart>.log` as the kubelet's /var/log/pods;
- enforces the securityContext (podrunner_security, podrunner_fs): each container runs as
  its runAsUser/runAsGroup (else its image's USER, from `images`) with fsGroup and
  supplementalGroups as groups; runAsNonRoot violations keep it Waiting with
  CreateContainerConfigError; the image's directories are made with the image's owners in
  a per-container root directory (`rootfs/<container>`, without write bits under
  readOnlyRootFilesystem) that the image paths in argv/env/config are rewritten to, with
  HOME and TMPDIR there too; volumes get the kubelet's owners and modes (emptyDir 0777,
  fsGroup's group with setgid). Needs a runner running as root; otherwise it only checks;
- reports the pod like a kubelet (podrunner_status): Pending with initContainerStatuses
  while init containers run, Running, then Succeeded/Failed with the exit codes; a failed
  init container fails the pod under restartPolicy Never and is restarted otherwise;
- serves those logs on the kubelet's /containerLogs endpoint (podrunner_logs, HTTPS on
  127.0.0.1), and gives its nodes only that address and port, so the API server's
  `pods/log` (`kubectl logs`, read_namespaced_pod_log) reaches it;
- re-renders downward API files when the pod's labels or annotations change;
- gives each pod its own loopback address as status.podIP and forwards podIP:<port> of its
  port env vars (the trainer's metrics port) to the free port its process got
  (podrunner_net), so clients that read the Pod reach it as through a pod network;
- on graceful deletion sends SIGTERM, waits up to the grace period, SIGKILLs the process
  group, then deletes the pod object with grace 0 (what the kubelet's status manager does).

Node loss for tests: preempt_node (GKE spot preemption: SIGTERM, short grace, pods Failed
with DisruptionTarget/TerminationByKubelet, node gone) and kill_node (abrupt: SIGKILL, no
more status from this node, node NotReady then gone; the control plane's pod GC cleans up).

Every process is killed on close() and at interpreter exit: no orphans after a failed test.
The API calls run on background threads (one pod watch and one heartbeat per node, one
waiter per process, the log server's); state is guarded by one lock per pod plus one for
the tables.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from kubernetes import client, watch
from urllib3.exceptions import HTTPError as Urllib3Error

from . import podrunner_fs as podfs
from . import podrunner_net as podnet
from . import podrunner_pod as podspec
from . import podrunner_security as security
from . import podrunner_status as podstatus
from .kubeconfig import api_client
from .nodes import MANAGER_LABEL, NodePool, node_manifest
from .podrunner_image import UNKNOWN_IMAGE, Image
from .podrunner_logs import LogRequestError, LogServer, LogSource

log = logging.getLogger(__name__)

# Value of nodes.MANAGER_LABEL on the nodes this runner plays the kubelet for.
RUNNER_AGENT = "podrunner"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40  # the kubelet's default
# Env vars holding a port the process listens on: a fresh free port per pod, since all pods
# share 127.0.0.1 (the trainer's Prometheus port; "0" keeps it disabled).
DEFAULT_PORT_ENV = ("SAILPLAN_METRICS_PORT",)
_TERMINAL = ("Succeeded", "Failed")
_ADDRESS_FIELDS = ("hostIP", "hostIPs", "podIP", "podIPs")
PREEMPTION_MESSAGE = "Pod was terminated in response to imminent node shutdown."


def runner_node_manifest(pool: NodePool, zone: str, index: int) -> dict[str, Any]:
    """A GKE-like Node (nodes.node_manifest) that kwok leaves to this runner."""
    manifest = node_manifest(pool, zone, index)
    manifest["metadata"]["labels"][MANAGER_LABEL] = RUNNER_AGENT
    return manifest


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class _ApiSources:
    """podspec.Sources over the API server (raw JSON, camelCase like the pod)."""

    def __init__(self, core: Any) -> None:
        self.core = core

    def _read(self, call: Callable[..., Any], namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response = call(name, namespace, _preload_content=False)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise
        data: dict[str, Any] = json.loads(response.data)
        return data

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(self.core.read_namespaced_config_map, namespace, name)

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(self.core.read_namespaced_secret, namespace, name)

    def service_account_token(
        self, pod: Mapping[str, Any], audience: str | None, expiration_seconds: int
    ) -> str:
        metadata = podspec.meta(pod)
        spec: dict[str, Any] = {
            "expirationSeconds": expiration_seconds,
            # Bound to the pod, as the kubelet asks: the token dies with the pod object.
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": metadata["name"],
                "uid": metadata["uid"],
            },
        }
        if audience:
            spec["audiences"] = [audience]
        account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        response = self.core.create_namespaced_service_account_token(
            account, metadata["namespace"], {"spec": spec}
        )
        token: str = response.status.token
        return token


@dataclass
class _Pod:
    """One pod this runner plays the kubelet for."""

    uid: str
    node: str
    pod: dict[str, Any]
    directory: Path
    lock: threading.RLock = field(default_factory=threading.RLock)
    # What runs, in order (podrunner_pod.run_order), and each one's state; `step` is the
    # index of the one running or next to run.
    order: tuple[tuple[Mapping[str, Any], bool], ...] = ()
    runs: list[podstatus.ContainerRun] = field(default_factory=list)
    step: int = 0
    volumes: tuple[podspec.Volume, ...] | None = None  # rendered once, before the first run
    volume_dirs: dict[str, Path] = field(default_factory=dict)
    fs_group: int | None = None  # the pod's securityContext.fsGroup, applied to its volumes
    tracked_volumes: tuple[str, ...] = ()  # volumes rendered from labels/annotations
    process: subprocess.Popen[bytes] | None = None
    start_time: str = ""
    started_at: str = ""  # of the current run
    ports: dict[str, int] = field(default_factory=dict)
    ip: str = podspec.POD_IP  # its status.podIP (podrunner_net)
    forwards: dict[str, podnet.PortForward] = field(default_factory=dict)  # by port env var
    deleting: bool = False
    disruption: podstatus.Disruption | None = None
    abandoned: bool = False  # the node died: nobody reports this pod's status any more
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def key(self) -> str:
        return podspec.key(self.pod)

    @property
    def current(self) -> podstatus.ContainerRun:
        return self.runs[min(self.step, len(self.runs) - 1)]

    def log_file(self, container: str, restart: int) -> Path:
        return self.directory / "logs" / container / f"{restart}.log"


class _NodeAgent:
    """The per-node half of a kubelet: heartbeat and the pod watch, on two threads."""

    def __init__(self, runner: PodRunner, name: str) -> None:
        self.runner, self.name = runner, name
        self.stopped = threading.Event()
        # Set while the node shuts down: it no longer claims to be Ready.
        self.shutting_down = threading.Event()
        self._ready_since = _now()
        self._threads = [
            threading.Thread(target=self._heartbeat, name=f"heartbeat-{name}", daemon=True),
            threading.Thread(target=self._watch, name=f"podwatch-{name}", daemon=True),
        ]

    def start(self) -> None:
        self.beat()
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.stopped.set()

    # -- heartbeat ---------------------------------------------------------------------------

    def beat(self) -> None:
        core = self.runner.core
        coordination: Any = client.CoordinationV1Api(self.runner.api)
        now = _now()
        conditions = [
            {
                "type": kind,
                "status": "False",
                "reason": f"KubeletHas{reason}",
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": self._ready_since,
            }
            for kind, reason, message in (
                ("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"),
            )
        ]
        conditions.append(
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "sailplan pod runner is posting ready status",
                "lastHeartbeatTime": now,
                "lastTransitionTime": self._ready_since,
            }
        )
        status = {"conditions": conditions, **self.runner._node_identity()}
        node = core.patch_node_status(self.name, {"status": status})
        lease = {
            "metadata": {
                "name": self.name,
                "namespace": LEASE_NAMESPACE,
                # The garbage collector removes the lease with the node, as for a kubelet's.
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.name,
                        "uid": node.metadata.uid,
                    }
                ],
            },
            "spec": {
                "holderIdentity": self.name,
                "leaseDurationSeconds": LEASE_DURATION_S,
                "renewTime": _micro_now(),
            },
        }
        try:
            coordination.patch_namespaced_lease(self.name, LEASE_NAMESPACE, lease)
        except client.ApiException as error:
            if error.status != 404:
                raise
            coordination.create_namespaced_lease(LEASE_NAMESPACE, lease)

    def _heartbeat(self) -> None:
        while not self.stopped.wait(self.runner.heartbeat_s):
            if self.shutting_down.is_set():
                continue
            try:
                self.beat()
            except client.ApiException as error:
                if error.status == 404 and not self.stopped.is_set():
                    # Deleted from outside (kubectl delete node): the machine is gone.
                    log.warning("node %s was deleted: its processes are killed", self.name)
                    self.runner._lose_node(self.name)
                    return
                self._retry_later(f"heartbeat failed: {error.reason}")
            except (Urllib3Error, OSError) as error:
                self._retry_later(f"heartbeat failed: {error}")

    # -- pod watch -----------------------------------------------------------------------------

    def _watch(self) -> None:
        core = self.runner.core
        selector = f"spec.nodeName={self.name}"
        version: str | None = None
        while not self.stopped.is_set():
            try:
                if version is None:
                    response = core.list_pod_for_all_namespaces(
                        field_selector=selector, _preload_content=False
                    )
                    listed = json.loads(response.data)
                    version = listed["metadata"]["resourceVersion"]
                    self.runner._resync(self, listed["items"])
                stream: Any = watch.Watch()  # type: ignore[no-untyped-call]
                for event in stream.stream(
                    core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    # Short server-side timeout: a stopped agent's thread ends within it.
                    timeout_seconds=10,
                    _request_timeout=30,
                ):
                    version = stream.resource_version
                    if self.stopped.is_set():
                        stream.stop()
                        break
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.runner._on_event(self, event["type"], event["raw_object"])
            except client.ApiException as error:
                if error.status == 410:  # too old a resourceVersion: list again
                    version = None
                    continue
                self._retry_later(f"pod watch: {error.reason}")
            except (Urllib3Error, OSError, ValueError) as error:
                self._retry_later(f"pod watch: {error}")

    def _retry_later(self, problem: str) -> None:
        # A stopped agent's connection may die with the cluster at teardown: not worth a word.
        if not self.stopped.is_set():
            log.warning("node %s: %s", self.name, problem)
            self.stopped.wait(1.0)


class PodRunner:
    """Runs the pods bound to the nodes it manages as local processes; see the module doc."""

    def __init__(
        self,
        api: Any,
        workdir: Path,
        *,
        entrypoints: Mapping[str, Iterable[str]] | None = None,
        images: Mapping[str, Image] | None = None,
        env: Mapping[str, str] | None = None,
        port_env: Iterable[str] = DEFAULT_PORT_ENV,
        rewrite_config_files: bool = True,
        heartbeat_s: float = 10.0,
        retry_s: float = 2.0,
    ) -> None:
        """`api`: kubernetes ApiClient; `workdir`: where pod directories, logs and the
        shared (PVC/hostPath) directories go (a root runner whose workdir other uids cannot
        reach puts those in a temporary directory it removes on close: pod_dir() and
        provision_claim() say where); `entrypoints`: image -> entrypoint argv for
        containers without `command`; `images`: image -> its user and directories
        (podrunner_image.read_image of its Dockerfile; an image not there has no USER the
        runner knows and only /tmp, /var/tmp); `env`: defaults for every process (the
        image's ENV; the pod's env wins over them)."""
        self.api = api
        # Any: the client's annotations are partial (raw responses, dict bodies).
        self.core: Any = client.CoreV1Api(api)
        self.workdir = Path(workdir)
        self.entrypoints = {k: tuple(v) for k, v in (entrypoints or {}).items()}
        self.images = dict(images or {})
        # Only root can run a container as another uid and give files their owners.
        self._is_root = os.geteuid() == 0
        self._setpriv = shutil.which("setpriv")
        self._launch_notes: set[str] = set()
        self._made_visible: Path | None = None
        # Where pods/ and shared/ go: what the containers' processes see.
        self._visible = self._visible_directory()
        if not self._is_root:
            log.warning(
                "pod runner runs as uid %d, not root: containers run as that uid, "
                "runAsNonRoot and readOnlyRootFilesystem are checked, runAsUser, runAsGroup "
                "and fsGroup ownership are not applied",
                os.geteuid(),
            )
        self.env = dict(env or {})
        self.port_env = tuple(port_env)
        self.rewrite_config_files = rewrite_config_files
        self.heartbeat_s = heartbeat_s
        self.retry_s = retry_s
        self._sources = _ApiSources(self.core)
        self._lock = threading.Lock()
        self._agents: dict[str, _NodeAgent] = {}
        self._pods: dict[str, _Pod] = {}
        self._addresses = podnet.PodAddresses()
        self._volumes: list[str] = []  # PersistentVolumes made by provision_claim
        self._closed = False
        # The kubelet's log endpoint of every node of this runner (they share 127.0.0.1).
        self._log_server = LogServer(self._log_source, self.workdir / "pki")
        atexit.register(self.close)

    def _visible_directory(self) -> Path:
        """The workdir, or a directory under the temporary directory when the workdir cannot
        be reached by other uids (pytest's tmp_path lies under a 0700 directory).

        The containers' processes must reach their volumes and root filesystem with their own
        uid and for real: a library's access() check (click's readable=True) ignores
        capabilities, so CAP_DAC_READ_SEARCH does not stand in for a reachable path.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        anyone = security.Identity(uid=security.NOBODY, gid=security.NOBODY)

        def stat_of(path: str) -> tuple[int, int, int]:
            info = os.stat(path)
            return info.st_uid, info.st_gid, info.st_mode

        blocked = security.blocked_directory([str(self.workdir.resolve())], anyone, stat_of)
        if not self._is_root or blocked is None:
            return self.workdir
        visible = Path(tempfile.mkdtemp(prefix="sailplan-podrunner-"))
        visible.chmod(0o711)  # others may pass through, not list
        log.info(
            "%s is not reachable through %s: pod directories go to %s",
            self.workdir,
            blocked,
            visible,
        )
        self._made_visible = visible
        return visible

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path, workdir: Path, **options: Any) -> PodRunner:
        return cls(api_client(kubeconfig), workdir, **options)

    def __enter__(self) -> PodRunner:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ---- nodes -------------------------------------------------------------------------------

    def add_node(self, manifest: Mapping[str, Any], timeout_s: float = 30.0) -> str:
        """Create a Node (e.g. runner_node_manifest(...)), run it, wait until schedulable."""
        body = json.loads(json.dumps(manifest))
        body["metadata"].setdefault("labels", {})[MANAGER_LABEL] = RUNNER_AGENT
        name: str = body["metadata"]["name"]
        self.core.create_node(body)
        status = {**(body.get("status") or {}), **self._node_identity()}
        self.core.patch_node_status(name, {"status": status})
        self._start_agent(name)
        self._wait_schedulable(name, timeout_s)
        return name

    def take_over(self, name: str, timeout_s: float = 30.0) -> None:
        """Play the kubelet for an existing node (kwok lets go of it on relabelling)."""
        self.core.patch_node(name, {"metadata": {"labels": {MANAGER_LABEL: RUNNER_AGENT}}})
        self._start_agent(name)
        self._wait_schedulable(name, timeout_s)

    def adopt(self, label_selector: str, timeout_s: float = 30.0) -> list[str]:
        """take_over every node matching the selector (e.g. a GKE node pool's label)."""
        names = sorted(
            n.metadata.name for n in self.core.list_node(label_selector=label_selector).items
        )
        for name in names:
            self.take_over(name, timeout_s)
        return names

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._agents)

    def preempt_node(self, name: str, grace_s: float = 30.0, delete: bool = True) -> list[str]:
        """A GKE spot preemption of node `name`; returns the affected pods (namespace/name).

        As the kubelet's graceful node shutdown does: the node turns NotReady, every running
        process gets SIGTERM and up to `grace_s` (GKE gives spot VMs 30 s), then SIGKILL; each
        pod ends Failed with its exit code and condition DisruptionTarget
        (TerminationByKubelet). Then the node is deleted (the VM is gone) or, with
        delete=False, left NotReady.
        """
        agent = self._agent(name)
        agent.shutting_down.set()
        self._set_node_not_ready(name, "KubeletNotReady", "node is shutting down")
        pods = self._pods_on(name)
        disruption = podstatus.Disruption("TerminationByKubelet", PREEMPTION_MESSAGE)
        for entry in pods:
            with entry.lock:
                entry.disruption = disruption
                if entry.process is not None and entry.process.poll() is None:
                    entry.process.send_signal(signal.SIGTERM)
                elif not entry.finished.is_set():
                    # Never started (waiting for a ConfigMap): no process to stop.
                    self._report_terminal(entry, exit_code=137, message="never started")
        self._stop_pods(pods, grace_s)
        agent.stop()
        with self._lock:
            self._agents.pop(name, None)
        notified = {entry.uid for entry in pods}
        for entry in self._pods_on(name):
            if entry.uid not in notified:  # bound during the grace period: the VM is gone now
                self._abandon(entry)
        if delete:
            self.core.delete_node(name)
        return [entry.key for entry in pods]

    def kill_node(self, name: str, delete: bool = True) -> list[str]:
        """Abrupt node loss: its processes die at once and nobody reports their pods' status.

        The node turns NotReady (what the node lifecycle controller concludes once the
        heartbeats stop, without waiting for its grace period) and is deleted unless
        delete=False; the control plane's pod garbage collector then fails and removes the
        orphaned pods, as on a real cluster. Returns the pods that were running there.
        """
        self._agent(name)  # a KeyError for a node this runner does not play
        pods = self._lose_node(name)
        self._set_node_not_ready(name, "NodeStatusUnknown", "Kubelet stopped posting node status.")
        if delete:
            self.core.delete_node(name)
        return [entry.key for entry in pods]

    # ---- pods --------------------------------------------------------------------------------

    def provision_claim(
        self, namespace: str, claim: str, size: str = "10Gi", timeout_s: float = 30.0
    ) -> Path:
        """A Bound PersistentVolumeClaim backed by this runner's shared directory for it.

        The scheduler only places a pod whose claims are bound, and there is no storage
        provisioner here: this creates a PV (hostPath, storage class "") pre-bound to the
        claim and waits for the PV controller to bind them. Returns the local directory the
        pods of that claim share.
        """
        directory = self._visible / "shared" / "pvc" / namespace / claim
        directory.mkdir(parents=True, exist_ok=True)
        pv_name = f"podrunner-{namespace}-{claim}"[:253]
        with self._lock:
            self._volumes.append(pv_name)
        self.core.create_persistent_volume(
            {
                "metadata": {"name": pv_name, "labels": {MANAGER_LABEL: RUNNER_AGENT}},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteMany"],
                    # close() deletes it; the data stays in the workdir.
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "hostPath": {"path": str(directory)},
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            }
        )
        self.core.create_namespaced_persistent_volume_claim(
            namespace,
            {
                "metadata": {"name": claim},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": pv_name,
                    "resources": {"requests": {"storage": size}},
                },
            },
        )
        deadline = time.monotonic() + timeout_s
        while self.core.read_namespaced_persistent_volume_claim(claim, namespace).status.phase != (
            "Bound"
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"claim {namespace}/{claim} not bound after {timeout_s:.0f}s")
            time.sleep(0.2)
        return directory

    def pod_dir(self, namespace: str, name: str) -> Path:
        """The newest local directory of pod namespace/name (volumes/, rootfs/<container>/,
        the container logs)."""
        with self._lock:
            matches = [p for p in self._pods.values() if p.key == f"{namespace}/{name}"]
        if matches:
            return matches[-1].directory
        raise KeyError(f"pod {namespace}/{name} was not run by this runner")

    @property
    def kubelet_port(self) -> int:
        """Where this runner's nodes serve /containerLogs (their kubeletEndpoint port)."""
        return self._log_server.port

    def log_path(self, namespace: str, name: str, container: str | None = None) -> Path:
        """The log file of the latest run of `container` (default: the app container)."""
        try:
            return self._log_source(namespace, name, container, previous=False).path
        except LogRequestError as error:
            raise KeyError(error.message) from None

    def ports(self, namespace: str, name: str) -> dict[str, int]:
        """The ports given to the pod's port env vars (e.g. where its metrics are served)."""
        with self._lock:
            matches = [p for p in self._pods.values() if p.key == f"{namespace}/{name}"]
        return dict(matches[-1].ports) if matches else {}

    def close(self, grace_s: float = 5.0) -> None:
        """Stop every node agent and every process (SIGTERM, then SIGKILL after grace_s),
        and delete the PersistentVolumes of provision_claim. Pod statuses are not written:
        the runner's nodes are considered gone."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            agents, pods = list(self._agents.values()), list(self._pods.values())
        for agent in agents:
            agent.stop()
        for entry in pods:
            with entry.lock:
                entry.abandoned = True
                if entry.process is not None and entry.process.poll() is None:
                    entry.process.send_signal(signal.SIGTERM)
        self._stop_pods(pods, grace_s)
        for entry in pods:
            _close_forwards(entry)
        self._log_server.close()
        if self._made_visible is not None:
            shutil.rmtree(self._made_visible, ignore_errors=True)
        for volume in self._volumes:
            # Best effort: at interpreter exit the API server may be gone already.
            with contextlib.suppress(client.ApiException, Urllib3Error, OSError):
                self.core.delete_persistent_volume(volume, _request_timeout=5)
        atexit.unregister(self.close)

    # ---- internals: nodes ----------------------------------------------------------------------

    def _node_identity(self) -> dict[str, Any]:
        """The node status fields that say how to reach this "kubelet" (every heartbeat
        writes them: a node taken over from kwok had kwok's)."""
        return {
            # Only InternalIP: kube-apiserver dials the first of its preferred address types
            # (Hostname first by default) that a node has, and node names do not resolve.
            # `$patch: replace`, since addresses merge by type otherwise.
            "addresses": [
                {"type": "InternalIP", "address": podspec.POD_IP},
                {"$patch": "replace"},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self._log_server.port}},
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "sailplan-podrunner",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "podrunner://local-process",
                "osImage": "local processes",
                "kernelVersion": os.uname().release,
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }

    def _lose_node(self, name: str) -> list[_Pod]:
        """Stop playing node `name` and SIGKILL its processes, reporting nothing."""
        with self._lock:
            agent = self._agents.pop(name, None)
        if agent is not None:
            agent.stop()
        pods = self._pods_on(name)
        for entry in pods:
            self._abandon(entry)
        return pods

    def _agent(self, name: str) -> _NodeAgent:
        with self._lock:
            agent = self._agents.get(name)
        if agent is None:
            raise KeyError(f"node {name} is not run by this pod runner")
        return agent

    def _start_agent(self, name: str) -> None:
        agent = _NodeAgent(self, name)
        with self._lock:
            if self._closed:
                raise RuntimeError("pod runner is closed")
            self._agents[name] = agent
        agent.start()

    def _wait_schedulable(self, name: str, timeout_s: float) -> None:
        # The API server taints a new node not-ready until the node lifecycle controller has
        # seen it Ready; a pod created before that would stay Pending for a scheduler retry.
        deadline = time.monotonic() + timeout_s
        while True:
            node = self.core.read_node(name)
            taints = [t.key for t in node.spec.taints or ()]
            ready = any(
                c.type == "Ready" and c.status == "True" for c in node.status.conditions or ()
            )
            if ready and "node.kubernetes.io/not-ready" not in taints:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {name} not schedulable after {timeout_s:.0f}s")
            time.sleep(0.2)

    def _set_node_not_ready(self, name: str, reason: str, message: str) -> None:
        now = _now()
        status = "False" if reason == "KubeletNotReady" else "Unknown"
        condition = {
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        self.core.patch_node_status(name, {"status": {"conditions": [condition]}})

    # ---- internals: logs -----------------------------------------------------------------------

    def _log_source(
        self, namespace: str, name: str, container: str | None, previous: bool
    ) -> LogSource:
        """The log of a container's latest (or previous) run, for the log endpoint.

        Errors are the kubelet's: 404 for an unknown pod or container, 400 for a container
        that has not started yet or has no previous run.
        """
        with self._lock:
            matches = [p for p in self._pods.values() if p.key == f"{namespace}/{name}"]
        if not matches:
            raise LogRequestError(404, f'pod "{namespace}/{name}" does not exist')
        entry = matches[-1]
        with entry.lock:
            wanted = container if container is not None else entry.runs[-1].name
            runs = [r for r in entry.runs if r.name == wanted]
            if not runs:
                raise LogRequestError(404, f'container "{wanted}" not found in pod "{name}"')
            run = runs[0]
            # restartCount counts finished runs; the newest run that left a file is the
            # current one (the run numbered restartCount may not have started yet).
            latest = next(
                (n for n in range(run.restarts, -1, -1) if entry.log_file(wanted, n).exists()),
                None,
            )
            if latest is None:
                reason = run.state.get("waiting", {}).get("reason", "ContainerCreating")
                raise LogRequestError(
                    400, f'container "{wanted}" in pod "{name}" is waiting to start: {reason}'
                )
            if previous:
                if latest == 0:
                    raise LogRequestError(
                        400, f'previous terminated container "{wanted}" in pod "{name}" not found'
                    )
                return LogSource(entry.log_file(wanted, latest - 1), lambda: False)
            process = entry.process

        def running() -> bool:
            with entry.lock:
                return (
                    entry.current is run
                    and entry.process is process
                    and process is not None
                    and process.poll() is None
                )

        return LogSource(entry.log_file(wanted, latest), running)

    # ---- internals: pod events -----------------------------------------------------------------

    def _pods_on(self, node: str) -> list[_Pod]:
        with self._lock:
            return [p for p in self._pods.values() if p.node == node]

    def _resync(self, agent: _NodeAgent, pods: list[dict[str, Any]]) -> None:
        """After a (re)list: handle every listed pod, forget the ones that vanished."""
        listed = {podspec.meta(p)["uid"] for p in pods}
        for entry in self._pods_on(agent.name):
            if entry.uid not in listed:
                self._on_event(agent, "DELETED", entry.pod)
        for pod in pods:
            self._on_event(agent, "MODIFIED", pod)

    def _on_event(self, agent: _NodeAgent, kind: str, pod: dict[str, Any]) -> None:
        if agent.stopped.is_set():
            return
        metadata = podspec.meta(pod)
        phase = (pod.get("status") or {}).get("phase", "Pending")
        with self._lock:
            if self._closed:
                return
            entry = self._pods.get(metadata["uid"])
            new = entry is None and kind != "DELETED" and phase not in _TERMINAL
            if new:
                directory = (
                    self._visible
                    / "pods"
                    / (f"{metadata['namespace']}_{metadata['name']}_{metadata['uid'][:8]}")
                )
                entry = _Pod(uid=metadata["uid"], node=agent.name, pod=pod, directory=directory)
                given = str((pod.get("status") or {}).get("podIP") or "")
                # A pod keeps an address it already has (see _patch_status).
                entry.ip = given if given.startswith("127.") else self._addresses.next()
                entry.order = podspec.run_order(pod)
                entry.runs = podstatus.container_runs(entry.order)
                self._pods[entry.uid] = entry
        if entry is None:
            # Finished before this runner saw it: only a pending deletion is left to do.
            if kind != "DELETED" and metadata.get("deletionTimestamp"):
                self._finalize_delete(pod)
            return
        if kind == "DELETED":
            self._forget(entry)
            return
        with entry.lock:
            old, entry.pod = entry.pod, pod
            if new and phase == "Running":
                # Started before this runner took the node over: its container is not here.
                # A kubelet that lost a container's state reports it the same way. Running
                # means its init containers had completed.
                entry.start_time = (pod.get("status") or {}).get("startTime") or _now()
                for run in entry.runs[:-1]:
                    run.state = podstatus.terminated_state(
                        0, entry.start_time, entry.start_time, ""
                    )
                entry.step = len(entry.runs) - 1
                self._report_terminal(
                    entry,
                    exit_code=137,
                    message="The container could not be located when the pod was terminated",
                    reason="ContainerStatusUnknown",
                )
            elif new:
                self._start(entry)
            elif podspec.metadata_changed(old, pod):
                self._refresh_metadata_volumes(entry)
            if metadata.get("deletionTimestamp") and not entry.deleting:
                entry.deleting = True
                threading.Thread(
                    target=self._terminate, args=(entry,), name="terminate", daemon=True
                ).start()

    def _forget(self, entry: _Pod) -> None:
        with self._lock:
            self._pods.pop(entry.uid, None)
        # Force-deleted while running: nothing will report it, stop it at once.
        self._abandon(entry)
        _close_forwards(entry)

    @staticmethod
    def _abandon(entry: _Pod) -> None:
        """SIGKILL the pod's process group; its status is no longer reported."""
        with entry.lock:
            entry.abandoned = True
            if entry.process is not None and entry.process.poll() is None:
                _signal_group(entry.process.pid, signal.SIGKILL)

    # ---- internals: starting a pod ------------------------------------------------------------

    def _start(self, entry: _Pod) -> None:
        """Start the container whose turn it is (entry.step): volumes on the first call, then
        its launch and process (entry.lock held)."""
        if entry.process is not None or entry.finished.is_set() or entry.deleting:
            return
        pod = entry.pod
        container, _ = entry.order[entry.step]
        entry.start_time = entry.start_time or _now()
        try:
            volumes = entry.volumes
            if volumes is None:
                volumes = podspec.render_volumes(pod, self._sources)
            allocatable = self._allocatable(entry.node)
            spec = podspec.launch(
                pod, self._sources, self.entrypoints, allocatable, container, pod_ip=entry.ip
            )
            image = self.images.get(str(container.get("image", "")), UNKNOWN_IMAGE)
            identity = security.container_identity(pod, container, image)
            services = self._service_names(podspec.meta(pod)["namespace"])
        except (podspec.PodConfigError, client.ApiException, Urllib3Error, OSError) as error:
            # Like the kubelet: report why the container waits, try again shortly.
            reason, message = "ContainerCreating", str(error)
            if isinstance(error, podspec.PodConfigError):
                reason, message = error.reason, error.message
            entry.current.state = podstatus.waiting(reason, message)
            self._patch_pod_status(entry)
            self._retry_later(entry)
            return
        if entry.volumes is None:
            # Once per pod, as the kubelet mounts before the first init container: every
            # container then sees the same emptyDir directory.
            self._materialize(entry, volumes)
            entry.volumes = volumes
        root = entry.directory / "rootfs" / spec.container
        read_only = security.read_only_root(container)
        image_dirs = podfs.make_root_filesystem(root, image, read_only, self._is_root)
        mounts: dict[str, str] = {}
        for mount in spec.mounts:
            if mount.volume not in entry.volume_dirs:
                continue
            volume_dir = entry.volume_dirs[mount.volume]
            local_path = volume_dir / mount.sub_path
            if mount.sub_path:
                local_path = podfs.make_sub_path(volume_dir, mount.sub_path, self._is_root)
            mounts[mount.mount_path] = str(local_path)
        # A mount hides the image's directory at its path, as it does in a container.
        rewrite = podspec.path_rewriter(image_dirs | mounts)
        if self.rewrite_config_files:
            self._rewrite_config_files(entry, volumes, rewrite)
        spec_pod = pod.get("spec") or {}
        names = podspec.LocalNames(
            namespace=podspec.meta(pod)["namespace"],
            services=frozenset(services),
            subdomain=spec_pod.get("subdomain", ""),
        )

        def local(text: str) -> str:
            # Hosts first: the local directories must not be mistaken for DNS names.
            return rewrite(podspec.localize_hosts(text, names))

        def local_dir(path: str) -> str:
            # A directory of the container (cwd, HOME): a volume's or the image's if it is
            # one, else made in the container's root directory, never on this machine's /.
            rewritten = local(path)
            made = Path(rewritten) if rewritten != path else root / path.strip("/")
            # The runtime creates a missing one; where this runner may not (a non-root
            # runner under a read-only root), starting the process reports the error.
            with contextlib.suppress(OSError):
                made.mkdir(parents=True, exist_ok=True)
            return str(made)

        argv = [local(a) for a in spec.argv]
        hostname = spec_pod.get("hostname") or podspec.meta(pod)["name"]
        # HOME from the image's passwd entry of the uid, as the runtime sets it; TMPDIR so
        # that tempfile users write to the container's /tmp, not to this machine's.
        image_env = {"HOME": local_dir(identity.home), "TMPDIR": local_dir("/tmp")}
        env = self._process_env(
            entry, spec, hostname, mounts, local, image_env=image_env, identity=identity
        )
        cwd = local_dir(spec.working_dir or image.workdir)
        self._spawn(entry, argv, env, cwd, identity)

    def _retry_later(self, entry: _Pod) -> None:
        timer = threading.Timer(self.retry_s, self._retry, args=(entry,))
        timer.daemon = True
        timer.start()

    def _retry(self, entry: _Pod) -> None:
        with entry.lock:
            if not (self._closed or entry.abandoned or entry.deleting or entry.process):
                self._start(entry)

    def _allocatable(self, node: str) -> dict[str, str]:
        try:
            allocatable: dict[str, str] = self.core.read_node(node).status.allocatable or {}
        except client.ApiException:
            return {}
        return allocatable

    def _service_names(self, namespace: str) -> list[str]:
        return [s.metadata.name for s in self.core.list_namespaced_service(namespace).items]

    def _materialize(self, entry: _Pod, volumes: Iterable[podspec.Volume]) -> None:
        root = entry.directory / "volumes"
        entry.fs_group = security.fs_group(entry.pod)
        tracked = []
        for volume in volumes:
            if volume.shared_key is not None:
                directory = self._visible / "shared" / volume.shared_key
            else:
                directory = root / volume.name
            podfs.prepare_volume(directory, volume.source, entry.fs_group, self._is_root)
            entry.volume_dirs[volume.name] = directory
            self._write_files(entry, directory, volume.files or ())
            if volume.tracks_metadata:
                tracked.append(volume.name)
        entry.tracked_volumes = tuple(tracked)

    def _write_files(
        self, entry: _Pod, directory: Path, files: Iterable[podspec.VolumeFile]
    ) -> None:
        podfs.write_volume_files(directory, files, entry.fs_group, self._is_root)

    def _rewrite_config_files(
        self, entry: _Pod, volumes: Iterable[podspec.Volume], rewrite: Callable[[str], str]
    ) -> None:
        # A ConfigMap may name mount paths (the trainer config's checkpoint_dir): the local
        # process must find them where this runner put those volumes.
        for volume in volumes:
            if volume.source != "configMap":
                continue
            for item in volume.files or ():
                try:
                    text = item.content.decode()
                except UnicodeDecodeError:
                    continue
                changed = rewrite(text)
                if changed != text:
                    path = entry.volume_dirs[volume.name] / item.path
                    mode = security.rendered_file_mode(item.mode, entry.fs_group)
                    group = entry.fs_group if self._is_root else None
                    podfs.write_atomic(path, changed.encode(), mode, group)

    def _refresh_metadata_volumes(self, entry: _Pod) -> None:
        """Re-render the downward API files that follow labels/annotations (entry.lock held)."""
        wanted = set(entry.tracked_volumes)
        for volume in (entry.pod.get("spec") or {}).get("volumes") or []:
            if volume["name"] not in wanted:
                continue
            try:
                rendered = podspec.render_volume(entry.pod, volume, self._sources)
            except podspec.PodConfigError as error:
                log.warning("%s: cannot refresh volume %s: %s", entry.key, volume["name"], error)
                continue
            self._write_files(entry, entry.volume_dirs[volume["name"]], rendered.files or ())

    def _process_env(
        self,
        entry: _Pod,
        spec: podspec.Launch,
        hostname: str,
        mounts: Mapping[str, str],
        local: Callable[[str], str],
        *,
        image_env: Mapping[str, str],
        identity: security.Identity,
    ) -> dict[str, str]:
        server = urlparse(self.api.configuration.host)
        env = {
            # What the image would provide: this machine's tools, the runner's Python first.
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            **image_env,
            "HOSTNAME": hostname,
            **({"LANG": os.environ["LANG"]} if "LANG" in os.environ else {}),
            **self.env,
            # What the kubelet adds for the `kubernetes` Service: here, the API server itself.
            "KUBERNETES_SERVICE_HOST": server.hostname or podspec.POD_IP,
            "KUBERNETES_SERVICE_PORT": str(server.port or 443),
        }
        env.update(
            {
                name: value if name in spec.field_env else local(value)
                for name, value in spec.env.items()
            }
        )
        token_dir = mounts.get(podspec.SERVICE_ACCOUNT_MOUNT)
        if token_dir is not None and "KUBECONFIG" not in env:
            # The client libraries read the in-cluster token from a fixed path; a kubeconfig
            # with the pod's own bound token is the local process's way to the same identity.
            env["KUBECONFIG"] = str(self._pod_kubeconfig(entry, Path(token_dir), identity))
        for name in self.port_env:
            if env.get(name) != "0":
                entry.ports[name] = _free_port()
                self._forward(entry, name, spec.env.get(name), entry.ports[name])
                env[name] = str(entry.ports[name])
        return env

    @staticmethod
    def _forward(entry: _Pod, name: str, asked: str | None, port: int) -> None:
        """podIP:<the port the pod asked for> -> the free port its process got."""
        if not (asked or "").isdigit() or not 0 < int(asked or "0") < 65536:
            return
        forward = entry.forwards.get(name)
        if forward is not None:
            forward.target = port  # a restarted container got a new free port
            return
        try:
            entry.forwards[name] = podnet.PortForward(entry.ip, int(asked or "0"), port)
        except OSError as error:
            log.warning("%s: no forward from %s:%s: %s", entry.key, entry.ip, asked, error)

    def _pod_kubeconfig(self, entry: _Pod, token_dir: Path, identity: security.Identity) -> Path:
        namespace = podspec.meta(entry.pod)["namespace"]
        ca = token_dir / "ca.crt"
        cluster: dict[str, Any] = {"server": self.api.configuration.host}
        if ca.exists():
            cluster["certificate-authority"] = str(ca)
        else:
            cluster["insecure-skip-tls-verify"] = True
        token = (token_dir / "token").read_text() if (token_dir / "token").exists() else ""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": "pod", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "pod",
                    "context": {"cluster": "local", "user": "pod", "namespace": namespace},
                }
            ],
            "current-context": "pod",
        }
        path = entry.directory / "kubeconfig"
        podfs.write_atomic(path, yaml.safe_dump(config).encode(), 0o600)
        if self._is_root:
            os.chown(path, identity.uid, identity.gid)  # the process's own credentials
        return path

    def _as_identity(
        self, identity: security.Identity, argv: list[str]
    ) -> tuple[list[str], dict[str, Any]]:
        """argv and Popen options that run the process as `identity` (security.launch_mode)."""
        # What the process must reach: this Python, the repository, the pod directories.
        needed = [
            os.path.realpath(sys.executable),
            sys.prefix,
            sys.base_prefix,
            str(Path(podspec.__file__).resolve().parent),
            str(self._visible.resolve()),
        ]

        def stat_of(path: str) -> tuple[int, int, int]:
            info = os.stat(path)
            return info.st_uid, info.st_gid, info.st_mode

        blocked = security.blocked_directory(needed, identity, stat_of)
        mode = security.launch_mode(os.geteuid(), identity, blocked, self._setpriv)
        note = f"{mode.value}:{blocked}"
        if blocked is not None and note not in self._launch_notes:
            self._launch_notes.add(note)
            log.warning(
                "uid %d cannot search %s, which holds this machine's Python or the pod "
                "directories (an image would have them readable): %s",
                identity.uid,
                blocked,
                "its processes get CAP_DAC_READ_SEARCH (reads unchecked, writes checked)"
                if mode is security.LaunchMode.SET_IDS_READ_ALL
                else "setpriv is missing, so they run as the runner (checks only)",
            )
        if mode is security.LaunchMode.SET_IDS:
            options = {"user": identity.uid, "group": identity.gid, "extra_groups": identity.groups}
            return argv, options
        if mode is security.LaunchMode.SET_IDS_READ_ALL and self._setpriv:
            return security.setpriv_argv(self._setpriv, identity, argv), {}
        return argv, {}

    def _spawn(
        self,
        entry: _Pod,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        identity: security.Identity,
    ) -> None:
        """Start the current run's process as `identity`, its output in the run's own log
        file."""
        argv, identity_options = self._as_identity(identity, argv)
        run = entry.current
        log_file = entry.log_file(run.name, run.restarts)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as out:
            try:
                # Own session = own process group: SIGKILL reaches the whole "container"
                # (e.g. the trainer's per-rank children), as a cgroup kill would.
                process = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    **identity_options,
                )
            except OSError as error:
                entry.started_at = _now()
                # What the container runtime reports when the executable cannot be started.
                self._report_terminal(entry, exit_code=128, message=str(error))
                return
        entry.process = process
        run.container_id = f"podrunner://{process.pid}"
        entry.started_at = _now()
        run.state = podstatus.running(entry.started_at)
        self._patch_pod_status(entry)
        threading.Thread(
            target=self._wait, args=(entry, process), name=f"wait-{process.pid}", daemon=True
        ).start()

    # ---- internals: process exit and pod deletion ----------------------------------------------

    def _wait(self, entry: _Pod, process: subprocess.Popen[bytes]) -> None:
        returncode = process.wait()
        # The container ends with its main process: whatever it left behind goes too.
        _signal_group(process.pid, signal.SIGKILL)
        code = podstatus.exit_code(returncode)
        with entry.lock:
            if entry.abandoned:
                entry.finished.set()
                return
            run = entry.current
            going_on = not entry.deleting and entry.disruption is None and not self._closed
            next_turn = going_on and run.init and code == 0
            restart = going_on and not next_turn and podstatus.restarts_after(entry.pod, code)
            finished = podstatus.terminated_state(code, entry.started_at, _now(), run.container_id)
            if next_turn or restart:
                entry.process = None  # kept otherwise: _stop_pods waits for its report
                entry.started_at = ""
            if next_turn:
                # Next container's turn (the kubelet starts it at once).
                run.state = finished
                entry.step += 1
                self._start(entry)
                return
            if restart:
                run.last_state = finished
                run.restarts += 1
                run.state = podstatus.waiting(
                    "CrashLoopBackOff", f"back-off restarting failed container {run.name}"
                )
                self._patch_pod_status(entry)
                self._retry_later(entry)
                return
            self._report_terminal(entry, exit_code=code)

    def _report_terminal(
        self, entry: _Pod, *, exit_code: int, message: str = "", reason: str = ""
    ) -> None:
        with entry.lock:
            if entry.finished.is_set():
                return
            run = entry.current
            run.state = podstatus.terminated_state(
                exit_code, entry.started_at or _now(), _now(), run.container_id, message
            )
            if reason:
                run.state["terminated"]["reason"] = reason
            self._patch_pod_status(entry, terminal=True)
            entry.finished.set()
            deleting = entry.deleting
        if deleting:
            self._finalize_delete(entry.pod)

    def _terminate(self, entry: _Pod) -> None:
        """Graceful deletion: SIGTERM, the grace period, SIGKILL, final status, delete."""
        metadata, spec = podspec.meta(entry.pod), entry.pod.get("spec") or {}
        grace = metadata.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        with entry.lock:
            process = entry.process
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
            elif process is None and not entry.finished.is_set():
                entry.finished.set()  # never started, or between restarts: nothing to stop
            elif not entry.finished.is_set():
                return  # exited just now: its waiter reports it and deletes the pod
            done = entry.finished.is_set()
        if done:
            self._finalize_delete(entry.pod)
            return
        self._stop_pods([entry], float(grace))

    def _stop_pods(self, pods: list[_Pod], grace_s: float) -> None:
        """Wait up to grace_s for the pods' processes to end, then SIGKILL the rest."""
        deadline = time.monotonic() + grace_s
        for entry in pods:
            process = entry.process
            if process is None:
                continue
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
        for entry in pods:
            if entry.process is not None:
                # The waiter thread reports the status; wait for it so callers see it done.
                entry.finished.wait(timeout=10.0)

    def _finalize_delete(self, pod: Mapping[str, Any]) -> None:
        metadata = podspec.meta(pod)
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": metadata["uid"]}}
        try:
            self.core.delete_namespaced_pod(metadata["name"], metadata["namespace"], body=body)
        except client.ApiException as error:
            if error.status not in (404, 409):  # already gone, or a newer pod of that name
                log.warning("delete of pod %s failed: %s", podspec.key(pod), error.reason)

    def _patch_pod_status(self, entry: _Pod, terminal: bool = False) -> None:
        """Report the pod from its container runs (entry.lock held)."""
        entry.start_time = entry.start_time or _now()
        status = podstatus.pod_status(
            entry.pod,
            entry.runs,
            start_time=entry.start_time,
            now=_now(),
            terminal=terminal,
            disruption=entry.disruption,
            pod_ip=entry.ip,
        )
        self._patch_status(entry, status)

    def _patch_status(self, entry: _Pod, status: dict[str, Any]) -> None:
        metadata = podspec.meta(entry.pod)
        if (entry.pod.get("status") or {}).get("podIP"):
            # A pod keeps the IPs it was given (podIPs merge by ip: a second one is invalid),
            # e.g. the fake one kwok gave a pod before this runner took its node over.
            status = {k: v for k, v in status.items() if k not in _ADDRESS_FIELDS}
        try:
            self.core.patch_namespaced_pod_status(
                metadata["name"], metadata["namespace"], {"status": status}
            )
        except client.ApiException as error:
            if error.status != 404:
                log.warning("status of pod %s: %s %s", entry.key, error.reason, error.body)
        except (Urllib3Error, OSError) as error:
            log.warning("status of pod %s: %s", entry.key, error)


def _close_forwards(entry: _Pod) -> None:
    with entry.lock:
        forwards, entry.forwards = list(entry.forwards.values()), {}
    for forward in forwards:
        forward.close()


def clear_workdir(workdir: Path) -> None:
    """Remove a runner's pod and shared directories (for `sailplan demo` restarts)."""
    shutil.rmtree(workdir, ignore_errors=True)
