"""The pod runner enforces a pod's securityContext on its real processes, as a kubelet does.

Pods created directly on the real API server, bound to a node the runner plays (the e2e
`runner` fixture knows the trainer image from its Dockerfile). Each pod's shell reports what
the kernel let it do: which uid, gid and groups it runs as (`id`), whether a write into the
image's directories or a volume succeeded, and with what owner. Expected values are the
ones written into the pod specs here and the trainer image's (USER 10001 owning
/checkpoints and /home/sailplan). The uid changes need a runner running as root (as in CI);
elsewhere these tests are skipped.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from kubernetes import client
from runner_harness import TRAINER_IMAGE, add_runner_node, log_of
from waiting import wait_for

from sailplan_dev.localcluster.nodes import NODEPOOL_LABEL
from sailplan_dev.localcluster.podrunner import PodRunner

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(os.geteuid() != 0, reason="only a root runner can run pods as a uid"),
]

ZONE = "us-central1-a"


@pytest.fixture
def node_pool(runner: PodRunner) -> str:
    pool = f"sec-{uuid.uuid4().hex[:8]}"
    add_runner_node(runner, pool, "nvidia-tesla-a100", ZONE)
    return pool


def _pod(
    name: str,
    node_pool: str,
    script: str,
    *,
    pod_context: dict[str, Any] | None = None,
    container_context: dict[str, Any] | None = None,
    image: str = TRAINER_IMAGE,
    volumes: tuple[tuple[str, str, dict[str, Any]], ...] = (),
) -> dict[str, Any]:
    """A pod running `sh -c script` on the node pool; volumes: (name, mountPath, source)."""
    expression = {"key": NODEPOOL_LABEL, "operator": "In", "values": [node_pool]}
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [expression]}]
                    }
                }
            },
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "securityContext": pod_context or {},
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["sh", "-c", script],
                    "securityContext": container_context or {},
                    "volumeMounts": [{"name": n, "mountPath": path} for n, path, _ in volumes],
                }
            ],
            "volumes": [{"name": n, **source} for n, _, source in volumes],
        },
    }


def _run(core: Any, runner: PodRunner, namespace: str, manifest: dict[str, Any]) -> list[str]:
    """Create the pod, wait for it to end, return its log lines (the phase must be
    Succeeded: every script here ends with `true`, so only a refused start fails it)."""
    name = manifest["metadata"]["name"]
    wait_for(
        f"the default ServiceAccount of {namespace}",
        lambda: bool(core.list_namespaced_service_account(namespace).items),
        30.0,
    )
    core.create_namespaced_pod(namespace, manifest)

    def ended() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod = wait_for(f"pod {name} to end", ended, 60.0)
    log = log_of(runner, namespace, name)
    assert log is not None
    lines: list[str] = log.read_text().splitlines()
    assert pod.status.phase == "Succeeded", lines
    return lines


def test_container_runs_as_its_uid_gid_and_groups_and_owns_what_it_writes(
    runner: PodRunner, node_pool: str, namespace: str, k8s_api: Any
) -> None:
    core: Any = client.CoreV1Api(k8s_api)
    script = (
        "id -u; id -g; id -G; touch /data/made && stat -c 'file %u %g' /data/made; "
        "stat -c 'dir %a %u %g' /data; true"
    )
    lines = _run(
        core,
        runner,
        namespace,
        _pod(
            "ids",
            node_pool,
            script,
            pod_context={"runAsUser": 4242, "runAsGroup": 4343, "fsGroup": 4444},
            container_context={"runAsUser": 4200},  # the container's wins
            volumes=(("data", "/data", {"emptyDir": {}}),),
        ),
    )
    assert lines[0:2] == ["4200", "4343"]
    assert set(lines[2].split()) == {"4343", "4444"}
    # emptyDir: 0777, group fsGroup with setgid, so what the container writes is fsGroup's.
    assert "file 4200 4444" in lines
    assert "dir 2777 0 4444" in lines


def test_read_only_root_filesystem_denies_writes_outside_volumes(
    runner: PodRunner, node_pool: str, namespace: str, k8s_api: Any
) -> None:
    core: Any = client.CoreV1Api(k8s_api)
    script = (
        "id -u; "
        "touch /home/sailplan/f 2>&1 || echo home-denied; "
        "touch /checkpoints/f 2>&1 || echo checkpoints-denied; "
        "touch /tmp/f && echo tmp-written; "
        # HOME is the image's (read-only) home, TMPDIR the container's /tmp: the volume.
        'touch "$HOME/f" 2>/dev/null || echo home-env-denied; '
        'touch "$TMPDIR/g" && test -e /tmp/g && echo tmpdir-is-tmp; true'
    )
    lines = _run(
        core,
        runner,
        namespace,
        _pod(
            "readonly",
            node_pool,
            script,
            # The image's USER (10001) owns both directories: only read-only-ness stops it.
            container_context={"readOnlyRootFilesystem": True},
            volumes=(("tmp", "/tmp", {"emptyDir": {}}),),
        ),
    )
    assert lines[0] == "10001"
    assert "home-denied" in lines and "checkpoints-denied" in lines, lines
    assert any("Permission denied" in line for line in lines), lines
    assert "tmp-written" in lines
    assert "home-env-denied" in lines and "tmpdir-is-tmp" in lines, lines


def test_a_uid_that_does_not_own_the_image_directory_cannot_write_it(
    runner: PodRunner, node_pool: str, namespace: str, k8s_api: Any
) -> None:
    core: Any = client.CoreV1Api(k8s_api)
    script = "id -u; touch /checkpoints/f 2>&1 || echo checkpoints-denied; true"
    lines = _run(
        core,
        runner,
        namespace,
        _pod("other-uid", node_pool, script, pod_context={"runAsUser": 1000}),
    )
    assert lines[0] == "1000"
    assert "checkpoints-denied" in lines, lines
    assert any("Permission denied" in line for line in lines), lines


@pytest.mark.parametrize(
    "case",
    [
        (
            {"runAsNonRoot": True, "runAsUser": 0},
            TRAINER_IMAGE,
            "container's runAsUser breaks non-root policy",
        ),
        (
            {"runAsNonRoot": True},
            "sailplan/unknown:1",
            "cannot verify user is non-root",
        ),
    ],
)
def test_run_as_non_root_keeps_the_container_waiting_with_the_kubelets_reason(
    runner: PodRunner,
    node_pool: str,
    namespace: str,
    k8s_api: Any,
    case: tuple[dict[str, Any], str, str],
) -> None:
    pod_context, image, message = case
    core: Any = client.CoreV1Api(k8s_api)
    wait_for(
        f"the default ServiceAccount of {namespace}",
        lambda: bool(core.list_namespaced_service_account(namespace).items),
        30.0,
    )
    manifest = _pod("root", node_pool, "echo started", pod_context=pod_context, image=image)
    core.create_namespaced_pod(namespace, manifest)

    def statuses() -> Any:
        return core.read_namespaced_pod("root", namespace).status.container_statuses

    def refused() -> Any:
        state = (statuses() or [None])[0]
        waiting = state and state.state.waiting
        return waiting if waiting and waiting.reason == "CreateContainerConfigError" else None

    state = wait_for("a refused container", refused, 30.0, lambda: str(statuses()))
    assert message in state.message
    assert f'(pod: "root_{namespace}(' in state.message
    assert core.read_namespaced_pod("root", namespace).status.phase == "Pending"
    assert log_of(runner, namespace, "root") is None  # never started
