"""Priorities with the real scheduler: a higher-priority TrainingJob plans on the GPUs a
lower-priority job holds, the scheduler preempts that job's workers for it, and the
preempted job is left without them (it replans onto what remains, here nothing); and when
capacity frees up for two waiting jobs, the higher-priority one plans first, though the
other is older and first by name."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from cluster_waits import priority_classes, wait_running  # noqa: F401 (a fixture)
from kubernetes import client
from test_autoscaled_pools_cluster import ZONE, grown_pool, pool_status, release_then_reset
from test_operator_cluster import get_job, job_body, pods_of
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan_dev.localcluster.nodes import node_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


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
    priority_classes: tuple[str, str],  # noqa: F811 (the fixture imported above)
) -> None:
    low, high = priority_classes
    node_pool = f"prio-{uuid.uuid4().hex[:6]}"
    local_cluster.add_nodes([node_manifest(grown_pool(node_pool), ZONE, i) for i in range(2)])
    custom = client.CustomObjectsApi(k8s_api)
    try:
        pool = gpupools(node_pool)
        # The operator plans on the nodes it has seen: on a loaded machine a job created at
        # once planned on one node's GPUs and held only that node.
        wait_for(
            "the operator to count both nodes' GPUs in the GPUPool",
            lambda: pool_status(k8s_api, pool).get("gpusAllocatable") == 8,
            90,
        )
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "trainingjobs",
            with_priority(job_body(namespace, "low", [pool]), low),
        )

        low_pods = wait_running(k8s_api, namespace, "low", pool)
        held = {p.spec.node_name for p in low_pods}
        assert len(held) == 2  # it holds both nodes: nothing is free for anyone else

        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "trainingjobs",
            with_priority(job_body(namespace, "high", [pool]), high),
        )
        high_pods = wait_running(
            k8s_api,
            namespace,
            "high",
            pool,
            what="the high-priority job Running on the low one's nodes",
            timeout_s=240,
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


@pytest.mark.usefixtures("operator")
def test_when_capacity_comes_the_higher_priority_waiting_job_plans_first(
    k8s_api: Any,
    namespace: str,
    gpupools: Callable[..., str],
    local_cluster: Any,
    priority_classes: tuple[str, str],  # noqa: F811 (the fixture imported above)
) -> None:
    low, high = priority_classes
    node_pool = f"order-{uuid.uuid4().hex[:6]}"
    pool = gpupools(node_pool, gpuType="A100-40")  # no node yet: both jobs wait
    custom = client.CustomObjectsApi(k8s_api)

    def unschedulable(job: str) -> bool:
        return (get_job(k8s_api, namespace, job).get("status") or {}).get(
            "phase"
        ) == "Unschedulable"

    # The low-priority job is the older one and first by name: only priority puts the
    # other first.
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "trainingjobs",
        with_priority(job_body(namespace, "a-low", [pool]), low),
    )
    wait_for("the low-priority job waiting", lambda: unschedulable("a-low"), 120)
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "trainingjobs",
        with_priority(job_body(namespace, "b-high", [pool]), high),
    )
    wait_for("the high-priority job waiting", lambda: unschedulable("b-high"), 120)
    try:
        # One node of 4 A100s: room for one job's plan.
        local_cluster.add_nodes([node_manifest(grown_pool(node_pool), ZONE, 0)])
        wait_for(
            "the high-priority job's workers created",
            lambda: pods_of(k8s_api, namespace, "b-high") or None,
            180,
            lambda: str((get_job(k8s_api, namespace, "a-low").get("status") or {}).get("phase")),
        )
        # The other job never planned onto that node: no plan, no workers, and it waits
        # again for capacity with a reason.
        status = get_job(k8s_api, namespace, "a-low").get("status") or {}
        assert "plan" not in status, status.get("plan")
        assert not pods_of(k8s_api, namespace, "a-low")
        wait_for("the low-priority job waiting again", lambda: unschedulable("a-low"), 120)
        assert "plan" not in (get_job(k8s_api, namespace, "a-low").get("status") or {})
    finally:
        release_then_reset(k8s_api, namespace, local_cluster)
