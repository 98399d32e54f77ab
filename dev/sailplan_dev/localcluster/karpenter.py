"""Karpenter (kwok cloud provider) as the local cluster's node autoscaler: the process.

A GPUPool with spec.autoscaling counts nodes that do not exist yet: the operator creates
worker pods pinned to the pool and zone and relies on a node autoscaler to add the nodes.
The Kubernetes cluster-autoscaler is not served by the module proxy here; Karpenter is, and
its kwok provider makes Node objects instead of VMs. So the autoscaling cluster test
(tests/operator/test_karpenter_cluster.py) and benchmarks/autoscale.py run the real
Karpenter, built by `build`, against the local cluster: it sees the pending pods, creates
NodeClaims and Nodes labelled like the GKE node pool's nodes (karpenter_shapes), the
cluster's kwok keeps them Ready (their template labels carry MANAGER_LABEL=kwok), and
Karpenter removes them once empty. A stockout is an offering missing from the
instance-types file (karpenter_shapes.without_offerings) that Karpenter was started or
`restart`ed with: it then adds no node for pods that need it, as a cloud out of that
machine in that zone adds none.

Empty nodes go 25-40 s after their last pod: Karpenter's disruption loop polls every 10 s
and waits 15 s before acting on a decision (constants in its code, no settings).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from kubernetes import client

from sailplan_dev.apply import apply, load_documents

from . import build
from .karpenter_shapes import (
    KARPENTER_GROUP,
    KARPENTER_VERSION_API,
    NODE_CLASS,
    NODEPOOL_OF_NODE_LABEL,
    OWNER_LABEL,
    KarpenterError,
)
from .waiting import ignore_404, wait_until

__all__ = ["Karpenter", "KarpenterError"]

_NODEPOOLS: Final = (KARPENTER_GROUP, KARPENTER_VERSION_API, "nodepools")
_NODECLAIMS: Final = (KARPENTER_GROUP, KARPENTER_VERSION_API, "nodeclaims")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _custom(api: Any) -> Any:
    return client.CustomObjectsApi(api)


@dataclass
class Karpenter:
    """One Karpenter process against a cluster, its log in `workdir/karpenter.log`."""

    kubeconfig: Path
    api: Any  # kubernetes.client.ApiClient of the same cluster
    workdir: Path
    root: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    health_port: int = field(default=0, init=False)

    @property
    def log(self) -> Path:
        return self.workdir / "karpenter.log"

    def start(
        self,
        types: list[dict[str, Any]],
        timeout_s: float = 60.0,
        registration_delay_s: int = 0,
    ) -> None:
        """Install the CRDs and the node class, write the instance types, start Karpenter
        and wait until it reports ready (its caches synced and its CRDs served)."""
        binary = build.binary_path("karpenter", self.root)
        if not os.access(binary, os.X_OK):
            raise KarpenterError("karpenter is not built: run `sailplan cluster build`")
        self._install_crds(timeout_s)
        self._create_node_class(registration_delay_s, timeout_s)
        self._launch(binary, types, timeout_s)

    def restart(self, types: list[dict[str, Any]], timeout_s: float = 60.0) -> None:
        """Stop Karpenter and start it again over `types`, once ready.

        The kwok provider reads its instance-types file once, at start: an offering that
        goes or comes back (a stockout that starts or ends) takes a new process. Karpenter
        keeps no state of its own (it reads its NodePools, NodeClaims and nodes back from
        the cluster), so the restarted one carries on where the other stopped.
        """
        self._terminate()
        self._launch(build.binary_path("karpenter", self.root), types, timeout_s)

    def _launch(self, binary: Path, types: list[dict[str, Any]], timeout_s: float) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        types_file = self.workdir / "instance-types.json"
        types_file.write_text(json.dumps(types, indent=1))
        self.health_port = _free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "INSTANCE_TYPES_FILE_PATH": str(types_file),
            # One replica outside the cluster: no Lease to win.
            "DISABLE_LEADER_ELECTION": "true",
            "SYSTEM_NAMESPACE": "kube-system",
            "METRICS_PORT": str(_free_port()),
            "HEALTH_PROBE_PORT": str(self.health_port),
            # Pods arriving within 1 s form one batch, and a batch closes after 3 s at most
            # (defaults 1 s and 10 s): a job's workers are created together.
            "BATCH_IDLE_DURATION": "1s",
            "BATCH_MAX_DURATION": "3s",
            "LOG_LEVEL": "debug",
        }
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(binary)], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            self._wait_ready(timeout_s)
        except KarpenterError:
            self._terminate()
            raise

    def _install_crds(self, timeout_s: float) -> None:
        """NodePool, NodeClaim, KWOKNodeClass (and the two Karpenter watches though their
        features are off), from the module, applied and served."""
        documents = load_documents(build.share_dir("karpenter", self.root).rglob("*.yaml"))
        apply(self.api, documents)
        ext = client.ApiextensionsV1Api(self.api)

        def established() -> bool:
            for document in documents:
                status = ext.read_custom_resource_definition(document["metadata"]["name"]).status
                conditions = (status.conditions if status else None) or ()
                if not any(c.type == "Established" and c.status == "True" for c in conditions):
                    return False
            return True

        _wait("Karpenter's CRDs to be established", established, timeout_s)

    def _create_node_class(self, registration_delay_s: int, timeout_s: float) -> None:
        body = {
            "apiVersion": "karpenter.kwok.sh/v1alpha1",
            "kind": "KWOKNodeClass",
            "metadata": {"name": NODE_CLASS},
            # A VM's boot time, if a caller wants one; 0: nodes register at once.
            "spec": {"nodeRegistrationDelay": f"{registration_delay_s}s"},
        }

        def created() -> bool:
            try:
                _custom(self.api).create_cluster_custom_object(
                    "karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses", body
                )
            except client.ApiException as error:
                if error.status == 409:  # left by an earlier run: the same object
                    return True
                if error.status == 404:  # the API server does not serve the kind yet
                    return False
                raise
            return True

        _wait("the KWOKNodeClass to be created", created, timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise KarpenterError(
                    f"karpenter exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise KarpenterError(
                    f"karpenter not ready after {timeout_s:.0f}s:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def apply_node_pools(self, manifests: Iterable[dict[str, Any]]) -> list[str]:
        custom = _custom(self.api)
        names = []
        for manifest in manifests:
            custom.create_cluster_custom_object(*_NODEPOOLS, manifest)
            names.append(manifest["metadata"]["name"])
        return names

    def node_claims(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = _custom(self.api).list_cluster_custom_object(*_NODECLAIMS)[
            "items"
        ]
        return items

    def stop(self, timeout_s: float = 60.0) -> None:
        """Delete the NodePools made here and let Karpenter remove their nodes, then stop it.

        Karpenter's nodes carry its termination finalizer: stopping it first would leave
        them Terminating in the shared cluster forever. What is still left at the timeout
        (or if Karpenter died) loses its finalizers and goes.
        """
        custom = _custom(self.api)
        try:
            pools = custom.list_cluster_custom_object(
                *_NODEPOOLS, label_selector=f"{OWNER_LABEL}=true"
            )["items"]
        except client.ApiException as error:
            if error.status != 404:  # 404: the CRDs never got installed, nothing to remove
                raise
            pools = []
        names = {p["metadata"]["name"] for p in pools}
        for name in names:
            ignore_404(custom.delete_cluster_custom_object, *_NODEPOOLS, name)
        deadline = time.monotonic() + timeout_s
        alive = self.process is not None and self.process.poll() is None
        while alive and self._owned_nodes(names) and time.monotonic() < deadline:
            time.sleep(0.5)
        self._terminate()
        if names:
            self._force_remove(names)

    def _terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def _owned_nodes(self, pools: set[str]) -> list[str]:
        core: Any = client.CoreV1Api(self.api)
        claims = [
            c["metadata"]["name"]
            for c in self.node_claims()
            if (c["metadata"].get("labels") or {}).get(NODEPOOL_OF_NODE_LABEL) in pools
        ]
        nodes = [
            n.metadata.name
            for n in core.list_node().items
            if (n.metadata.labels or {}).get(NODEPOOL_OF_NODE_LABEL) in pools
        ]
        return claims + nodes

    def _force_remove(self, pools: set[str]) -> None:
        custom = _custom(self.api)
        core: Any = client.CoreV1Api(self.api)
        unfinalize = {"metadata": {"finalizers": None}}
        for claim in self.node_claims():
            if (claim["metadata"].get("labels") or {}).get(NODEPOOL_OF_NODE_LABEL) in pools:
                name = claim["metadata"]["name"]
                ignore_404(custom.patch_cluster_custom_object, *_NODECLAIMS, name, unfinalize)
                ignore_404(custom.delete_cluster_custom_object, *_NODECLAIMS, name)
        for node in core.list_node().items:
            if (node.metadata.labels or {}).get(NODEPOOL_OF_NODE_LABEL) in pools:
                ignore_404(core.patch_node, node.metadata.name, unfinalize)
                ignore_404(core.delete_node, node.metadata.name)

    def log_tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return "(no karpenter log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    wait_until(what, check, timeout_s, KarpenterError)
