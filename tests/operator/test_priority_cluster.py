"""Priorities with the real scheduler: a higher-priority TrainingJob plans on the GPUs a
lower-priority job holds, the scheduler preempts that job's workers for it, and the
preempted job is left without them (it replans onto what remains, here nothing)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from test_autoscaled_pools_cluster import ZONE, grown_pool, release_then_reset, running_on
from test_operator_cluster import get_job, job_body, pods_of
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan_dev.localcluster.nodes import node_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def priority_classes(k8s_api: Any) -> Iterator[tuple[str, str]]:
    scheduling = client.SchedulingV1Api(k8s_api)
    names = (f"low-{uuid.uuid4().hex[:6]}", f"high-{uuid.uuid4().hex[:6]}")
    for name, value in zip(names, (100, 100_000), strict=True):
        scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
    yield names
    for name in names:
        scheduling.delete_priority_class(name)


def with_priority(body: dict[str, Any], priority_class: str) -> dict[str, Any]:
    body["spec"]["podTemplateOverrides"] = {"spec": {"priorityClassName": priority_class}}
    body["spec"]["training"]["steps"] = 1_000_000
    return body


@pytest.mark.usefixtures("operator")
def test_a_higher_priority_job_takes_the_gpus_of_a_lower_one_which_replans(
    k8s_api: Any,
    namespace: str,
    gpupools: Callable[..., str],
    local_cluster: Any,
    priority_classes: tuple[str, str],
) -> None:
    low, high = priority_classes
    node_pool = f"prio-{uuid.uuid4().hex[:6]}"
    local_cluster.add_nodes([node_manifest(grown_pool(node_pool), ZONE, i) for i in range(2)])
    custom = client.CustomObjectsApi(k8s_api)
    try:
        pool = gpupools(node_pool)
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "trainingjobs",
            with_priority(job_body(namespace, "low", [pool]), low),
        )

        low_pods = wait_for(
            "the low-priority job Running", running_on(k8s_api, namespace, "low", pool), 180
        )
        held = {p.spec.node_name for p in low_pods}
        assert len(held) == 2  # it holds both nodes: nothing is free for anyone else

        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "trainingjobs",
            with_priority(job_body(namespace, "high", [pool]), high),
        )
        high_pods = wait_for(
            "the high-priority job Running on the low one's nodes",
            running_on(k8s_api, namespace, "high", pool),
            240,
            lambda: str(
                (get_job(k8s_api, namespace, "high").get("status") or {}).get("conditions")
            ),
        )
        assert {p.spec.node_name for p in high_pods} <= held

        # The scheduler preempted every low-priority worker it needed the GPUs of: none of
        # the first workers runs any more, and the low-priority job holds no GPU.
        first = {p.metadata.uid for p in low_pods}

        def low_holds_nothing() -> bool:
            pods = pods_of(k8s_api, namespace, "low")
            return not any(p.metadata.uid in first or p.status.phase == "Running" for p in pods)

        wait_for(
            "the low-priority job's workers preempted",
            low_holds_nothing,
            120,
            lambda: str(
                [(p.metadata.name, p.status.phase) for p in pods_of(k8s_api, namespace, "low")]
            ),
        )
    finally:
        release_then_reset(k8s_api, namespace, local_cluster)
