"""LocalCluster: bring the loopback control plane up with GKE-like nodes, change its nodes, tear it down.

The one object tests, `sailplan cluster ...` and `sailplan demo` use. `up` is idempotent: a
running cluster of that name is reused (missing nodes are added, extra ones kept), a stopped
one is restarted, a broken one recreated. Nodes are ordinary API objects created here, so
tests can add, delete, cordon them or flip their readiness while the operator watches, the
way node pools scale and spot VMs vanish on GKE.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from . import build, kwokctl
from .kubeconfig import accepts_connections, api_client, is_ready
from .nodes import (
    MANAGER_KWOK,
    MANAGER_LABEL,
    NODEPOOL_LABEL,
    NodeFile,
    NodePool,
    load_node_file,
    node_manifest,
    node_manifests,
    node_name,
)
from .waiting import wait_until

DEFAULT_NAME = "sailplan"
# kwokctl uses the name in paths, the kubeconfig context and process titles.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?")


class ClusterError(RuntimeError):
    """A user-facing failure of the local cluster (the CLI prints it on one line, exit 2)."""


class BinariesMissingError(ClusterError):
    def __init__(self, missing: Iterable[str]) -> None:
        super().__init__(f"binaries not built ({', '.join(missing)}): run `sailplan cluster build`")


def _wait(what: str, check: Callable[[], bool], timeout_s: float, interval_s: float = 0.5) -> None:
    wait_until(what, check, timeout_s, ClusterError, interval_s)


def _ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ())


@dataclass
class LocalCluster:
    name: str
    kubeconfig: Path
    root: Path | None = None
    # The node file `up` created the nodes from; reset_nodes() returns to it.
    node_file: NodeFile | None = None
    _api: Any = field(default=None, init=False, repr=False)
    _attached: bool = field(default=False, init=False, repr=False)

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    def up(
        cls,
        node_file: NodeFile | None = None,
        name: str = DEFAULT_NAME,
        root: Path | None = None,
        timeout_s: float = 300.0,
        log: Callable[[str], None] = lambda _msg: None,
    ) -> LocalCluster:
        """Start (or reuse) the cluster `name`, create the node file's nodes, wait until usable.

        Usable means: /readyz ok, the `default` service account exists (the controller
        manager is running: pods can be created), every node of the file is Ready (kwok is
        running and manages them).
        """
        if not _NAME.fullmatch(name):
            raise ClusterError(f"invalid cluster name {name!r}: use lowercase letters, digits, '-'")
        missing = build.missing_binaries(root, build.CONTROL_PLANE_NAMES)
        if missing:
            raise BinariesMissingError(missing)
        node_file = node_file or load_node_file()
        # Two `up`s of one name (two shells, two test sessions) must not both create it.
        with build.file_lock(kwokctl.workdir(root) / f"{name}.lock"):
            cls._start(name, root, log)
        cluster = cls(name, kwokctl.kubeconfig_path(name, root), root, node_file)
        deadline = time.monotonic() + timeout_s
        _wait("the API server to be ready", cluster.healthy, deadline - time.monotonic())
        _wait(
            "the default service account",
            cluster._default_service_account_exists,
            deadline - time.monotonic(),
        )
        names = cluster.ensure_nodes(node_manifests(node_file))
        cluster.wait_nodes_ready(names, deadline - time.monotonic())
        return cluster

    @classmethod
    def _start(cls, name: str, root: Path | None, log: Callable[[str], None]) -> None:
        try:
            if not kwokctl.exists(name, root):
                log(f"creating cluster {name}")
                kwokctl.create(name, root)
            elif not cls(name, kwokctl.kubeconfig_path(name, root), root).healthy(within_s=10):
                log(f"restarting cluster {name}")
                try:
                    kwokctl.restart(name, root)
                except kwokctl.KwokctlError:
                    log(f"restart failed; recreating cluster {name}")
                    kwokctl.delete(name, root)
                    kwokctl.create(name, root)
            else:
                log(f"reusing running cluster {name}")
        except kwokctl.KwokctlError as error:
            raise ClusterError(str(error)) from error

    @classmethod
    def attach(cls, kubeconfig: Path) -> LocalCluster:
        """A handle on a running cluster someone else started; down() leaves it running.

        A kubeconfig inside the kwokctl work directory names its cluster
        (.../clusters/NAME/kubeconfig.yaml); any other gets the name "existing".
        """
        path = Path(kubeconfig).resolve()
        name = path.parent.name if path.parent.parent.name == "clusters" else "existing"
        cluster = cls(name, path, None)
        cluster._attached = True
        return cluster

    def down(self) -> None:
        if not self._attached and kwokctl.exists(self.name, self.root):
            try:
                kwokctl.delete(self.name, self.root)
            except kwokctl.KwokctlError as error:
                raise ClusterError(str(error)) from error
        self._api = None

    def healthy(self, within_s: float = 0.0) -> bool:
        """The API server answers /readyz, now or (on a busy machine) within `within_s`."""
        if not self.kubeconfig.exists():
            return False
        deadline = time.monotonic() + within_s
        while not is_ready(self.api, timeout_s=3.0):
            if time.monotonic() >= deadline or not accepts_connections(self.kubeconfig):
                return False
            time.sleep(0.5)
        return True

    # ---- clients ---------------------------------------------------------------------------

    @property
    def api(self) -> Any:
        """kubernetes.client.ApiClient bound to this cluster's kubeconfig."""
        if self._api is None:
            self._api = api_client(self.kubeconfig)
        return self._api

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    def _default_service_account_exists(self) -> bool:
        try:
            self.core.read_namespaced_service_account("default", "default")
        except client.ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    # ---- nodes -----------------------------------------------------------------------------

    def ensure_nodes(self, manifests: Iterable[dict[str, Any]]) -> list[str]:
        """Create the nodes that do not exist yet; returns all their names."""
        existing = {n.metadata.name for n in self.core.list_node().items}
        manifests = list(manifests)
        self._create_nodes([m for m in manifests if m["metadata"]["name"] not in existing])
        return [m["metadata"]["name"] for m in manifests]

    def create_node(self, manifest: dict[str, Any]) -> str:
        """Create one Node (e.g. from nodes.node_manifest).

        The API server keeps a Node's status on create (unlike most kinds), so capacity and
        allocatable are the manifest's before kwok's initialize stage, which keeps them.
        """
        self.core.create_node(manifest)
        name: str = manifest["metadata"]["name"]
        return name

    def _create_nodes(self, manifests: list[dict[str, Any]]) -> list[str]:
        # Hundreds of nodes for the scale benchmark: round trips dominate, so overlap them.
        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(self.create_node, manifests))

    def add_node(self, pool: str | NodePool, zone: str, wait: bool = True) -> str:
        """One more node of a pool (by name from this cluster's node file, or any NodePool)
        in `zone`, as when a node pool scales up; returns its name."""
        if isinstance(pool, str):
            pools = {p.name: p for p in (self.node_file or load_node_file()).pools}
            if pool not in pools:
                raise ClusterError(f"no pool {pool!r} in the node file; pools: {sorted(pools)}")
            pool = pools[pool]
        taken = set(self.node_names(f"{NODEPOOL_LABEL}={pool.name}"))
        index = next(i for i in range(len(taken) + 1) if node_name(pool.name, zone, i) not in taken)
        [name] = self.add_nodes([node_manifest(pool, zone, index)], wait=wait)
        return name

    def add_nodes(self, manifests: Iterable[dict[str, Any]], wait: bool = True) -> list[str]:
        names = self._create_nodes(list(manifests))
        if wait:
            self.wait_nodes_ready(names)
        return names

    def delete_node(self, name: str, wait: bool = True) -> None:
        self.core.delete_node(name)
        if wait:
            _wait(f"node {name} to be deleted", lambda: not self._node_exists(name), 60.0)

    def cordon(self, name: str, unschedulable: bool = True) -> None:
        self.core.patch_node(name, {"spec": {"unschedulable": unschedulable}})

    def set_node_agent(self, name: str, agent: str) -> None:
        """Hand a node to another kubelet stand-in (e.g. the e2e runner) or back to "kwok".

        kwok only heartbeats and runs pods of nodes labelled MANAGER_LABEL=kwok; whoever
        takes a node must renew its lease or the node lifecycle controller marks it Unknown
        after the 50 s grace period.
        """
        self.core.patch_node(name, {"metadata": {"labels": {MANAGER_LABEL: agent}}})

    def set_node_ready(self, name: str, ready: bool) -> None:
        """Make a node NotReady (its kubelet stopped answering) or Ready again.

        NotReady: kwok stops managing the node (its label changes to "none") and the Ready
        condition is set to False, as the node lifecycle controller would after missed
        heartbeats, but at once. Ready: kwok takes the node back and its initialize stage
        reports Ready again.
        """
        if ready:
            self.set_node_agent(name, MANAGER_KWOK)
            self.wait_nodes_ready([name])
            return
        self.set_node_agent(name, "none")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        node = self.core.read_node(name)
        conditions = [
            {
                "type": c.type,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastHeartbeatTime": c.last_heartbeat_time,
                "lastTransitionTime": c.last_transition_time,
            }
            for c in node.status.conditions or ()
            if c.type != "Ready"
        ]
        conditions.append(
            {
                "type": "Ready",
                "status": "False",
                "reason": "KubeletNotReady",
                "message": "sailplan local cluster: node set NotReady",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        )
        # A strategic merge on conditions merges by type; a full list keeps it explicit.
        self.core.patch_node_status(name, {"status": {"conditions": conditions}})

    def preempt_node(self, name: str, delete: bool = True) -> list[str]:
        """Spot preemption as GKE shows it: pods Failed with DisruptionTarget, node gone.

        On a preempted spot VM the kubelet's graceful node shutdown marks every pod Failed
        with condition DisruptionTarget (reason TerminationByKubelet), then the node goes
        NotReady and is deleted or recreated. kwok has no shutdown manager, so the pod status
        the kubelet would write is written here, after kwok lets go of the node. Returns the
        affected pods as "namespace/name".
        """
        self.set_node_agent(name, "none")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        message = "Pod was terminated in response to imminent node shutdown."
        affected = []
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}")
        for pod in pods.items:
            if pod.status.phase in ("Succeeded", "Failed"):
                continue
            containers = [
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {
                        "terminated": {
                            "exitCode": 143,  # 128 + SIGTERM
                            "reason": "Error",
                            "finishedAt": now,
                        }
                    },
                }
                for c in pod.spec.containers
            ]
            status = {
                "phase": "Failed",
                "reason": "Terminated",
                "message": message,
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "TerminationByKubelet",
                        "message": message,
                        "lastTransitionTime": now,
                    },
                    {"type": "Ready", "status": "False", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "False", "lastTransitionTime": now},
                ],
                "containerStatuses": containers,
            }
            self.core.patch_namespaced_pod_status(
                pod.metadata.name, pod.metadata.namespace, {"status": status}
            )
            affected.append(f"{pod.metadata.namespace}/{pod.metadata.name}")
        if delete:
            self.delete_node(name)
        else:
            self.set_node_ready(name, False)
        return affected

    def reset_nodes(self, timeout_s: float = 120.0) -> None:
        """Back to the node file's nodes: extra ones deleted, missing ones created, all
        schedulable, managed by kwok and Ready. For tests that changed nodes."""
        manifests = node_manifests(self.node_file or load_node_file())
        wanted = {m["metadata"]["name"] for m in manifests}
        for node in self.core.list_node().items:
            name = node.metadata.name
            if name not in wanted:
                self.core.delete_node(name)
                continue
            labels = node.metadata.labels or {}
            if node.spec.unschedulable or labels.get(MANAGER_LABEL) != MANAGER_KWOK:
                self.core.patch_node(
                    name,
                    {
                        "spec": {"unschedulable": None},
                        "metadata": {"labels": {MANAGER_LABEL: MANAGER_KWOK}},
                    },
                )
        self.ensure_nodes(manifests)
        self.wait_nodes_ready(wanted, timeout_s)

    def node_names(self, label_selector: str = "") -> list[str]:
        return sorted(
            n.metadata.name for n in self.core.list_node(label_selector=label_selector).items
        )

    def wait_nodes_ready(self, names: Iterable[str], timeout_s: float = 120.0) -> None:
        wanted = set(names)

        def all_ready() -> bool:
            ready = {n.metadata.name for n in self.core.list_node().items if _ready(n)}
            return wanted <= ready

        _wait(f"{len(wanted)} node(s) to be Ready", all_ready, timeout_s)

    def _node_exists(self, name: str) -> bool:
        try:
            self.core.read_node(name)
        except client.ApiException as error:
            if error.status == 404:
                return False
            raise
        return True
