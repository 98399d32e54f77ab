"""Build the local control plane's binaries from their Go modules, once, into a cache.

Tier-2 tests, the e2e runner and the README quickstart need a real etcd, kube-apiserver,
kube-scheduler, kube-controller-manager, kubectl and kwok; the Helm chart's tests need
helm; the autoscaling tests need Karpenter with its kwok cloud provider; the admission tests need
Kueue; the trainer's gs:// data tests need fake-gcs-server, a GCS emulator. There is no Docker
engine and no release download here (only PyPI and the Go module proxy are reachable), so the
binaries are compiled from their published Go modules with the local Go toolchain. Called by
`sailplan cluster build`, by `.ci/run` before the tests, and by the pytest cluster fixture
when the binaries are missing.

Layout (root = $SAILPLAN_CACHE, default ~/.cache/sailplan):

    root/go/mod, root/go/build         GOMODCACHE and GOCACHE, so a rebuild or CI reuses them
    root/k8s/<k8s-version>/src/<group>  generated wrapper modules (templates in gomod/)
    root/k8s/<k8s-version>/bin/         the binaries
    root/k8s/<k8s-version>/share/<group>/  module files they need at run time (Karpenter's
                                        and Kueue's CRDs)

The build is idempotent (a group whose binaries exist and report the pinned version is
skipped), resumable (Go's build cache keeps finished packages; binaries are moved into bin/
only once linked) and serialized per group by a file lock (group_lock), so a CLI build and a
test session can race, and a test session can wait for the groups its next test needs while
another build goes on. Two groups build at once (CONCURRENT_GROUPS).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

# Pinned releases. kwok v0.8.0 is built against k8s.io/client-go v0.36 and knows the 1.36
# component flags; etcd 3.6 is the series Kubernetes 1.36 itself depends on.
K8S_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
# Helm renders and installs the chart in manifests/helm/sailplan (tests and the install docs).
HELM_VERSION = "v3.21.4"
# Karpenter with its kwok cloud provider: the node autoscaler of the autoscaling cluster tests
# (localcluster.karpenter). v1.14.1 is the newest release the pinned toolchain can build: its
# go.mod says go 1.26.6, while v1.14.3 says 1.26.10 and v1.15.0 1.26.9, above our go1.26.8,
# and the build never fetches another toolchain (GOTOOLCHAIN=local). Its client-go v0.35 is
# within the supported skew of a 1.36 API server.
KARPENTER_VERSION = "v1.14.1"
# Kueue admits TrainingJobs labelled kueue.x-k8s.io/queue-name (localcluster.kueue and the
# Kueue cluster tests). Its go.mod says go 1.25.0 and it uses client-go v0.34, within the
# supported skew of a 1.36 API server.
KUEUE_VERSION = "v0.14.0"

# fake-gcs-server: a GCS JSON-API emulator, so the trainer's `gs://` data path runs against a
# real HTTP server in tests/trainer/test_trainer_data_gcs.py and benchmarks/trainer_data.py
# (sailplan_dev.gcs_emulator). Its go.mod says go 1.26 and it has no replace directives, so
# `go install` builds it from the proxy: 54 s wall, 86 CPU-s with empty module and build
# caches on the 2-core VM (700 MB of modules).
FAKE_GCS_VERSION = "v1.56.1"

# The ProvisioningRequest CRD (autoscaling.x-k8s.io, the API of GKE's queued provisioning):
# the real definition, from the cluster autoscaler's API module at the version
# sigs.k8s.io/kueue v0.14.0 requires (the autoscaler itself is not served by the proxy).
AUTOSCALER_APIS_MODULE = "k8s.io/autoscaler/cluster-autoscaler/apis"
AUTOSCALER_APIS_VERSION = "v0.0.0-20240830133931-adfbe7e45277"
PROVISIONING_REQUEST_CRD = "config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml"

# Go's build cache makes an interrupted build resume where it stopped; these flags keep the
# binaries small and avoid a C toolchain (static binaries, no cgo).
_BUILD_FLAGS = ("-trimpath",)
_STRIP = "-s -w"


class GoToolchainMissingError(RuntimeError):
    """No `go` on PATH: the binaries cannot be built here."""


class BuildError(RuntimeError):
    """A Go command failed; the message carries the tail of its output."""


@dataclass(frozen=True)
class Binary:
    name: str
    version_args: tuple[str, ...]
    # Substring of the version output that proves the binary is the pinned release.
    expect: str
    # The file name `go install` gives it (its package's last path element), when that is
    # not `name`: Karpenter's kwok provider is package .../kwok, a clash with kwok itself.
    installed_as: str | None = None
    # No --version flag (Karpenter has none): `expect` is looked for in `go version -m`,
    # the module versions the Go linker embeds in every binary.
    from_build_info: bool = False


@dataclass(frozen=True)
class Group:
    """Binaries built by one Go invocation from one module."""

    name: str
    module: str
    version: str
    packages: tuple[str, ...]
    binaries: tuple[Binary, ...]
    template: str | None  # wrapper go.mod template; None means `go install pkg@version`
    ldflags: tuple[str, ...] = ()  # beyond stripping, e.g. the version a binary reports
    # Files of the module (paths relative to its root) copied into share_dir(root, name):
    # what the binaries need at run time and only the module has, e.g. Karpenter's CRDs.
    shared: tuple[str, ...] = ()


_K8S_MINOR = K8S_VERSION.lstrip("v").split(".")[1]
GROUPS: tuple[Group, ...] = (
    # First: one minute to build, and the trainer's gs:// tests wait for it (build(groups=...))
    # while `.ci/run`'s background build goes on to the long ones.
    Group(
        name="fake-gcs-server",
        module="github.com/fsouza/fake-gcs-server",
        version=FAKE_GCS_VERSION,
        packages=("github.com/fsouza/fake-gcs-server",),
        binaries=(
            Binary(
                "fake-gcs-server",
                (),
                f"github.com/fsouza/fake-gcs-server\t{FAKE_GCS_VERSION}",
                from_build_info=True,
            ),
        ),
        template=None,
    ),
    # Second: the longest build, on which the cluster tests wait (CLUSTER_GROUPS).
    Group(
        name="kubernetes",
        module="k8s.io/kubernetes",
        version=K8S_VERSION,
        packages=tuple(
            f"k8s.io/kubernetes/cmd/{cmd}"
            for cmd in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
        ),
        binaries=(
            *(
                Binary(name, ("--version",), f"Kubernetes {K8S_VERSION}")
                for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
            ),
            Binary("kubectl", ("version", "--client"), f"Client Version: {K8S_VERSION}"),
        ),
        template="kubernetes.go.mod.tmpl",
    ),
    Group(
        name="etcd",
        module="go.etcd.io/etcd/server/v3",
        version=ETCD_VERSION,
        packages=("go.etcd.io/etcd/server/v3",),
        binaries=(Binary("etcd", ("--version",), f"etcd Version: {ETCD_VERSION.lstrip('v')}"),),
        template="etcd.go.mod.tmpl",
    ),
    Group(
        name="kwok",
        module="sigs.k8s.io/kwok",
        version=KWOK_VERSION,
        packages=("sigs.k8s.io/kwok/cmd/kwok", "sigs.k8s.io/kwok/cmd/kwokctl"),
        binaries=(
            Binary("kwok", ("--version",), KWOK_VERSION.lstrip("v")),
            Binary("kwokctl", ("--version",), KWOK_VERSION.lstrip("v")),
        ),
        template=None,
    ),
    Group(
        name="helm",
        module="helm.sh/helm/v3",
        version=HELM_VERSION,
        packages=("helm.sh/helm/v3/cmd/helm",),
        binaries=(Binary("helm", ("version",), f'Version:"{HELM_VERSION}"'),),
        template=None,
        # What Helm's Makefile sets: its version, and the Kubernetes version `helm template`
        # and `helm lint` assume without a cluster (that of its client-go, v0.36: 1.36),
        # else 1.20 and a chart's kubeVersion constraint fails.
        ldflags=(
            f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
            *(
                f"-X helm.sh/helm/v3/pkg/{pkg}.k8sVersion{part}={value}"
                for pkg in ("chartutil", "lint/rules")
                for part, value in (("Major", "1"), ("Minor", "36"))
            ),
        ),
    ),
    Group(
        name="karpenter",
        module="sigs.k8s.io/karpenter",
        version=KARPENTER_VERSION,
        packages=("sigs.k8s.io/karpenter/kwok",),
        binaries=(
            Binary(
                "karpenter",
                (),
                f"sigs.k8s.io/karpenter\t{KARPENTER_VERSION}",
                installed_as="kwok",
                from_build_info=True,
            ),
        ),
        template=None,
        # What its Makefile's ko build sets: the version it logs and reports in a metric.
        ldflags=(f"-X sigs.k8s.io/karpenter/pkg/operator.Version={KARPENTER_VERSION}",),
        shared=(
            "kwok/charts/crds/karpenter.sh_nodepools.yaml",
            "kwok/charts/crds/karpenter.sh_nodeclaims.yaml",
            "kwok/charts/crds/karpenter.sh_nodeoverlays.yaml",
            "kwok/charts/crds/autoscaling.x-k8s.io_capacitybuffers.yaml",
            "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
        ),
    ),
    Group(
        name="kueue",
        module="sigs.k8s.io/kueue",
        version=KUEUE_VERSION,
        packages=("sigs.k8s.io/kueue/cmd/kueue",),
        binaries=(
            Binary(
                "kueue",
                (),
                f"sigs.k8s.io/kueue\t{KUEUE_VERSION}",
                from_build_info=True,
            ),
        ),
        template=None,
        # What its Makefile sets: the version it logs at start.
        ldflags=(f"-X sigs.k8s.io/kueue/pkg/version.GitVersion={KUEUE_VERSION}",),
        # Every CRD of the release (its manager watches them all, MultiKueue's too).
        shared=tuple(
            f"config/components/crd/bases/kueue.x-k8s.io_{plural}.yaml"
            for plural in (
                "admissionchecks",
                "clusterqueues",
                "cohorts",
                "localqueues",
                "multikueueclusters",
                "multikueueconfigs",
                "provisioningrequestconfigs",
                "resourceflavors",
                "topologies",
                "workloadpriorityclasses",
                "workloads",
            )
        ),
    ),
)

BINARY_NAMES: tuple[str, ...] = tuple(b.name for g in GROUPS for b in g.binaries)
# What `LocalCluster.up` runs (kwokctl starts them); the rest are tools tests start themselves
# (tests/conftest.py waits for these groups before the first cluster test, for the others
# before a test marked `go_build`).
CLUSTER_GROUPS: tuple[str, ...] = ("kubernetes", "etcd", "kwok")
CONTROL_PLANE_NAMES: tuple[str, ...] = tuple(
    b.name for g in GROUPS if g.name in CLUSTER_GROUPS for b in g.binaries
)


def cache_root() -> Path:
    override = os.environ.get("SAILPLAN_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "sailplan"


def bin_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "k8s" / K8S_VERSION / "bin"


def binary_path(name: str, root: Path | None = None) -> Path:
    return bin_dir(root) / name


def share_dir(group: str, root: Path | None = None) -> Path:
    """Where a group's `shared` module files are copied (same relative paths)."""
    return (root or cache_root()) / "k8s" / K8S_VERSION / "share" / group


def missing_binaries(root: Path | None = None, names: tuple[str, ...] = BINARY_NAMES) -> list[str]:
    """Names of binaries that are not in the cache (cheap: no version check)."""
    return [n for n in names if not os.access(binary_path(n, root), os.X_OK)]


def go_available() -> bool:
    return shutil.which("go") is not None


def go_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GOMODCACHE=str(root / "go" / "mod"),
        GOCACHE=str(root / "go" / "build"),
        # -modcacherw: the module cache stays deletable with rm -rf.
        GOFLAGS="-buildvcs=false -modcacherw",
        CGO_ENABLED="0",
        # Never fetch another toolchain behind the user's back; a too-old Go fails clearly.
        GOTOOLCHAIN="local",
    )
    return env


def local_replaces(gomod: str, version: str) -> list[str]:
    """Replace lines pinning every module the upstream go.mod maps to a local directory.

    Upstream `k8s.io/api => ./staging/src/k8s.io/api` becomes `k8s.io/api => k8s.io/api
    v0.36.3` (staging modules are published as v0.<minor>.<patch>); etcd's `../api` siblings
    keep the etcd version. Targets that are not real modules (etcd's FORBIDDEN_DEPENDENCY
    guards) are dropped.
    """
    lines: list[str] = []
    for module, target in re.findall(
        r"^\s*(?:replace\s+)?(\S+)\s+=>\s+(\.{1,2}/\S+)\s*$", gomod, re.M
    ):
        if "FORBIDDEN" in target:
            continue
        lines.append(f"\t{module} => {module} {version}")
    return sorted(set(lines))


def _staging_version(k8s_version: str) -> str:
    major_minor_patch = k8s_version.lstrip("v").split(".")
    return f"v0.{major_minor_patch[1]}.{major_minor_patch[2]}"


def _go_directive(gomod: str) -> str:
    match = re.search(r"^go\s+(\S+)\s*$", gomod, re.M)
    if match is None:
        raise BuildError("upstream go.mod has no go directive")
    return match.group(1)


def render_wrapper(group: Group, upstream_gomod: str) -> str:
    assert group.template is not None
    template = resources.files(__package__).joinpath("gomod", group.template).read_text()
    replace_version = (
        _staging_version(group.version) if group.module == "k8s.io/kubernetes" else group.version
    )
    return Template(template).substitute(
        GO_DIRECTIVE=_go_directive(upstream_gomod),
        VERSION=group.version,
        TOOLS="\n".join(f"\t{p}" for p in group.packages),
        REPLACES="\n".join(local_replaces(upstream_gomod, replace_version)),
    )


def _k8s_ldflags(build_date: str) -> str:
    # What hack/lib/version.sh injects: without it the binaries report v0.0.0 and the API
    # server's compatibility-version checks and kwokctl's version detection misbehave.
    values = {
        "gitVersion": K8S_VERSION,
        "gitMajor": "1",
        "gitMinor": _K8S_MINOR,
        "gitTreeState": "clean",
        "buildDate": build_date,
    }
    flags = [
        f"-X {pkg}.{key}={value}"
        for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version")
        for key, value in values.items()
    ]
    return " ".join([_STRIP, *flags])


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        command = args[args.index("go") :] if "go" in args else args
        raise BuildError(f"`{' '.join(command[:3])} ...` failed in {cwd}:\n{tail}")
    return proc.stdout


def _module_info(module: str, version: str, cwd: Path, env: dict[str, str]) -> dict[str, str]:
    out = _run(["go", "mod", "download", "-json", f"{module}@{version}"], cwd, env)
    info: dict[str, str] = json.loads(out)
    return info


def module_file(module: str, version: str, relative: str, root: Path | None = None) -> Path:
    """A file of a Go module at a pinned version, from the build's module cache (fetched
    through the module proxy the first time)."""
    root = root or cache_root()
    if not go_available():
        raise GoToolchainMissingError(f"`go` is needed to fetch {module}@{version}")
    with tempfile.TemporaryDirectory() as tmp:
        info = _module_info(module, version, Path(tmp), go_env(root))
    return Path(info["Dir"]) / relative


def provisioning_request_crd(root: Path | None = None) -> Path:
    return module_file(
        AUTOSCALER_APIS_MODULE, AUTOSCALER_APIS_VERSION, PROVISIONING_REQUEST_CRD, root
    )


def verify(binary: Binary, root: Path) -> bool:
    path = binary_path(binary.name, root)
    if not os.access(path, os.X_OK):
        return False
    args = ["go", "version", "-m", str(path)] if binary.from_build_info else [str(path)]
    try:
        proc = subprocess.run(
            [*args, *binary.version_args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return binary.expect in proc.stdout + proc.stderr


def group_lock(group: str, root: Path | None = None) -> Path:
    """The file lock that serializes builds of one group across processes and threads."""
    return (root or cache_root()) / "k8s" / K8S_VERSION / f"build-{group}.lock"


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock on `path` (created), released on exit or process death."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# Niceness of the go commands of Helm, Karpenter and Kueue, which only the tests that run last
# wait for: on a machine without the binaries the cluster tests wait for Kubernetes, the
# longest group, so the groups built beside it yield to it. The same niceness as the tests
# that need no cluster (tests/conftest.py), which they share the CPU with once Kubernetes is
# built: at 10 they starved and the last cluster tests waited for them. On an idle machine
# they run at full speed all the same. fake-gcs-server (one minute, the trainer's gs://
# tests wait for it) and the control plane keep the default.
LATE_GROUP_NICENESS = 5


def _build_group(group: Group, root: Path, env: dict[str, str], jobs: int) -> None:
    eager = group.name in CLUSTER_GROUPS or group.name == "fake-gcs-server"
    go = ["go"] if eager else ["nice", "-n", str(LATE_GROUP_NICENESS), "go"]
    out_dir = bin_dir(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{group.name}-") as tmp:
        staging = Path(tmp)
        if group.template is None:
            _run(
                [
                    *go,
                    "install",
                    *_BUILD_FLAGS,
                    f"-p={jobs}",
                    f"-ldflags={' '.join((_STRIP, *group.ldflags))}",
                    *(f"{p}@{group.version}" for p in group.packages),
                ],
                staging,
                {**env, "GOBIN": str(staging)},
            )
            if group.shared:
                info = _module_info(group.module, group.version, staging, env)
                _copy_shared(group, Path(info["Dir"]), root)
        else:
            src = root / "k8s" / K8S_VERSION / "src" / group.name
            src.mkdir(parents=True, exist_ok=True)
            info = _module_info(group.module, group.version, src, env)
            wrapper = render_wrapper(group, Path(info["GoMod"]).read_text())
            gomod = src / "go.mod"
            if not gomod.exists() or gomod.read_text() != wrapper:
                gomod.write_text(wrapper)
                (src / "go.sum").unlink(missing_ok=True)
            _run([*go, "mod", "tidy"], src, env)
            if group.module == "k8s.io/kubernetes":
                ldflags = _k8s_ldflags(info.get("Time", "1970-01-01T00:00:00Z")[:19] + "Z")
            else:
                ldflags = _STRIP
            # One package: -o names the file (etcd's package path ends in "v3"); several:
            # -o is a directory and each binary takes its command's name.
            target = staging / group.binaries[0].name if len(group.packages) == 1 else staging
            _run(
                [
                    *go,
                    "build",
                    *_BUILD_FLAGS,
                    f"-p={jobs}",
                    f"-ldflags={ldflags}",
                    "-o",
                    f"{target}{os.sep if target == staging else ''}",
                    *group.packages,
                ],
                src,
                env,
            )
        for binary in group.binaries:
            os.replace(staging / (binary.installed_as or binary.name), out_dir / binary.name)


def _copy_shared(group: Group, module_dir: Path, root: Path) -> None:
    target = share_dir(group.name, root)
    for relative in group.shared:
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(module_dir / relative, target / relative)


def _up_to_date(group: Group, root: Path) -> bool:
    shared = share_dir(group.name, root)
    return all(verify(b, root) for b in group.binaries) and all(
        (shared / f).is_file() for f in group.shared
    )


def default_jobs() -> int:
    """Parallel compile jobs (go build -p): the CPUs this process may run on, which is a
    CI runner's 2 where os.cpu_count() would report the whole host's count."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        available = os.cpu_count() or 1
    return max(1, available)


@dataclass(frozen=True)
class GroupResult:
    group: str
    built: bool
    seconds: float


# Groups built at once. One group's build alternates between module downloads, compiling
# (`-p jobs` packages in parallel) and serial steps (`go mod tidy`, the link of one large
# binary), so alone it keeps about 1.2 of 2 cores busy; two at once fill the gaps.
CONCURRENT_GROUPS = 2


def build(
    root: Path | None = None,
    log: Callable[[str], None] = print,
    jobs: int | None = None,
    groups: tuple[str, ...] | None = None,
) -> list[GroupResult]:
    """Build every missing or wrong-version binary (of `groups` only, when given, by name),
    CONCURRENT_GROUPS groups at a time, taken in GROUPS order; returns what was done and how
    long, in GROUPS order."""
    if not go_available():
        raise GoToolchainMissingError("the Go toolchain (`go`) is not on PATH")
    unknown = sorted(set(groups or ()) - {g.name for g in GROUPS})
    if unknown:
        raise ValueError(f"no build group {', '.join(unknown)}")
    root = root or cache_root()
    env = go_env(root)
    jobs = jobs or default_jobs()
    selected = [g for g in GROUPS if groups is None or g.name in groups]

    def build_one(group: Group) -> GroupResult:
        start = time.monotonic()
        # One lock per group: a build of other groups (a test waiting for the control plane
        # while `.ci/run`'s build goes on to Kueue) does not wait for this one.
        with file_lock(group_lock(group.name, root)):
            if _up_to_date(group, root):
                log(f"{group.name} {group.version}: up to date")
                return GroupResult(group.name, False, time.monotonic() - start)
            names = ", ".join(b.name for b in group.binaries)
            log(f"{group.name} {group.version}: building {names}")
            _build_group(group, root, env, jobs)
            bad = [b.name for b in group.binaries if not verify(b, root)]
        if bad:
            raise BuildError(f"built {', '.join(bad)} but --version does not say {group.version}")
        seconds = time.monotonic() - start
        log(f"{group.name} {group.version}: built in {seconds:.0f}s")
        return GroupResult(group.name, True, seconds)

    # The Go module and build caches are safe for concurrent go commands (they lock).
    with ThreadPoolExecutor(CONCURRENT_GROUPS, thread_name_prefix="go-build") as pool:
        futures = [pool.submit(build_one, group) for group in selected]
        try:
            return [future.result() for future in futures]
        except BaseException:
            # The first failure in GROUPS order stops the groups not yet started; the
            # pool's exit waits for the one still building.
            pool.shutdown(wait=False, cancel_futures=True)
            raise
