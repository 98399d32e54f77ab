"""The pod runner as the kubelet of the end-to-end tests: its setup, its nodes, and reading what
the trainer processes it runs wrote.

Shared by the e2e fixtures (conftest.py: `runner`), test_podrunner_trainer.py
(operator-rendered pods without the operator), the replanning harness (replan_harness.py) and
benchmarks/replan_latency.py, so that all of them run trainer pods the same way and a
timed-out wait shows the same thing: every worker's log tail. The model is the trainer tests'
tiny GPT (tests/trainer/trainer_harness.py), the one whose single-process losses are the
replanning tests' reference.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException
from trainer_harness import TINY

from sailplan_dev.localcluster.nodes import NodePool
from sailplan_dev.localcluster.podrunner import PodRunner, runner_node_manifest
from sailplan_dev.localcluster.podrunner_image import read_image

__all__ = [
    "TINY",
    "TRAINER_IMAGE",
    "add_runner_node",
    "events_of",
    "log_of",
    "pod_runner",
    "worker_log_tails",
]

# Every trainer process's defaults (the image's ENV): fail within a minute instead of the
# trainer's 10-minute collective timeout when the wiring is wrong, and one thread per
# process, since several trainers share the test machine's few cores.
TRAINER_ENV = {"SAILPLAN_COLLECTIVE_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1"}
# The image reference of the tests' TrainingJobs; the runner knows its user and directories
# from its Dockerfile, so worker pods meet the permissions the real image gives them.
TRAINER_IMAGE = "sailplan-trainer:local"
TRAINER_DOCKERFILE = Path(__file__).resolve().parents[2] / "trainer_image" / "Dockerfile"


@contextmanager
def pod_runner(api: Any, workdir: Path, **options: Any) -> Iterator[PodRunner]:
    """A PodRunner (`options` as its constructor takes them; env defaults to TRAINER_ENV,
    images to the trainer image) whose nodes are deleted from the API server when it closes,
    so the session's shared cluster keeps no node a later test's scheduler could bind to."""
    defaults = {"env": TRAINER_ENV, "images": {TRAINER_IMAGE: read_image(TRAINER_DOCKERFILE)}}
    running = PodRunner(api, workdir, **(defaults | options))
    try:
        yield running
    finally:
        left = running.nodes()
        running.close(grace_s=2.0)
        for name in left:
            try:
                running.core.delete_node(name)
            except ApiException as error:
                if error.status != 404:  # a test or the node controller got there first
                    raise


def add_runner_node(
    runner: PodRunner,
    node_pool: str,
    accelerator: str,
    zone: str,
    *,
    gpus: int = 1,
    machine_type: str = "a2-highgpu-1g",
    index: int = 0,
) -> str:
    """A GKE-labelled node of `node_pool` in `zone` whose pods the runner runs; its name."""
    pool = NodePool(
        name=node_pool,
        accelerator=accelerator,
        gpus_per_node=gpus,
        machine_type=machine_type,
        zones={zone: 1},
    )
    return runner.add_node(runner_node_manifest(pool, zone, index))


def log_of(runner: PodRunner, namespace: str, pod: str) -> Path | None:
    """The pod's container log, or None while the runner has not started it."""
    try:
        return runner.log_path(namespace, pod)
    except KeyError:
        return None


def events_of(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a trainer's stdout (its step, checkpoint and stop events)."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue  # the line being written right now
    return found


def worker_log_tails(runner: PodRunner, namespace: str, lines: int = 25) -> list[str]:
    """The last lines of every pod's log in `namespace`, each under a header with its phase:
    what a timed-out wait prints, since the cause is almost always in a trainer's output."""
    parts: list[str] = []
    for pod in runner.core.list_namespaced_pod(namespace).items:
        log = log_of(runner, namespace, pod.metadata.name)
        if log is not None and log.exists():
            parts.append(f"log of pod {pod.metadata.name} ({pod.status.phase}):")
            parts.extend(log.read_text(errors="replace").splitlines()[-lines:])
    return parts
