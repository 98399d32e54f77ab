"""Autoscaled GPUPools with the real operator against a real API server: a job on a pool at
zero nodes plans on capacity the pool may add and creates its pods pinned to pool and zone
(which is what makes an autoscaler add nodes); nodes appearing make them Running; two jobs
submitted together on a pool that fits only one never both get pods for the same GPUs, and
the second plans once the first is gone (nothing stays reserved).

Nodes are added by hand, as the cluster autoscaler would add them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from operator_process import OperatorProcess
from test_operator_cluster import get_job, job_body, job_events, pods_of, wait_phase
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan_dev.localcluster.nodes import NodePool, node_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ZONE = "us-central1-a"


def grown_pool(name: str) -> NodePool:
    """The GKE node pool the autoscaler would grow: a2-highgpu-4g nodes (4 A100s)."""
    return NodePool(
        name=name,
        accelerator="nvidia-tesla-a100",
        gpus_per_node=4,
        machine_type="a2-highgpu-4g",
        zones={ZONE: 0},
    )


def autoscaling(max_nodes: int) -> dict[str, Any]:
    return {
        "autoscaling": {
            "zones": [ZONE],
            "machineType": "a2-highgpu-4g",
            "maxNodesPerZone": max_nodes,
            "provisioningSeconds": 120,
        }
    }


def pool_status(k8s_api: Any, pool: str) -> dict[str, Any]:
    status: dict[str, Any] = (
        client.CustomObjectsApi(k8s_api)
        .get_cluster_custom_object(GROUP, VERSION, "gpupools", pool)
        .get("status")
        or {}
    )
    return status


def submit(k8s_api: Any, namespace: str, name: str, pool: str) -> None:
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", job_body(namespace, name, [pool])
    )


def zone_of(pod: Any) -> str:
    terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    (term,) = terms.node_selector_terms
    (zone,) = [e.values for e in term.match_expressions if e.key == "topology.kubernetes.io/zone"]
    assert len(zone) == 1
    return str(zone[0])


def pod_gpus(pods: list[Any]) -> int:
    return sum(int(p.spec.containers[0].resources.limits["nvidia.com/gpu"]) for p in pods)


def running_on(
    k8s_api: Any, namespace: str, job: str, gpupool: str
) -> Callable[[], list[Any] | None]:
    """A wait_for check: the job's workers, once every one runs on `gpupool`."""

    def check() -> list[Any] | None:
        pods = pods_of(k8s_api, namespace, job)
        ok = pods and all(
            p.status.phase == "Running" and p.metadata.labels.get("sailplan.dev/gpupool") == gpupool
            for p in pods
        )
        return pods if ok else None

    return check


def scale_up_backed_off(k8s_api: Any, pool: str) -> dict[str, Any] | None:
    """The pool's status once its condition ScaleUpAvailable is False."""
    status = pool_status(k8s_api, pool)
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    return status if conditions.get("ScaleUpAvailable", {}).get("status") == "False" else None


def capacity_requests_of(k8s_api: Any, namespace: str, job: str) -> list[dict[str, Any]]:
    """The ProvisioningRequests the operator made for `job`."""
    items: list[dict[str, Any]] = client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(
        "autoscaling.x-k8s.io",
        "v1",
        namespace,
        "provisioningrequests",
        label_selector=f"sailplan.dev/job={job},sailplan.dev/role=capacity",
    )["items"]
    return items


def set_request_condition(
    k8s_api: Any, namespace: str, name: str, kind: str, *, reason: str, message: str
) -> None:
    """The autoscaler's part: one True condition on the request's status."""
    condition = {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    client.CustomObjectsApi(k8s_api).patch_namespaced_custom_object_status(
        "autoscaling.x-k8s.io",
        "v1",
        namespace,
        "provisioningrequests",
        name,
        {"status": {"conditions": [condition]}},
    )


def release_then_reset(k8s_api: Any, namespace: str, local_cluster: Any) -> None:
    """Delete the test's jobs and wait for their pods to go while their nodes still exist
    (a pod on a node deleted first waits for the pod garbage collector), then put the
    cluster's nodes back."""
    custom = client.CustomObjectsApi(k8s_api)
    for job in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs")[
        "items"
    ]:
        custom.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", job["metadata"]["name"]
        )
    core = client.CoreV1Api(k8s_api)
    wait_for(
        "the test's pods gone",
        lambda: not core.list_namespaced_pod(namespace, label_selector="sailplan.dev/job").items,
        90,
    )
    local_cluster.reset_nodes()


def test_a_job_on_a_pool_at_zero_nodes_plans_and_runs_once_nodes_come(
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
    local_cluster: Any,
) -> None:
    node_pool = f"grow-{uuid.uuid4().hex[:6]}"
    pool = gpupools(node_pool, **autoscaling(2))
    status = wait_for(
        "pool status with possible capacity",
        lambda: pool_status(k8s_api, pool) if pool_status(k8s_api, pool).get("zones") else None,
        90,
    )
    assert (status["gpuType"], status["nodesTotal"], status["gpusPossible"]) == ("A100-40", 0, 8)

    submit(k8s_api, namespace, "grow", pool)
    pods = wait_for(
        "worker pods created",
        lambda: pods_of(k8s_api, namespace, "grow") or None,
        180,
    )
    try:
        assert all(p.spec.node_name is None and p.status.phase == "Pending" for p in pods)
        assert {zone_of(p) for p in pods} == {ZONE}
        assert 0 < pod_gpus(pods) <= 8
        # The workers of now: the job's first plan may be an interim one that the search's
        # answer replaces (a new generation, other workers) while this test looks.
        wait_for(
            "every worker's GPUs reserved in the pool status",
            lambda: (
                pool_status(k8s_api, pool).get("gpusReserved")
                == pod_gpus(pods_of(k8s_api, namespace, "grow"))
            ),
            60,
            lambda: str(pool_status(k8s_api, pool)),
        )

        # The autoscaler's part: add the pool's nodes in the pods' zone.
        pool_shape = grown_pool(node_pool)
        nodes_needed = -(-pod_gpus(pods_of(k8s_api, namespace, "grow")) // 4)
        local_cluster.add_nodes([node_manifest(pool_shape, ZONE, i) for i in range(nodes_needed)])

        def running() -> list[Any] | None:
            current = pods_of(k8s_api, namespace, "grow")
            ok = current and all(p.status.phase == "Running" for p in current)
            return current if ok else None

        bound = wait_for("worker pods Running on the new nodes", running, 180)
        # The same workers, unless the job switched plans meanwhile (an interim first plan
        # replaced by its search's answer): either way pinned to the pool's zone.
        assert {zone_of(p) for p in bound} == {ZONE}
        assert {p.spec.node_name for p in bound} <= set(
            local_cluster.node_names(f"cloud.google.com/gke-nodepool={node_pool}")
        )
        wait_phase(k8s_api, namespace, "grow", {"Running"}, 60)
        wait_for(
            "reservation released once bound",
            lambda: pool_status(k8s_api, pool).get("gpusReserved", 0) == 0,
            60,
        )
    finally:
        local_cluster.reset_nodes()


def test_two_jobs_submitted_together_never_book_the_same_gpus(
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
) -> None:
    # One possible node of 4 GPUs: room for one job's plan, not two.
    pool = gpupools(f"one-{uuid.uuid4().hex[:6]}", **autoscaling(1))
    wait_for("pool status", lambda: pool_status(k8s_api, pool).get("gpusPossible") == 4, 90)
    submit(k8s_api, namespace, "first", pool)
    submit(k8s_api, namespace, "second", pool)

    def one_planned() -> tuple[str, str] | None:
        with_pods = [j for j in ("first", "second") if pods_of(k8s_api, namespace, j)]
        if len(with_pods) != 1:
            return None
        (winner,) = with_pods
        loser = "second" if winner == "first" else "first"
        phase = (get_job(k8s_api, namespace, loser).get("status") or {}).get("phase")
        return (winner, loser) if phase == "Unschedulable" else None

    winner, loser = wait_for("one job planned, the other waiting", one_planned, 180)
    assert pod_gpus(pods_of(k8s_api, namespace, winner)) <= 4
    # The loser keeps waiting with a reason, without pods, while the winner holds the node.
    conditions = get_job(k8s_api, namespace, loser)["status"]["conditions"]
    reasons = {c["reason"] for c in conditions if c["status"] == "True"}
    assert "NoCapacity" in reasons, conditions
    assert not pods_of(k8s_api, namespace, loser)

    # The winner goes away: its reservation goes with it and the other job plans.
    client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", winner
    )
    pods = wait_for(
        "the waiting job gets pods",
        lambda: pods_of(k8s_api, namespace, loser) or None,
        180,
    )
    assert pod_gpus(pods) <= 4
    assert not [p for p in pods_of(k8s_api, namespace, winner) if not p.metadata.deletion_timestamp]


def test_a_zone_that_gives_no_node_is_backed_off_and_the_job_moves_to_nodes_that_exist(
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
) -> None:
    # An autoscaled A100 pool at zero nodes that never gets any (no autoscaler here: a
    # stockout), next to the local cluster's existing V100 spot nodes.
    stocked_out = gpupools(
        f"gone-{uuid.uuid4().hex[:6]}",
        autoscaling={
            "zones": [ZONE],
            "machineType": "a2-highgpu-4g",
            "maxNodesPerZone": 2,
            "provisioningSeconds": 30,
            "provisioningTimeoutSeconds": 60,
        },
    )
    existing = gpupools("v100-spot")
    wait_for(
        "possible capacity in the stocked-out pool",
        lambda: pool_status(k8s_api, stocked_out).get("gpusPossible") == 8,
        90,
    )
    # A long job: eight A100s after a 30 s wait beat the V100s that exist now.
    body = job_body(namespace, "moves", [stocked_out, existing])
    body["spec"]["training"]["steps"] = 1_000_000
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", body
    )

    def waiting_for_a100() -> list[Any] | None:
        pods = pods_of(k8s_api, namespace, "moves")
        on_a100 = [p for p in pods if p.metadata.labels.get("sailplan.dev/gpupool") == stocked_out]
        return on_a100 or None

    first = wait_for("workers pinned to the pool at zero nodes", waiting_for_a100, 120)
    assert all(p.spec.node_name is None for p in first)

    status = wait_for(
        "the zone backed off after the 60 s timeout",
        lambda: scale_up_backed_off(k8s_api, stocked_out),
        150,
        lambda: str(pool_status(k8s_api, stocked_out)),
    )
    (zone,) = status["zones"]
    assert zone["nodesPossible"] == 0 and zone["scaleUpBackoffSeconds"] == 300
    assert (
        ZONE in next(c for c in status["conditions"] if c["type"] == "ScaleUpAvailable")["message"]
    )

    wait_for(
        "the job replanned onto the V100s that exist, Running",
        running_on(k8s_api, namespace, "moves", existing),
        180,
        lambda: str((get_job(k8s_api, namespace, "moves").get("status") or {}).get("conditions")),
    )
    job = wait_phase(k8s_api, namespace, "moves", {"Running"}, 60)
    assert job["status"]["plan"]["generation"] >= 2


@pytest.fixture(scope="session")
def provisioning_request_crd(k8s_api: Any) -> None:
    """The real ProvisioningRequest CRD (autoscaling.x-k8s.io, from the cluster autoscaler's
    API module), installed and Established."""
    import yaml

    from sailplan_dev.localcluster import build

    crd = yaml.safe_load(build.provisioning_request_crd().read_text())
    extensions = client.ApiextensionsV1Api(k8s_api)
    try:
        extensions.create_custom_resource_definition(crd)
    except client.ApiException as error:
        if error.status != 409:
            raise

    def established() -> bool:
        found = extensions.read_custom_resource_definition(crd["metadata"]["name"])
        return any(
            c.type == "Established" and c.status == "True" for c in found.status.conditions or ()
        )

    wait_for("the ProvisioningRequest CRD Established", established, 60)


@pytest.mark.usefixtures("provisioning_request_crd")
def test_workers_wait_for_their_provisioning_request_and_start_once_it_is_provisioned(
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
    local_cluster: Any,
) -> None:
    node_pool = f"dws-{uuid.uuid4().hex[:6]}"
    pool = gpupools(
        node_pool,
        autoscaling={
            **autoscaling(2)["autoscaling"],
            "provisioningRequest": {"parameters": {"maxRunDurationSeconds": "3600"}},
        },
    )
    wait_for(
        "possible capacity in the pool",
        lambda: pool_status(k8s_api, pool).get("gpusPossible") == 8,
        90,
    )
    submit(k8s_api, namespace, "dws", pool)
    (request,) = wait_for(
        "a ProvisioningRequest for the plan's workers",
        lambda: capacity_requests_of(k8s_api, namespace, "dws") or None,
        120,
    )
    spec = request["spec"]
    assert spec["provisioningClassName"] == "queued-provisioning.gke.io"
    assert spec["parameters"] == {"maxRunDurationSeconds": "3600"}
    assert sum(s["count"] for s in spec["podSets"]) > 0
    # No worker exists while the request waits; the job says why.
    assert pods_of(k8s_api, namespace, "dws") == []

    def waiting_reason() -> str | None:
        conditions = (get_job(k8s_api, namespace, "dws").get("status") or {}).get("conditions", [])
        running = next((c for c in conditions if c["type"] == "Running"), {})
        return running.get("reason") if running.get("reason") == "WaitingForCapacity" else None

    wait_for("Running=False with reason WaitingForCapacity", waiting_reason, 60)
    assert pods_of(k8s_api, namespace, "dws") == []

    try:
        # The autoscaler's part: the pool's nodes, then every request of the job Provisioned
        # (the job's first plan may be an interim one: the search's answer then comes as a
        # new generation with a request of its own).
        local_cluster.add_nodes([node_manifest(grown_pool(node_pool), ZONE, i) for i in range(2)])
        provisioned: dict[str, int] = {}  # request -> its workers

        def running() -> list[Any] | None:
            for found in capacity_requests_of(k8s_api, namespace, "dws"):
                name = found["metadata"]["name"]
                if name not in provisioned:
                    set_request_condition(
                        k8s_api,
                        namespace,
                        name,
                        "Provisioned",
                        reason="Provisioned",
                        message="capacity is booked",
                    )
                    provisioned[name] = sum(s["count"] for s in found["spec"]["podSets"])
            current = pods_of(k8s_api, namespace, "dws")
            consumed = {
                (p.metadata.annotations or {}).get(
                    "autoscaling.x-k8s.io/consume-provisioning-request"
                )
                for p in current
            }
            ok = (
                len(consumed) == 1
                and (request_name := next(iter(consumed))) in provisioned
                and len(current) == provisioned[request_name]
                and all(p.status.phase == "Running" for p in current)
            )
            return current if ok else None

        wait_for(
            "the workers created on the booked nodes, consuming their request, Running",
            running,
            120,
            lambda: str(
                [(p.metadata.name, p.status.phase) for p in pods_of(k8s_api, namespace, "dws")]
            ),
        )
        job = wait_phase(k8s_api, namespace, "dws", {"Running"}, 60)
        # An interim first plan's request is deleted once the answer replaced it.
        generation = str(job["status"]["plan"]["generation"])
        wait_for(
            "only the current plan's request left",
            lambda: (
                {
                    r["metadata"]["labels"]["sailplan.dev/plan-generation"]
                    for r in capacity_requests_of(k8s_api, namespace, "dws")
                }
                == {generation}
            ),
            60,
        )
    finally:
        release_then_reset(k8s_api, namespace, local_cluster)


def a100_request_beside_v100s(
    k8s_api: Any,
    namespace: str,
    gpupools: Callable[..., str],
    job: str,
    provisioning_request: dict[str, Any],
) -> tuple[str, str, dict[str, Any]]:
    """An A100 GPUPool at zero nodes whose capacity comes through ProvisioningRequests
    (`provisioning_request`), the local cluster's V100 spot pool, and a long job on both,
    once it has requested its A100 workers: (A100 pool, V100 pool, the request)."""
    pool = gpupools(
        f"dws-{uuid.uuid4().hex[:6]}",
        autoscaling={
            **autoscaling(2)["autoscaling"],
            "provisioningSeconds": 30,
            "provisioningRequest": provisioning_request,
        },
    )
    existing = gpupools("v100-spot")
    wait_for(
        "possible capacity in the pool",
        lambda: pool_status(k8s_api, pool).get("gpusPossible") == 8,
        90,
    )
    # A long job: eight A100s after a 30 s wait beat the V100s that exist now.
    body = job_body(namespace, job, [pool, existing])
    body["spec"]["training"]["steps"] = 1_000_000
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", body
    )
    (request,) = wait_for(
        "a ProvisioningRequest for the A100 workers",
        lambda: capacity_requests_of(k8s_api, namespace, job) or None,
        120,
    )
    return pool, existing, request


def wait_moved_off_the_request(k8s_api: Any, namespace: str, job: str, existing: str) -> None:
    """The job replanned onto the V100s that exist and runs there; its new plan consumes no
    request, so the earlier one is deleted, with its PodTemplates."""
    wait_for(
        "the job replanned onto the V100s that exist, Running",
        running_on(k8s_api, namespace, job, existing),
        150,
        lambda: str((get_job(k8s_api, namespace, job).get("status") or {}).get("conditions")),
    )
    wait_for(
        "the earlier plan's ProvisioningRequest deleted",
        lambda: not capacity_requests_of(k8s_api, namespace, job),
        60,
        lambda: str([r["metadata"]["name"] for r in capacity_requests_of(k8s_api, namespace, job)]),
    )
    # The operator deletes the request, then its PodTemplates: a read between the two calls
    # still finds them.
    core = client.CoreV1Api(k8s_api)
    wait_for(
        "the earlier request's PodTemplates deleted",
        lambda: (
            not core.list_namespaced_pod_template(
                namespace, label_selector=f"sailplan.dev/job={job}"
            ).items
        ),
        30,
    )


# A resync far past the test: the zone's backoff and the replan can only come from the
# operator's watch on ProvisioningRequests (no worker pod exists to send an event).
@pytest.mark.parametrize("operator", [("--resync-seconds", "3600")], indirect=True)
@pytest.mark.usefixtures("provisioning_request_crd")
def test_a_failed_provisioning_request_backs_its_zone_off_and_the_job_moves(
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
) -> None:
    pool, existing, request = a100_request_beside_v100s(k8s_api, namespace, gpupools, "fails", {})
    # The autoscaler's part: no capacity.
    set_request_condition(
        k8s_api,
        namespace,
        request["metadata"]["name"],
        "Failed",
        reason="OutOfResources",
        message="GCE_STOCKOUT in us-central1-a",
    )
    wait_for(
        "the zone backed off",
        lambda: scale_up_backed_off(k8s_api, pool),
        60,
        lambda: str(pool_status(k8s_api, pool)),
    )
    wait_moved_off_the_request(k8s_api, namespace, "fails", existing)


def class_served(k8s_api: Any, pool: str) -> dict[str, Any]:
    """The pool's ProvisioningClassServed condition ({} while it has none)."""
    conditions = pool_status(k8s_api, pool).get("conditions", [])
    return next((c for c in conditions if c["type"] == "ProvisioningClassServed"), {})


@pytest.mark.usefixtures("provisioning_request_crd")
def test_a_request_of_a_class_no_autoscaler_serves_backs_its_zone_off_and_the_job_moves(
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
) -> None:
    nobody = "nobody-serves-this.example.com"
    pool, existing, request = a100_request_beside_v100s(
        k8s_api,
        namespace,
        gpupools,
        "nobody",
        {"className": nobody, "acceptanceTimeoutSeconds": 20},
    )
    assert request["spec"]["provisioningClassName"] == nobody
    # A class none of the known ones: flagged on the pool from the start, not refused.
    flagged = class_served(k8s_api, pool)
    assert (flagged["status"], flagged["reason"]) == ("Unknown", "UnknownProvisioningClass")
    # The autoscaler's part: nothing (no autoscaler serves the class); the request keeps
    # no condition at all.
    condition = wait_for(
        "the pool says its class is not served",
        lambda: (
            class_served(k8s_api, pool)
            if class_served(k8s_api, pool).get("status") == "False"
            else None
        ),
        90,
        lambda: str(pool_status(k8s_api, pool)),
    )
    assert condition["reason"] == "ProvisioningClassNotServed"
    assert nobody in condition["message"]
    assert "spec.autoscaling.provisioningRequest.className" in condition["message"]
    assert scale_up_backed_off(k8s_api, pool) is not None

    wait_moved_off_the_request(k8s_api, namespace, "nobody", existing)
    warnings = wait_for(
        "a Warning on the job naming the class and the field",
        lambda: [
            e
            for e in job_events(k8s_api, namespace, "nobody")
            if e.reason == "ProvisioningClassNotServed"
        ],
        30,
    )
    assert [e.type for e in warnings] == ["Warning"], warnings
    assert nobody in warnings[0].message
    assert f"className of GPUPool {pool}" in warnings[0].message
    # The pool keeps saying why after the request is gone, and so does the job, though it
    # runs on the V100s now: each of its passes reads it from the pools it may use.
    assert class_served(k8s_api, pool)["reason"] == "ProvisioningClassNotServed"
    shown = wait_for(
        "the job says a pool it may use is of a class no autoscaler serves",
        lambda: next(
            (
                c
                for c in (get_job(k8s_api, namespace, "nobody").get("status") or {}).get(
                    "conditions", []
                )
                if c["type"] == "ProvisioningClassServed" and c["status"] == "False"
            ),
            None,
        ),
        30,
    )
    assert shown["reason"] == "ProvisioningClassNotServed"
    assert shown["message"].startswith(f"GPUPool {pool}: ") and nobody in shown["message"]
    assert running_on(k8s_api, namespace, "nobody", existing)()
