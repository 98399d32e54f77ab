"""Kueue as the local cluster's admission controller: the process.

A TrainingJob labelled kueue.x-k8s.io/queue-name waits for Kueue to admit the Workload the
operator creates for its plan (sailplan.operator.reconcile.kueue). The Kueue cluster tests
(tests/operator/test_kueue_cluster.py) run the real Kueue, built by `build` from its Go
module, against the local cluster: its CRDs from the module, its manager outside the
cluster with the local kubeconfig.

What a Deployment would give Kueue and the local cluster has not: the namespace
kueue-system; the webhook configurations and the Secret its certificate manager fills
(it generates the certificate into the Secret and patches the CA into the
configurations; they stay empty of webhooks: nothing calls them, so Kueue's defaulting and
validation webhooks do not run here); the Secret mounted as files, which the kubelet would
do and `_CertificateCopier` does. The VisibilityOnDemand feature is off: it serves an
aggregated API, which would need an APIService pointing at a Service in the cluster.
`stop` removes the CRDs again (and with them every Kueue object), so tests that follow see
a cluster without Kueue.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from kubernetes import client

from sailplan_dev.apply import apply, load_documents

from . import build
from .waiting import ignore_404, wait_until

NAMESPACE: Final = "kueue-system"
CERT_SECRET: Final = "kueue-webhook-server-cert"
WEBHOOK_SERVICE: Final = "kueue-webhook-service"
MUTATING: Final = "kueue-mutating-webhook-configuration"
VALIDATING: Final = "kueue-validating-webhook-configuration"
CERT_FILES: Final = ("tls.crt", "tls.key", "ca.crt")


class KueueError(RuntimeError):
    """Kueue could not be started, or did not become ready."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def config_document(health_port: int, webhook_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta1) for one manager outside the
    cluster: no leader election, its own certificates, nothing but loopback ports."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},  # "0": no metrics server
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": CERT_SECRET,
        },
        "integrations": {"frameworks": ["batch/job"]},
    }


@dataclass
class Kueue:
    """One Kueue manager against a cluster, its log in `workdir/kueue.log`."""

    kubeconfig: Path
    api: Any  # kubernetes.client.ApiClient of the same cluster
    workdir: Path
    root: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    health_port: int = field(default=0, init=False)
    _copier: _CertificateCopier | None = field(default=None, init=False)
    _crds: list[dict[str, Any]] = field(default_factory=list, init=False)

    @property
    def log(self) -> Path:
        return self.workdir / "kueue.log"

    def start(self, timeout_s: float = 90.0) -> None:
        """Install the CRDs and what the manager expects to find, start it and wait until
        it reports ready (certificates in place, caches synced)."""
        binary = build.binary_path("kueue", self.root)
        if not os.access(binary, os.X_OK):
            raise KueueError("kueue is not built: run `sailplan cluster build`")
        self._install_crds(timeout_s)
        self._install_stand_ins()
        self.workdir.mkdir(parents=True, exist_ok=True)
        cert_dir = self.workdir / "certs"
        cert_dir.mkdir(exist_ok=True)
        self.health_port = _free_port()
        config_file = self.workdir / "config.yaml"
        config_file.write_text(
            yaml.safe_dump(config_document(self.health_port, _free_port(), cert_dir))
        )
        self._copier = _CertificateCopier(client.CoreV1Api(self.api), cert_dir)
        self._copier.start()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        args = [
            str(binary),
            f"--config={config_file}",
            "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=2",
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(timeout_s)
        except KueueError:
            self.stop()
            raise

    def _install_crds(self, timeout_s: float) -> None:
        documents = load_documents(build.share_dir("kueue", self.root).rglob("*.yaml"))
        apply(self.api, documents)
        self._crds = documents
        ext = client.ApiextensionsV1Api(self.api)

        def established() -> bool:
            for name in self._crd_names():
                status = ext.read_custom_resource_definition(name).status
                conditions = (status.conditions if status else None) or ()
                if not any(c.type == "Established" and c.status == "True" for c in conditions):
                    return False
            return True

        _wait("Kueue's CRDs to be established", established, timeout_s)

    def _install_stand_ins(self) -> None:
        core = client.CoreV1Api(self.api)
        admission = client.AdmissionregistrationV1Api(self.api)
        _ignore_409(core.create_namespace, {"metadata": {"name": NAMESPACE}})
        _ignore_409(
            core.create_namespaced_secret,
            NAMESPACE,
            {"metadata": {"name": CERT_SECRET}, "type": "Opaque"},
        )
        _ignore_409(
            admission.create_mutating_webhook_configuration, {"metadata": {"name": MUTATING}}
        )
        _ignore_409(
            admission.create_validating_webhook_configuration, {"metadata": {"name": VALIDATING}}
        )

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise KueueError(f"kueue exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise KueueError(f"kueue not ready after {timeout_s:.0f}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the manager, then delete Kueue's CRDs (every Kueue object goes with them)
        and wait until the API server no longer serves them."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self._copier is not None:
            self._copier.stop()
        # Kueue's finalizers on its objects would hold the CRDs' deletion forever now that
        # the manager that removes them is gone.
        self._strip_finalizers()
        ext: Any = client.ApiextensionsV1Api(self.api)
        for name in self._crd_names():
            ignore_404(ext.delete_custom_resource_definition, name)

        def gone() -> bool:
            names = {c.metadata.name for c in ext.list_custom_resource_definition().items}
            return not names.intersection(self._crd_names())

        _wait("Kueue's CRDs to be removed", gone, timeout_s)

    def _crd_names(self) -> list[str]:
        return [str(d["metadata"]["name"]) for d in self._crds]

    def _strip_finalizers(self) -> None:
        custom: Any = client.CustomObjectsApi(self.api)
        unfinalize = {"metadata": {"finalizers": None}}
        for crd in self._crds:
            spec = crd["spec"]
            group, plural = spec["group"], spec["names"]["plural"]
            version = next(v["name"] for v in spec["versions"] if v.get("storage"))
            try:
                items = custom.list_cluster_custom_object(group, version, plural)["items"]
            except client.ApiException as error:
                if error.status == 404:
                    continue
                raise
            for item in items:
                metadata = item["metadata"]
                if not metadata.get("finalizers"):
                    continue
                if "namespace" in metadata:
                    ignore_404(
                        custom.patch_namespaced_custom_object,
                        group,
                        version,
                        metadata["namespace"],
                        plural,
                        metadata["name"],
                        unfinalize,
                    )
                else:
                    ignore_404(
                        custom.patch_cluster_custom_object,
                        group,
                        version,
                        plural,
                        metadata["name"],
                        unfinalize,
                    )

    def log_tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return "(no kueue log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class _CertificateCopier:
    """The kubelet's part: the webhook Secret's keys as files in the manager's certDir,
    rewritten when the Secret changes (Kueue fills it after it starts)."""

    def __init__(self, core: Any, cert_dir: Path) -> None:
        self._core = core
        self._dir = cert_dir
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kueue-certs", daemon=True)
        self._seen: dict[str, str] = {}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                secret = self._core.read_namespaced_secret(CERT_SECRET, NAMESPACE)
            except client.ApiException:
                continue
            data = secret.data or {}
            if not all(key in data for key in CERT_FILES) or data == self._seen:
                continue
            for key in CERT_FILES:
                target = self._dir / key
                partial = target.with_suffix(".tmp")
                partial.write_bytes(base64.b64decode(data[key]))
                partial.replace(target)
            self._seen = dict(data)


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    wait_until(what, check, timeout_s, KueueError)


def _ignore_409(call: Callable[..., Any], *args: Any) -> None:
    try:
        call(*args)
    except client.ApiException as error:
        if error.status != 409:
            raise
