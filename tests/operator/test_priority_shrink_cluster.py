"""Priorities when capacity shrinks, with the real scheduler: two jobs of different
priority each lose their node at once and one node is left; the higher-priority job
replans onto it first, and the lower-priority one, which waited for it, finds nothing left
and waits for capacity without ever switching to a plan of its own on that node (whose
workers the scheduler would then have preempted for the other job)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from test_autoscaled_pools_cluster import ZONE, grown_pool, release_then_reset, running_on
from test_operator_cluster import get_job, job_body, pods_of
from test_priority_cluster import priority_classes, with_priority  # noqa: F401 (a fixture)
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan_dev.localcluster.nodes import node_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.usefixtures("operator")
def test_when_capacity_shrinks_the_higher_priority_job_replans_first(
    k8s_api: Any,
    namespace: str,
    gpupools: Callable[..., str],
    local_cluster: Any,
    priority_classes: tuple[str, str],  # noqa: F811 (the fixture imported above)
) -> None:
    low, high = priority_classes
    node_pool = f"shrink-{uuid.uuid4().hex[:6]}"
    nodes = local_cluster.add_nodes(
        [node_manifest(grown_pool(node_pool), ZONE, i) for i in range(3)]
    )
    custom = client.CustomObjectsApi(k8s_api)

    def one_node_job(name: str, priority_class: str) -> dict[str, Any]:
        body = with_priority(job_body(namespace, name, [pool]), priority_class)
        # At most 4 A100s (3.67 USD per GPU-hour each), and workers small enough that four
        # fit a node's 8 CPUs and 32 GiB: one node's worth per job.
        body["spec"]["objective"] = {"maxUsdPerHour": 15.0}
        body["spec"]["trainer"] |= {"cpu": "1", "memory": "4Gi"}
        return body

    try:
        pool = gpupools(node_pool)
        # The low-priority job is the older one and first by name: only priority puts the
        # other first.
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", one_node_job("a-low", low)
        )
        wait_for("the low-priority job Running", running_on(k8s_api, namespace, "a-low", pool), 180)
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", one_node_job("b-high", high)
        )
        high_pods = wait_for(
            "the high-priority job Running",
            running_on(k8s_api, namespace, "b-high", pool),
            180,
        )
        low_generation = get_job(k8s_api, namespace, "a-low")["status"]["plan"]["generation"]

        # A fresh node joins, and every node the jobs started on is preempted at once: one
        # node of 4 GPUs is left, room for one job's plan.
        (spare,) = local_cluster.add_nodes([node_manifest(grown_pool(node_pool), ZONE, 3)])
        for node in sorted(nodes):
            local_cluster.preempt_node(node)

        def high_on_spare() -> list[Any] | None:
            # every worker of its current plan: the operator creates them one by one, and
            # the first can run on the spare node before the others exist
            pods = running_on(k8s_api, namespace, "b-high", pool)()
            if not pods or {p.spec.node_name for p in pods} != {spare}:
                return None
            plan = (get_job(k8s_api, namespace, "b-high").get("status") or {}).get("plan") or {}
            return pods if len(pods) == plan.get("workers") else None

        replaced = wait_for(
            "the high-priority job Running again on the node left",
            high_on_spare,
            240,
            lambda: str(
                (get_job(k8s_api, namespace, "b-high").get("status") or {}).get("conditions")
            ),
        )
        assert not {p.metadata.uid for p in replaced} & {p.metadata.uid for p in high_pods}
        # The low-priority job waited for it, then found nothing left: it waits with a
        # reason, holds nothing on that node and never switched to a plan of its own there
        # (each pass reads every live worker, so the other job's workers hold the node from
        # the moment they bind, before the GPUPool status counts them).
        wait_for(
            "the low-priority job waiting for capacity",
            lambda: (
                (get_job(k8s_api, namespace, "a-low").get("status") or {}).get("phase")
                == "Unschedulable"
            ),
            120,
        )
        status = get_job(k8s_api, namespace, "a-low")["status"]
        assert status["plan"]["generation"] == low_generation, status.get("history")
        assert not [p for p in pods_of(k8s_api, namespace, "a-low") if p.spec.node_name == spare]
        # ... and the high-priority job keeps the node, with the same workers.
        still = running_on(k8s_api, namespace, "b-high", pool)()
        assert still and {p.metadata.uid for p in still} == {p.metadata.uid for p in replaced}
    finally:
        release_then_reset(k8s_api, namespace, local_cluster)
