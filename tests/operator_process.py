"""The real operator as a subprocess, its CRDs installed, and the manifests' RBAC to run it
under, for the tests and benchmarks that run it against a real API server
(tests/operator/test_operator_cluster.py, the e2e harnesses and profiling test,
benchmarks/operator_scale.py and benchmarks/replan_latency.py).

The operator runs as `python -m sailplan.operator operator run`, the command of its
Deployment, so the tests cover the same entry point, Kopf settings and signal handling as a
cluster does; kill() is SIGKILL, the operator's node crashing without any cleanup.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from waiting import wait_for

from sailplan.operator.api import crd
from sailplan_dev.apply import apply

ROOT = Path(__file__).resolve().parents[1]


class OperatorProcess:
    """One operator serving `namespace` (profiling Jobs there too), its output in `log`."""

    def __init__(self, kubeconfig: str, namespace: str, log: Path, *extra_args: str) -> None:
        self.args = [sys.executable, "-m", "sailplan.operator", "operator", "run"]
        self.args += ["--kubeconfig", kubeconfig, "--namespace", namespace]
        self.args += ["--profile-namespace", namespace]
        # Port 0: several operators (tests in parallel sessions) on one machine never collide.
        self.args += ["--metrics-port", "0", "--health-port", "0", *extra_args]
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Appended: a restarted operator's log follows the killed one's.
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL: no cleanup, like the operator's node crashing."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, as Kubernetes stops a pod, then SIGKILL if it does not exit in time."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 40) -> list[str]:
        if not self.log.exists():
            return []
        return self.log.read_text(errors="replace").splitlines()[-lines:]


def install_crds(api: Any, timeout_s: float = 30) -> None:
    """Apply the CRDs and wait until the API server serves them: creating a custom object
    right after the apply can otherwise fail with 404."""
    apply(api, crd.all_crds())
    ext = client.ApiextensionsV1Api(api)

    def established() -> bool:
        for definition in crd.all_crds():
            status = ext.read_custom_resource_definition(definition["metadata"]["name"]).status
            conditions = (status.conditions if status else None) or ()
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    wait_for("CRDs established", established, timeout_s)


class ClusterRbac:
    """manifests/base/rbac.yaml bound to a ServiceAccount of the test namespace: the
    ClusterRole cluster-wide, the leader-election Role in the test namespace."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = f"sailplan-operator-{namespace}"

    def grant(self) -> str:
        documents = list(yaml.safe_load_all((ROOT / "manifests/base/rbac.yaml").read_text()))
        by_kind = {d["kind"]: d for d in documents}
        role, binding = by_kind["ClusterRole"], by_kind["ClusterRoleBinding"]
        role["metadata"]["name"] = self.name
        binding["metadata"]["name"] = self.name
        binding["roleRef"]["name"] = self.name
        # The leader-election Role keeps its name; kustomize would put it in the operator's
        # namespace, here the test's (it goes with it).
        for namespaced in (by_kind["Role"], by_kind["RoleBinding"]):
            namespaced["metadata"]["namespace"] = self.namespace
        for bound in (binding, by_kind["RoleBinding"]):
            bound["subjects"] = [
                {"kind": "ServiceAccount", "name": "operator", "namespace": self.namespace}
            ]
        core = client.CoreV1Api(self.api)
        core.create_namespaced_service_account(self.namespace, {"metadata": {"name": "operator"}})
        apply(self.api, documents)
        request = core.create_namespaced_service_account_token(
            "operator", self.namespace, {"spec": {"expirationSeconds": 3600}}
        )
        token: str = request.status.token
        return token

    def revoke(self) -> None:
        rbac = client.RbacAuthorizationV1Api(self.api)
        for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
            try:
                delete(self.name)
            except ApiException as error:
                if error.status != 404:
                    raise


def service_account_kubeconfig(admin_kubeconfig: str, token: str, path: Path) -> str:
    """A kubeconfig for the same API server that authenticates as a ServiceAccount token."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster["cluster"]}],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "operator"}}],
                "current-context": "c",
            }
        )
    )
    return str(path)
