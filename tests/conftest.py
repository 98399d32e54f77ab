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
first). The control plane's groups are waited for before the first cluster test's timeout
starts, so pytest-timeout does not cut a first 15-minute build short and a cold machine
spends the build time testing; a test marked `go_build("helm")` (Helm, Karpenter, Kueue)
waits for its group the same way, and such cluster tests run last.

Under pytest-xdist (`-n auto`, the README's test command; `--dist loadgroup` is in addopts)
all cluster tests form one group that one worker runs in order, against the one cluster of
that worker's process, and builds the binaries before, while the other workers run the rest.
"""

from __future__ import annotations

import functools
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


# tryfirst: pytest-xdist's own hook turns the xdist_group marks into node ids, after this one.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test that uses a cluster fixture needs the cluster even if its author forgot the
    # marker: mark it, so `-m "not cluster"` deselects it and the build hook sees it.
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
    # Tests without a cluster first (a stable sort keeps each group's order): on a machine
    # without the binaries they run while the build does. Of the cluster tests, those that
    # need a Go build group beyond the control plane (`go_build`) last, so the others start
    # once the control plane is built.
    items.sort(
        key=lambda item: (
            item.get_closest_marker("cluster") is not None,
            item.get_closest_marker("go_build") is not None,
        )
    )
    # An xdist worker sees `loadgroup` (it resets `dist` to "no" for itself).
    if config.getoption("loadgroup", False):
        _group_for_xdist(items)
        items.sort(key=_xdist_group_rank)


def _xdist_group_rank(item: pytest.Item) -> int:
    """The order in which pytest-xdist hands out the groups (`--no-loadscope-reorder` in
    addopts keeps the collection's): the cluster tests first, as one worker runs them all
    beside the others; then the trainer's modules, whose tests each train in several
    processes for up to minutes; then the rest, many short modules, which both workers
    share at the end once the cluster tests are done. xdist's own order (by the number of
    tests in a group) left a long trainer module for last, run by one worker while the other
    had nothing left (7 of the 41 minutes on a machine without the Go binaries)."""
    if item.get_closest_marker("cluster") is not None:
        return 0
    if item.get_closest_marker("trainer") is not None:
        return 1
    return 2


def _group_for_xdist(items: list[pytest.Item]) -> None:
    """Under `pytest -n N` (pytest-xdist, `--dist loadgroup`): every cluster test in one
    group, every other test with its module.

    The cluster tests mostly wait on the API server, the operator and kwok's simulated
    kubelets, and they share one session cluster, so one worker runs them all, in order, while
    the others run the CPU-bound tests beside it; their group is handed out first
    (_xdist_group_rank), so that worker starts on them at once. A module stays on one worker
    so its module-scoped fixtures (searched plans, trained checkpoints) are built once.
    """
    for item in items:
        if item.get_closest_marker("cluster") is not None:
            group = "cluster"
        else:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


class _BackgroundBuild:
    """The local cluster's Go build, run beside the tests that need no cluster.

    The cluster tests wait for the control plane's groups only (build.CLUSTER_GROUPS); a test
    marked `go_build("karpenter")` waits for that group too (wait_for). Those tests run after
    the other cluster tests (pytest_collection_modifyitems), so on a machine without the
    binaries the cluster tests start while Helm, Karpenter and Kueue still build.
    """

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._thread: threading.Thread | None = None
        self._active = False  # this session builds what is missing
        self._first_cluster_test_seen = False
        self._build_at_first_cluster_test = False

    def _build(self, groups: tuple[str, ...] | None = None) -> None:
        from sailplan_dev.localcluster import build

        try:
            build.build(log=self.messages.append, groups=groups)
        except build.BuildError as error:
            # The tests that need it then error or skip saying what is missing; the cause
            # is printed in the summary.
            self.messages.append(f"build failed: {error}")

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._build, name="local-cluster-build", daemon=True)
        self._thread.start()

    def start(self) -> None:
        self._active = True
        self._start_thread()

    def defer(self) -> None:
        """Build before the first cluster test instead (an xdist worker: the other workers
        run the tests that need no cluster meanwhile, and only the worker that gets the
        cluster group builds the control plane)."""
        self._active = True
        self._build_at_first_cluster_test = True

    def wait(self) -> list[str]:
        """Before the first cluster test: wait for the control plane's groups; lines that
        say how long testing overlapped the build (none after the first call)."""
        if self._first_cluster_test_seen or not self._active:
            return []
        from sailplan_dev.localcluster import build

        self._first_cluster_test_seen = True
        testing = time.monotonic() - _SESSION_START
        start = time.monotonic()
        # Each group's file lock: this waits for a build of these groups already running
        # (`.ci/run`'s, or this process's thread) or builds them.
        self._build(build.CLUSTER_GROUPS)
        waited = time.monotonic() - start
        if self._build_at_first_cluster_test:
            # The rest beside the cluster tests that need none of it.
            self._start_thread()
        return [
            *(f"[local cluster] {message}" for message in self.messages),
            f"[local cluster] first cluster test after {testing:.0f} s of tests without one "
            f"in this process and {waited:.0f} s waiting for the control plane's build",
        ]

    def wait_for(self, groups: tuple[str, ...]) -> None:
        """Before a test marked `go_build`: wait for (or build) its groups."""
        if self._active:
            self._build(groups)


_SESSION_START = time.monotonic()
_BUILD = _BackgroundBuild()


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


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
    if _xdist_worker(session.config):
        _BUILD.defer()
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            "[local cluster] binaries missing: building them from Go modules while the tests "
            "that need no cluster run (first time only, long)"
        )
    _BUILD.start()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """pytest-xdist, on the controller: refuse to run ungrouped tests.

    A worker carries a test's group in its node id ("...::test@cluster"). Where it cannot
    (pytest-xdist#1386: pytest 9.2 ignores the change), the cluster tests would be spread over
    the workers, each starting its own cluster on two cores: stop before that, saying why.
    """
    if node.config.getvalue("dist") != "loadgroup":
        return
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid.rsplit("]", 1)[-1]]
    if ungrouped:
        pytest.exit(
            f"pytest-xdist did not group {ungrouped[0]} into its xdist_group "
            "(pytest-xdist#1386, pytest 9.2): install the test extra's pins "
            "(pip install -e './dev[test]'), or run without -n",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


class _ClusterTestSpan:
    """When this process ran its cluster tests: on a machine without the binaries the run's
    critical path is the build and then these tests, so CI's log says where they fell."""

    def __init__(self) -> None:
        self.count = 0
        self.first_start = 0.0
        self.last_end = 0.0

    def record(self, start: float, end: float) -> None:
        if self.count == 0:
            self.first_start = start - _SESSION_START
        self.count += 1
        self.last_end = end - _SESSION_START

    def lines(self) -> list[str]:
        if self.count == 0:
            return []
        return [
            f"[local cluster] {self.count} cluster tests ran from {self.first_start:.0f} s to "
            f"{self.last_end:.0f} s after this process started"
        ]


_CLUSTER_TESTS = _ClusterTestSpan()


@functools.cache
def _cpu_adam_built() -> None:
    """Before a test marked `cpu_adam`, outside its timeout: DeepSpeed compiles its CPU Adam
    extension on first use into ~/.cache/torch_extensions (94 CPU s on the development VM;
    8 minutes beside a cold machine's Go build, at this worker's niceness) and loads it from
    there afterwards; a file lock makes another worker wait for the same build. The trainer
    ranks the test starts then load it in a second."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(4))])


# Summary lines: this process's, then (on an xdist controller) each worker's.
_SUMMARY: list[str] = []


# Niceness of an xdist worker's tests that need no cluster, above the cluster tests' 0.
TESTS_WITHOUT_CLUSTER_NICENESS = 5


def _lower_priority() -> None:
    """In an xdist worker, before a test that needs no cluster.

    The run's critical path is the local cluster's build (on a machine without the binaries)
    and then the cluster tests, which one worker runs in order and which time out if their
    API server, operator and kwok starve; the CPU-bound tests beside them only have to end
    by then. Processes started afterwards (trainer ranks, the forkserver) inherit it. The
    cluster worker lowers itself only once its cluster tests are done, as they come first.
    """
    if os.getpriority(os.PRIO_PROCESS, 0) < TESTS_WITHOUT_CLUSTER_NICENESS:
        os.setpriority(os.PRIO_PROCESS, 0, TESTS_WITHOUT_CLUSTER_NICENESS)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    # Outermost wrapper, so the waits come before pytest-timeout's timer starts.
    needs = item.get_closest_marker("go_build")
    if needs is not None:
        _BUILD.wait_for(tuple(needs.args))
    if item.get_closest_marker("cluster") is None:
        if _xdist_worker(item.config):
            _lower_priority()
        if item.get_closest_marker("cpu_adam") is not None:
            _cpu_adam_built()
        return (yield)
    _SUMMARY.extend(_BUILD.wait())
    start = time.monotonic()
    try:
        return (yield)
    finally:
        _CLUSTER_TESTS.record(start, time.monotonic())


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _xdist_worker(session.config):
        # A worker's terminal is not shown: the controller prints these at its end.
        session.config.workeroutput["local_cluster"] = [  # type: ignore[attr-defined]
            *_SUMMARY,
            *_CLUSTER_TESTS.lines(),
        ]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist, on the controller: keep what a worker said about the build and its
    cluster tests for the summary."""
    lines = getattr(node, "workeroutput", {}).get("local_cluster", [])
    _SUMMARY.extend(f"{line} ({node.gateway.id})" for line in lines)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in [*_SUMMARY, *_CLUSTER_TESTS.lines()]:
        terminalreporter.write_line(line)


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
