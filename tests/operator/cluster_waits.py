"""Waits and fixtures the priority and Kueue cluster tests share (test_priority_cluster.py,
test_kueue_cluster.py): a job's workers running on a pool, its Admitted condition, the two
PriorityClasses, and Kueue's queues created for one test and removed after it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client
from kueue_builders import admitted
from test_autoscaled_pools_cluster import running_on
from test_operator_cluster import get_job
from waiting import wait_for

RUNNING_TIMEOUT_S = 180  # a plan, its pods created, bound and Running on kwok nodes
ADMITTED_TIMEOUT_S = 30


def wait_running(
    k8s_api: Any,
    namespace: str,
    job: str,
    gpupool: str,
    explain: Callable[[], str] | None = None,
    *,
    what: str = "",
    timeout_s: float = RUNNING_TIMEOUT_S,
) -> list[Any]:
    """The job's worker pods, once every one of them runs on `gpupool`."""
    pods: list[Any] = wait_for(
        what or f"{job}'s workers Running",
        running_on(k8s_api, namespace, job, gpupool),
        timeout_s,
        explain or (lambda: str(get_job(k8s_api, namespace, job).get("status") or {})),
    )
    return pods


def wait_admitted(
    k8s_api: Any, namespace: str, name: str, explain: Callable[[], str]
) -> tuple[str, str, str]:
    """The job's Admitted=True condition (written in the pass that creates the workers,
    after them: a worker may be Running a moment before it)."""

    def check() -> tuple[str, str, str] | None:
        found = admitted(get_job(k8s_api, namespace, name).get("status") or {})
        return found if found and found[0] == "True" else None

    found: tuple[str, str, str] = wait_for(f"{name} Admitted", check, ADMITTED_TIMEOUT_S, explain)
    return found


@pytest.fixture
def priority_classes(k8s_api: Any) -> Iterator[tuple[str, str]]:
    """Two PriorityClasses, (low 100, high 100000), removed after the test."""
    scheduling = client.SchedulingV1Api(k8s_api)
    names = (f"low-{uuid.uuid4().hex[:6]}", f"high-{uuid.uuid4().hex[:6]}")
    for name, value in zip(names, (100, 100_000), strict=True):
        scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
    yield names
    for name in names:
        scheduling.delete_priority_class(name)


@contextmanager
def kueue_queues(
    k8s_api: Any, objects: Sequence[tuple[tuple[str, ...], dict[str, Any]]]
) -> Iterator[Callable[[], None]]:
    """A function that creates Kueue's objects (kueue_builders.queue_objects), called when
    the test wants them; whatever it created is deleted again after the block."""
    custom = client.CustomObjectsApi(k8s_api)
    created: list[tuple[tuple[str, ...], str]] = []

    def define() -> None:
        for path, body in objects:
            if len(path) == 4:
                custom.create_namespaced_custom_object(*path, body)
            else:
                custom.create_cluster_custom_object(*path, body)
            created.append((path, body["metadata"]["name"]))

    try:
        yield define
    finally:
        for path, name in reversed(created):
            try:
                if len(path) == 4:
                    custom.delete_namespaced_custom_object(*path, name)
                else:
                    custom.delete_cluster_custom_object(*path, name)
            except client.ApiException as error:
                if error.status != 404:
                    raise
