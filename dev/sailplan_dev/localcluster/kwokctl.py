"""Start and stop the control-plane processes through kwokctl's binary runtime.

kwokctl already does the fiddly parts of running a control plane from plain binaries: a CA
and client certificates, free loopback ports for every component (so several clusters
coexist), component flags matched to the binaries' versions, detached processes with pid
files, and a kubeconfig. This module only points it at the binaries from `build` and at a
work directory under the sailplan cache (so a user's ~/.kwok is left alone), and adds the
one setting sailplan needs: kwok manages only the nodes labelled by `nodes.MANAGER_LABEL`.
Called by LocalCluster; nothing else should run kwokctl.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from . import build
from .nodes import MANAGER_KWOK, MANAGER_LABEL


class KwokctlError(RuntimeError):
    """kwokctl failed; the message carries the tail of its output."""


def workdir(root: Path | None = None) -> Path:
    return (root or build.cache_root()) / "kwok"


def cluster_dir(name: str, root: Path | None = None) -> Path:
    return workdir(root) / "clusters" / name


def kubeconfig_path(name: str, root: Path | None = None) -> Path:
    # kwokctl writes the host-side kubeconfig of a cluster here (runtime.InHostKubeconfigName).
    return cluster_dir(name, root) / "kubeconfig.yaml"


def exists(name: str, root: Path | None = None) -> bool:
    return (cluster_dir(name, root) / "kwok.yaml").exists()


def list_clusters(root: Path | None = None) -> list[str]:
    clusters = workdir(root) / "clusters"
    if not clusters.is_dir():
        return []
    return sorted(p.name for p in clusters.iterdir() if (p / "kwok.yaml").exists())


def configuration(root: Path | None = None) -> str:
    """The KwokctlConfiguration document given to `kwokctl create cluster --config`."""
    binary = {name: str(build.binary_path(name, root)) for name in build.BINARY_NAMES}
    config = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "etcdBinary": binary["etcd"],
            "kubeApiserverBinary": binary["kube-apiserver"],
            "kubeControllerManagerBinary": binary["kube-controller-manager"],
            "kubeSchedulerBinary": binary["kube-scheduler"],
            "kubectlBinary": binary["kubectl"],
            "kwokControllerBinary": binary["kwok"],
            "kubeVersion": build.K8S_VERSION,
            "bindAddress": "127.0.0.1",
            "quietPull": True,
            # Hundreds of nodes in the scale benchmark: client-side throttling would measure
            # kwok's rate limiter, not the operator.
            "disableQPSLimits": True,
            # Upstream heartbeat timings: 40 s node leases, node-monitor period 5 s and grace
            # 50 s (kwokctl multiplies all of them by a default factor of 5 to save CPU on
            # huge fake clusters): a node whose heartbeat stops turns NotReady as on GKE.
            "heartbeatFactor": 1.0,
            "nodeLeaseDurationSeconds": 40,
            "kubeControllerManagerNodeMonitorPeriodMilliseconds": 5000,
            "kubeControllerManagerNodeMonitorGracePeriodMilliseconds": 50000,
        },
        "componentsPatches": [
            {
                # kwokctl starts kwok with --manage-all-nodes=true; a label selector instead
                # lets the e2e runner take nodes over by relabelling them.
                "name": "kwok-controller",
                "extraArgs": [
                    {"key": "manage-all-nodes", "value": "false", "override": True},
                    {
                        "key": "manage-nodes-with-label-selector",
                        "value": f"{MANAGER_LABEL}={MANAGER_KWOK}",
                        "override": False,
                    },
                ],
            }
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def _env(root: Path | None) -> dict[str, str]:
    return {**os.environ, "KWOK_WORKDIR": str(workdir(root))}


def run(args: list[str], root: Path | None = None, timeout: float = 300) -> str:
    kwokctl = build.binary_path("kwokctl", root)
    try:
        proc = subprocess.run(
            [str(kwokctl), *args],
            env=_env(root),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise KwokctlError(f"kwokctl {' '.join(args)} timed out after {timeout:.0f}s") from error
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise KwokctlError(f"kwokctl {' '.join(args)} failed:\n{tail}")
    return proc.stdout


def create(name: str, root: Path | None = None, wait_s: int = 180) -> Path:
    """Create and start the cluster; returns its kubeconfig path."""
    workdir(root).mkdir(parents=True, exist_ok=True)
    config = workdir(root) / f"{name}.kwokctl.yaml"
    config.write_text(configuration(root))
    run(
        [
            "create",
            "cluster",
            f"--name={name}",
            f"--config={config}",
            f"--wait={wait_s}s",
            # Our own kubeconfig stays untouched; users opt in with `sailplan cluster env`.
            "--kubeconfig=",
        ],
        root,
        timeout=wait_s + 120,
    )
    return kubeconfig_path(name, root)


def restart(name: str, root: Path | None = None, wait_s: int = 60) -> None:
    """Restart the processes of an existing cluster (after a reboot, or some were killed).

    `kwokctl start` on a half-running cluster waits forever for the dead components, so
    stop whatever still runs first; etcd's data survives, so objects are kept.
    """
    run(["stop", "cluster", f"--name={name}"], root, timeout=60)
    run(["start", "cluster", f"--name={name}", f"--wait={wait_s}s"], root, timeout=wait_s + 30)


def delete(name: str, root: Path | None = None) -> None:
    # --force: also when a component is already dead. kwokctl also removes the cluster's
    # context from a kubeconfig (default ~/.kube/config, which `create` never touched): point
    # it at the cluster's own file, deleted with the cluster anyway.
    run(
        [
            "delete",
            "cluster",
            f"--name={name}",
            "--force",
            f"--kubeconfig={kubeconfig_path(name, root)}",
        ],
        root,
        timeout=120,
    )


def components(name: str, root: Path | None = None) -> str:
    """kwokctl's table of the cluster's components and their state."""
    return run(["get", "components", f"--name={name}"], root, timeout=30)
