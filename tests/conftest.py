"""Session-wide Kubernetes fixtures for the tests that need a real API server.

Backends (`--cluster=`):
  local     (default) a loopback control plane built from Go modules, with GKE-like kwok
            nodes (sailplan_dev.localcluster). One cluster per pytest process, named
            after its pid so concurrent sessions do not share or delete each other's cluster;
            torn down at the end. With SAILPLAN_TEST_KUBECONFIG set, that running cluster is
            reused instead and left running (fast edit-test loop: `sailplan cluster up`, then
            `export SAILPLAN_TEST_KUBECONFIG=...`).
  kind      a kind cluster through pytest-kind; skipped when no Docker daemon answers.
  existing  the current kubeconfig ($KUBECONFIG or ~/.kube/config), untouched.

Fixtures: `kubeconfig` (path str), `k8s_api` (kubernetes.client.ApiClient), `namespace` (a
fresh namespace per test, deleted after it), `local_cluster` (the LocalCluster, for adding,
deleting, cordoning nodes; skipped on backends that cannot). Tests that change nodes must put
them back (`local_cluster.reset_nodes()`), the cluster is shared by the session. For the
operator's tests: `crds` (installed once per session) and `gpupools` (a factory of GPUPools
with unique names, deleted after the test).

The binaries are built, when missing, after collection and only if a collected test is marked
`cluster`: in a background thread while the tests that need no cluster run (they are ordered
first), and waited for before the first cluster test's timeout starts, so pytest-timeout does
not cut a first 20-minute build short and a cold machine spends the build time testing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_process import install_crds

from sailplan.operator.api.common import GROUP, VERSION

BACKENDS = ("local", "kind", "existing")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cluster",
        choices=BACKENDS,
        default=os.environ.get("SAILPLAN_TEST_CLUSTER", "local"),
        help="Kubernetes backend for tests marked `cluster` (default: local)",
    )


CLUSTER_FIXTURES = frozenset({"kubeconfig", "k8s_api", "namespace", "local_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that uses a cluster fixture needs the cluster even if its author forgot the
    # marker: mark it, so `-m "not cluster"` deselects it and the build hook sees it.
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
    # Tests without a cluster first (a stable sort keeps each group's order): on a machine
    # without the binaries they run while the build does.
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)


class _BackgroundBuild:
    """The local cluster's Go build, run beside the tests that need no cluster."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._thread: threading.Thread | None = None
        self._session_start = time.monotonic()
        self._first_cluster_test_seen = False

    def start(self) -> None:
        from sailplan_dev.localcluster import build

        def run() -> None:
            try:
                build.build(log=self.messages.append)
            except build.BuildError as error:
                # The cluster tests then error with "binaries not built"; the cause is printed.
                self.messages.append(f"build failed: {error}")

        self._thread = threading.Thread(target=run, name="local-cluster-build", daemon=True)
        self._thread.start()

    def wait(self, reporter: Any) -> None:
        """Before the first cluster test: wait for the build, say how long testing overlapped it."""
        if self._first_cluster_test_seen:
            return
        self._first_cluster_test_seen = True
        testing = time.monotonic() - self._session_start
        waited = 0.0
        if self._thread is not None:
            start = time.monotonic()
            self._thread.join()
            self._thread = None
            waited = time.monotonic() - start
        if reporter is not None:
            reporter.write_line("")
            for message in self.messages:
                reporter.write_line(f"[local cluster] {message}")
            reporter.write_line(
                f"[local cluster] first cluster test after {testing:.0f} s of tests without one "
                f"and {waited:.0f} s waiting for the build"
            )


_BUILD = _BackgroundBuild()


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.getoption("--cluster") != "local" or os.environ.get(
        "SAILPLAN_TEST_KUBECONFIG"
    ):
        return
    if not any(item.get_closest_marker("cluster") for item in session.items):
        return
    from sailplan_dev.localcluster import build

    if not build.missing_binaries() or not build.go_available():
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            "[local cluster] binaries missing: building them from Go modules while the tests "
            "that need no cluster run (first time only, long)"
        )
    _BUILD.start()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    # Outermost wrapper, so the wait comes before pytest-timeout's timer starts.
    if item.get_closest_marker("cluster") is not None:
        _BUILD.wait(item.config.pluginmanager.get_plugin("terminalreporter"))
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # Kept on the item so a fixture's teardown can tell that its test failed and print what
    # explains it (the operator's log), which a CI report otherwise lacks.
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@dataclass
class _Backend:
    kubeconfig: Path
    local: Any  # LocalCluster | None
    why_no_local: str


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_stale_test_clusters() -> None:
    """Remove clusters left by killed pytest sessions (named pytest-PID[-...])."""
    from sailplan_dev.localcluster import kwokctl

    for name in kwokctl.list_clusters():
        match = re.match(r"pytest-(\d+)(-|$)", name)
        if match and not _pid_alive(int(match.group(1))):
            kwokctl.delete(name)


def _local_backend() -> Iterator[_Backend]:
    from sailplan_dev.localcluster import build
    from sailplan_dev.localcluster.cluster import LocalCluster

    reuse = os.environ.get("SAILPLAN_TEST_KUBECONFIG")
    if reuse:
        yield _Backend(Path(reuse), LocalCluster.attach(Path(reuse)), "")
        return
    if build.missing_binaries() and not build.go_available():
        pytest.skip(
            "local cluster: the Go toolchain is not installed, so etcd/kube-apiserver/kwok "
            "cannot be built (install Go >= 1.26, or use --cluster=kind|existing)"
        )
    _delete_stale_test_clusters()
    cluster = LocalCluster.up(name=f"pytest-{os.getpid()}")
    try:
        yield _Backend(cluster.kubeconfig, cluster, "")
    finally:
        cluster.down()


def _kind_backend() -> Iterator[_Backend]:
    docker = shutil.which("docker")
    if (
        docker is None
        or subprocess.run([docker, "info"], capture_output=True, check=False).returncode
    ):
        pytest.skip("kind backend: no Docker daemon answers `docker info` on this machine")
    try:
        from pytest_kind import KindCluster  # type: ignore[import-not-found]
    except ImportError:
        pytest.skip("kind backend: pytest-kind is not installed (pip install pytest-kind)")
    kind = KindCluster(f"sailplan-{os.getpid()}")
    kind.create()
    try:
        yield _Backend(Path(kind.kubeconfig_path), None, "kind nodes are real kubelets")
    finally:
        kind.delete()


def _existing_backend() -> Iterator[_Backend]:
    path = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0])
    path = path.expanduser()
    if not path.exists():
        pytest.skip(f"existing backend: no kubeconfig at {path}")
    yield _Backend(path, None, "an existing cluster's nodes are not ours to change")


@pytest.fixture(scope="session")
def _cluster_backend(request: pytest.FixtureRequest) -> Iterator[_Backend]:
    backend = request.config.getoption("--cluster")
    factory = {"local": _local_backend, "kind": _kind_backend, "existing": _existing_backend}
    yield from factory[backend]()


@pytest.fixture(scope="session")
def kubeconfig(_cluster_backend: _Backend) -> str:
    return str(_cluster_backend.kubeconfig)


@pytest.fixture(scope="session")
def k8s_api(kubeconfig: str) -> Iterator[Any]:
    from sailplan_dev.localcluster.kubeconfig import api_client

    api = api_client(Path(kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def local_cluster(_cluster_backend: _Backend) -> Any:
    if _cluster_backend.local is None:
        pytest.skip(f"needs the local cluster backend: {_cluster_backend.why_no_local}")
    return _cluster_backend.local


def _test_namespace(k8s_api: Any) -> Iterator[str]:
    """A fresh namespace labelled as a test's, deleted after it."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(k8s_api)
    core.create_namespace({"metadata": {"name": name, "labels": {"sailplan.dev/test": "true"}}})
    try:
        yield name
    finally:
        # Not waited for: the namespace controller finishes the deletion in the background.
        core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def namespace(k8s_api: Any) -> Iterator[str]:
    yield from _test_namespace(k8s_api)


@pytest.fixture
def other_namespace(k8s_api: Any) -> Iterator[str]:
    """A second namespace, for tests of what crosses namespaces."""
    yield from _test_namespace(k8s_api)


# -- objects of the operator's tests -------------------------------------------------------
@pytest.fixture(scope="session")
def crds(k8s_api: Any) -> None:
    """The CRDs generated from the pydantic models, installed and established."""
    install_crds(k8s_api)


@pytest.fixture
def gpupools(k8s_api: Any, crds: None) -> Iterator[Callable[..., str]]:
    """Create GPUPools with unique names (cluster-scoped: shared by the session), deleted
    after the test."""
    custom = client.CustomObjectsApi(k8s_api)
    created: list[str] = []

    def make(node_pool: str, **spec: Any) -> str:
        name = f"{node_pool}-{uuid.uuid4().hex[:6]}"
        custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "gpupools",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "GPUPool",
                "metadata": {"name": name},
                "spec": {"nodePool": node_pool, **spec},
            },
        )
        created.append(name)
        return name

    yield make
    for name in created:
        custom.delete_cluster_custom_object(GROUP, VERSION, "gpupools", name)
