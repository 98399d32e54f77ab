"""Kueue admission with the real Kueue (v0.14, built from its Go module) and the operator
against the local cluster.

A GPUPool of two 4-GPU nodes in two zones is one ResourceFlavor (the pool's node label); a
ClusterQueue grants 4 of its GPUs. Each job may spend at most what 4 GPUs cost
(objective.maxUsdPerHour over the pool's price), so its plan takes one node. The first job, queued in a LocalQueue
that does not exist yet, waits with that reason; once the queue exists Kueue admits its
plan's GPUs as one gang and its workers run. A second job finds a free node but no quota:
it waits with Kueue's reason on the TrainingJob and starts no worker until the first job
is deleted. Stopping the ClusterQueue evicts a running job, which drains and runs again on
a new plan once the queue is started. The first test runs before Kueue is installed: a queued job says so and waits,
one without the label runs (the module's Kueue fixture removes Kueue's CRDs when it stops).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_process import ClusterRbac, OperatorProcess, service_account_kubeconfig
from outcome import failed
from test_autoscaled_pools_cluster import ZONE, grown_pool, release_then_reset, running_on
from test_operator_cluster import get_job, job_body, job_events, pods_of
from test_priority_cluster import priority_classes  # noqa: F401 (a fixture)
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.reconcile import kueue
from sailplan_dev.localcluster.kueue import Kueue
from sailplan_dev.localcluster.nodes import node_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

GPUS_PER_NODE = 4
OTHER_ZONE = "us-central1-b"
QUOTA_GPUS = 4
USD_PER_GPU_HOUR = 1.0


@pytest.fixture
def rbac_operator(
    *,
    kubeconfig: str,
    k8s_api: Any,
    namespace: str,
    crds: None,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[OperatorProcess]:
    """The operator with exactly the ClusterRole of manifests/base/rbac.yaml (its rights on
    Workloads included); it must never be refused."""
    rbac = ClusterRbac(k8s_api, namespace)
    try:
        token = rbac.grant()
        limited = service_account_kubeconfig(kubeconfig, token, tmp_path / "operator.kubeconfig")
        running = OperatorProcess(limited, namespace, tmp_path / "operator.log")
        running.start()
        try:
            yield running
            assert "Forbidden" not in running.log.read_text()
        finally:
            running.stop()
            if failed(request):
                print("\n".join(["-- operator log (last 80 lines)", *running.log_tail(80)]))
    finally:
        rbac.revoke()


@pytest.fixture(scope="module")
def kueue_manager(
    kubeconfig: str, k8s_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kueue]:
    running = Kueue(Path(kubeconfig), k8s_api, tmp_path_factory.mktemp("kueue"))
    running.start()
    try:
        yield running
    finally:
        running.stop()


def admitted(job: dict[str, Any]) -> tuple[str, str, str] | None:
    for condition in (job.get("status") or {}).get("conditions") or ():
        if condition["type"] == kueue.COND_ADMITTED:
            return condition["status"], condition["reason"], condition.get("message", "")
    return None


def wait_admitted(
    k8s_api: Any, namespace: str, name: str, explain: Callable[[], str]
) -> tuple[str, str, str]:
    """The job's Admitted=True condition (written in the pass that creates the workers,
    after them: a worker may be Running a moment before it)."""

    def check() -> tuple[str, str, str] | None:
        found = admitted(get_job(k8s_api, namespace, name))
        return found if found and found[0] == "True" else None

    found: tuple[str, str, str] = wait_for(f"{name} Admitted", check, 30, explain)
    return found


def queued_job(namespace: str, name: str, pool: str, queue: str) -> dict[str, Any]:
    body = job_body(
        namespace,
        name,
        [pool],
        objective={"maxUsdPerHour": USD_PER_GPU_HOUR * GPUS_PER_NODE + 0.5},
    )
    body["spec"]["training"]["steps"] = 1_000_000  # runs until deleted
    # Four workers share a node of 8 CPUs (the default asks for 4 CPUs and 16 GiB each).
    body["spec"]["trainer"] |= {"cpu": "1", "memory": "4Gi"}
    body["metadata"]["labels"] = {kueue.QUEUE_LABEL: queue}
    return body


def queue_objects(
    namespace: str,
    flavor: str,
    node_pool: str,
    cluster_queue: str,
    queue: str,
    *,
    preemption: dict[str, str] | None = None,
) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """What a cluster admin defines: the pool's ResourceFlavor, a ClusterQueue with a quota
    in it, a LocalQueue in the job's namespace (docs/guide/kueue.md shows the same)."""
    api = ("kueue.x-k8s.io", "v1beta1")
    return [
        (
            (*api, "resourceflavors"),
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
                "spec": {"nodeLabels": {"cloud.google.com/gke-nodepool": node_pool}},
            },
        ),
        (
            (*api, "clusterqueues"),
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "ClusterQueue",
                "metadata": {"name": cluster_queue},
                "spec": {
                    "namespaceSelector": {},
                    **({"preemption": preemption} if preemption else {}),
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": flavor,
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "1000"},
                                        {"name": "memory", "nominalQuota": "10Ti"},
                                        {"name": "nvidia.com/gpu", "nominalQuota": QUOTA_GPUS},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        ),
        (
            (*api, namespace, "localqueues"),
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "LocalQueue",
                "metadata": {"name": queue, "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue},
            },
        ),
    ]


def explainer(
    k8s_api: Any, manager: Kueue | None, namespace: str, jobs: tuple[str, ...]
) -> Callable[[], str]:
    custom = client.CustomObjectsApi(k8s_api)

    def explain() -> str:
        lines = []
        for name in jobs:
            status = get_job(k8s_api, namespace, name).get("status") or {}
            lines.append(f"{name}: phase {status.get('phase')}")
            lines += [
                f"  {c['type']}={c['status']} {c.get('reason')}: {c.get('message', '')}"
                for c in status.get("conditions", [])
            ]
            lines += [
                f"  pod {p.metadata.name} {p.status.phase} on {p.spec.node_name}"
                for p in pods_of(k8s_api, namespace, name)
            ]
        if manager is None:
            return "\n".join(lines)
        for workload in custom.list_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, namespace, kueue.PLURAL
        )["items"]:
            conditions = (workload.get("status") or {}).get("conditions") or []
            lines.append(
                f"workload {workload['metadata']['name']}: "
                + "; ".join(f"{c['type']}={c['status']} {c.get('message', '')}" for c in conditions)
            )
        return "\n".join([*lines, "kueue log:", manager.log_tail(15)])

    return explain


@pytest.mark.usefixtures("rbac_operator")
def test_without_kueue_a_queued_job_waits_with_the_reason_and_others_run(
    k8s_api: Any, namespace: str, gpupools: Callable[..., str], local_cluster: Any
) -> None:
    """First in the module: before its fixture installs Kueue (and after any other module's
    Kueue fixture removed its CRDs again)."""
    served = {
        c.metadata.name
        for c in client.ApiextensionsV1Api(k8s_api).list_custom_resource_definition().items
    }
    assert "workloads.kueue.x-k8s.io" not in served
    node_pool = f"nokueue-{uuid.uuid4().hex[:6]}"
    local_cluster.add_nodes([node_manifest(grown_pool(node_pool), ZONE, 0)])
    custom = client.CustomObjectsApi(k8s_api)
    try:
        pool = gpupools(node_pool, pricing={"onDemandUsdPerGpuHour": USD_PER_GPU_HOUR})
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", queued_job(namespace, "queued", pool, "gpus")
        )

        def says_why() -> tuple[str, str, str] | None:
            found = admitted(get_job(k8s_api, namespace, "queued"))
            return found if found and found[1] == kueue.REASON_KUEUE_NOT_INSTALLED else None

        explain = explainer(k8s_api, None, namespace, ("queued", "plain"))
        status, _, message = wait_for("the queued job's reason", says_why, 120, explain)
        assert status == "False" and "Kueue is not installed" in message
        assert not pods_of(k8s_api, namespace, "queued")
        # The same job without the label runs on the node the queued one does not take.
        plain = queued_job(namespace, "plain", pool, "gpus")
        del plain["metadata"]["labels"]
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", plain)
        wait_for(
            "the unqueued job Running", running_on(k8s_api, namespace, "plain", pool), 180, explain
        )
        assert admitted(get_job(k8s_api, namespace, "plain")) is None
        assert not pods_of(k8s_api, namespace, "queued")
    finally:
        release_then_reset(k8s_api, namespace, local_cluster)


@pytest.mark.usefixtures("rbac_operator")
def test_kueue_admits_a_plan_as_one_gang_and_queues_a_job_over_quota_with_the_reason(
    k8s_api: Any,
    namespace: str,
    gpupools: Callable[..., str],
    local_cluster: Any,
    kueue_manager: Kueue,
) -> None:
    node_pool = f"kueue-{uuid.uuid4().hex[:6]}"
    # One node in each of two zones: a plan takes one (its workers share a zone), the second
    # job finds the other one free.
    local_cluster.add_nodes(
        [node_manifest(grown_pool(node_pool), zone, 0) for zone in (ZONE, OTHER_ZONE)]
    )
    custom = client.CustomObjectsApi(k8s_api)
    suffix = uuid.uuid4().hex[:6]
    flavor, cluster_queue, queue = f"flavor-{suffix}", f"gpus-{suffix}", "gpus"
    explain = explainer(k8s_api, kueue_manager, namespace, ("first", "second"))
    created: list[tuple[tuple[str, ...], str]] = []
    try:
        pool = gpupools(node_pool, pricing={"onDemandUsdPerGpuHour": USD_PER_GPU_HOUR})
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", queued_job(namespace, "first", pool, queue)
        )

        # No LocalQueue of that name yet: Kueue's reason, on the job; no worker starts.
        def queue_missing() -> tuple[str, str, str] | None:
            found = admitted(get_job(k8s_api, namespace, "first"))
            return found if found and found[1] == kueue.REASON_QUEUE_NOT_FOUND else None

        status, _, message = wait_for(
            "the missing queue as the reason", queue_missing, 120, explain
        )
        assert status == "False"
        assert f"LocalQueue {queue} doesn't exist" in message and kueue.QUEUE_LABEL in message
        assert not pods_of(k8s_api, namespace, "first")

        for path, body in queue_objects(namespace, flavor, node_pool, cluster_queue, queue):
            if len(path) == 4:
                custom.create_namespaced_custom_object(*path, body)
            else:
                custom.create_cluster_custom_object(*path, body)
            created.append((path, body["metadata"]["name"]))

        first = wait_for(
            "the first job's workers Running",
            running_on(k8s_api, namespace, "first", pool),
            180,
            explain,
        )
        found = wait_admitted(k8s_api, namespace, "first", explain)
        assert found[1] == kueue.REASON_ADMITTED
        job = get_job(k8s_api, namespace, "first")
        gpus = sum(
            int((c.resources.requests or {}).get("nvidia.com/gpu", 0))
            for p in first
            for c in p.spec.containers
        )
        # The plan's GPUs, admitted as one Workload under the quota they fill.
        assert gpus == job["status"]["plan"]["gpus"] == QUOTA_GPUS
        (workload,) = custom.list_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, namespace, kueue.PLURAL
        )["items"]
        assignments = workload["status"]["admission"]["podSetAssignments"]
        assert {a["flavors"]["nvidia.com/gpu"] for a in assignments} == {flavor}
        assert sum(a["count"] for a in assignments) == len(first)

        # A node is still free, the quota is not.
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", queued_job(namespace, "second", pool, queue)
        )

        def waits_for_quota() -> tuple[str, str, str] | None:
            found = admitted(get_job(k8s_api, namespace, "second"))
            return found if found and "insufficient" in found[2] else None

        status, reason, message = wait_for(
            "the second job waiting for quota", waits_for_quota, 120, explain
        )
        assert (status, reason) == ("False", kueue.REASON_PENDING)
        assert "nvidia.com/gpu" in message
        second = get_job(k8s_api, namespace, "second")
        assert second["status"]["phase"] == "Suspended"
        assert not pods_of(k8s_api, namespace, "second")

        # The first job goes, and with it its Workload: the second is admitted and runs.
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", "first")
        wait_for(
            "the second job's workers Running",
            running_on(k8s_api, namespace, "second", pool),
            180,
            explain,
        )
        wait_admitted(k8s_api, namespace, "second", explain)
    finally:
        release_then_reset(k8s_api, namespace, local_cluster)
        for path, name in reversed(created):
            try:
                if len(path) == 4:
                    custom.delete_namespaced_custom_object(*path, name)
                else:
                    custom.delete_cluster_custom_object(*path, name)
            except client.ApiException as error:
                if error.status != 404:
                    raise


@pytest.mark.usefixtures("rbac_operator")
def test_an_evicted_job_drains_then_queues_its_next_plan_and_runs_when_readmitted(
    k8s_api: Any,
    namespace: str,
    gpupools: Callable[..., str],
    local_cluster: Any,
    kueue_manager: Kueue,
) -> None:
    """Stopping the ClusterQueue (stopPolicy HoldAndDrain) makes Kueue evict the running
    job's Workload: the workers go as for spec.suspend, the job plans anew and its new
    Workload waits until the queue is started again, then it runs on the new plan."""
    node_pool = f"evict-{uuid.uuid4().hex[:6]}"
    local_cluster.add_nodes([node_manifest(grown_pool(node_pool), ZONE, 0)])
    custom = client.CustomObjectsApi(k8s_api)
    suffix = uuid.uuid4().hex[:6]
    flavor, cluster_queue, queue = f"flavor-{suffix}", f"gpus-{suffix}", "gpus"
    explain = explainer(k8s_api, kueue_manager, namespace, ("evictee",))
    created: list[tuple[tuple[str, ...], str]] = []
    try:
        pool = gpupools(node_pool, pricing={"onDemandUsdPerGpuHour": USD_PER_GPU_HOUR})
        for path, body in queue_objects(namespace, flavor, node_pool, cluster_queue, queue):
            if len(path) == 4:
                custom.create_namespaced_custom_object(*path, body)
            else:
                custom.create_cluster_custom_object(*path, body)
            created.append((path, body["metadata"]["name"]))
        job = queued_job(namespace, "evictee", pool, queue)
        job["spec"]["replan"] = {"drainTimeoutSeconds": 10}
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", job)
        first = wait_for(
            "the job's workers Running",
            running_on(k8s_api, namespace, "evictee", pool),
            180,
            explain,
        )
        first_uids = {p.metadata.uid for p in first}

        def stop_policy(value: str) -> None:
            custom.patch_cluster_custom_object(
                "kueue.x-k8s.io",
                "v1beta1",
                "clusterqueues",
                cluster_queue,
                {"spec": {"stopPolicy": value}},
            )

        stop_policy("HoldAndDrain")

        def evicted() -> tuple[str, str, str] | None:
            found = admitted(get_job(k8s_api, namespace, "evictee"))
            return found if found and found[1] == kueue.REASON_EVICTED else None

        wait_for("the eviction on the job", evicted, 60, explain)
        wait_for(
            "the evicted workers gone",
            lambda: (
                not {p.metadata.uid for p in pods_of(k8s_api, namespace, "evictee")} & first_uids
            ),
            90,
            explain,
        )

        # The next plan is queued, and waits while the ClusterQueue is stopped.
        def next_plan_waits() -> tuple[str, str, str] | None:
            found = admitted(get_job(k8s_api, namespace, "evictee"))
            waiting = found and found[0] == "False" and "evictee-g1" not in found[2]
            return found if waiting else None

        wait_for("the next plan's Workload waiting", next_plan_waits, 90, explain)
        assert not pods_of(k8s_api, namespace, "evictee")

        stop_policy("None")
        again = wait_for(
            "the job Running again", running_on(k8s_api, namespace, "evictee", pool), 180, explain
        )
        generations = {p.metadata.labels["sailplan.dev/plan-generation"] for p in again}
        assert generations != {"1"} and len(generations) == 1
        wait_admitted(k8s_api, namespace, "evictee", explain)
        names = [
            w["metadata"]["name"]
            for w in custom.list_namespaced_custom_object(
                kueue.GROUP, kueue.VERSION, namespace, kueue.PLURAL
            )["items"]
        ]
        assert names == [kueue.workload_name("evictee", int(generations.pop()))]
    finally:
        release_then_reset(k8s_api, namespace, local_cluster)
        for path, name in reversed(created):
            try:
                if len(path) == 4:
                    custom.delete_namespaced_custom_object(*path, name)
                else:
                    custom.delete_cluster_custom_object(*path, name)
            except client.ApiException as error:
                if error.status != 404:
                    raise


def test_kueue_preempts_a_lower_priority_job_for_a_higher_one_which_then_runs(
    *,
    k8s_api: Any,
    namespace: str,
    gpupools: Callable[..., str],
    local_cluster: Any,
    kueue_manager: Kueue,
    rbac_operator: OperatorProcess,
    priority_classes: tuple[str, str],  # noqa: F811 (the fixture imported above)
) -> None:
    """The workers' PriorityClass is the Workload's: in a ClusterQueue that preempts lower
    priorities, a high-priority job's Workload evicts the running low-priority one, whose
    workers drain and go; the high-priority job is admitted and runs on that node."""
    low, high = priority_classes
    node_pool = f"preempt-{uuid.uuid4().hex[:6]}"
    local_cluster.add_nodes([node_manifest(grown_pool(node_pool), ZONE, 0)])
    custom = client.CustomObjectsApi(k8s_api)
    suffix = uuid.uuid4().hex[:6]
    flavor, cluster_queue, queue = f"flavor-{suffix}", f"gpus-{suffix}", "gpus"
    explain = explainer(k8s_api, kueue_manager, namespace, ("low", "high"))
    objects = queue_objects(
        namespace,
        flavor,
        node_pool,
        cluster_queue,
        queue,
        preemption={"withinClusterQueue": "LowerPriority"},
    )
    created: list[tuple[tuple[str, ...], str]] = []
    try:
        pool = gpupools(node_pool, pricing={"onDemandUsdPerGpuHour": USD_PER_GPU_HOUR})
        for path, body in objects:
            if len(path) == 4:
                custom.create_namespaced_custom_object(*path, body)
            else:
                custom.create_cluster_custom_object(*path, body)
            created.append((path, body["metadata"]["name"]))
        for name, priority_class in (("low", low), ("high", high)):
            job = queued_job(namespace, name, pool, queue)
            job["spec"]["podTemplateOverrides"] = {"spec": {"priorityClassName": priority_class}}
            job["spec"]["replan"] = {"drainTimeoutSeconds": 10}
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", job)
            if name == "low":
                first = wait_for(
                    "the low-priority job Running",
                    running_on(k8s_api, namespace, "low", pool),
                    180,
                    explain,
                )
        wait_for(
            "the high-priority job Running",
            running_on(k8s_api, namespace, "high", pool),
            180,
            explain,
        )
        wait_admitted(k8s_api, namespace, "high", explain)
        workloads = {
            w["metadata"]["name"]: w
            for w in custom.list_namespaced_custom_object(
                kueue.GROUP, kueue.VERSION, namespace, kueue.PLURAL
            )["items"]
        }
        high_workload = next(w for n, w in workloads.items() if n.startswith("high-"))
        assert high_workload["spec"]["priorityClassName"] == high
        assert high_workload["spec"]["priority"] == 100_000
        # Kueue took the low-priority job's admission: the job said so and its first
        # workers are gone.
        evicted = [e for e in job_events(k8s_api, namespace, "low") if e.reason == "Evicted"]
        assert evicted and "Preempted" in evicted[0].message, explain()
        left = {p.metadata.uid for p in pods_of(k8s_api, namespace, "low")}
        assert not left & {p.metadata.uid for p in first}
    finally:
        release_then_reset(k8s_api, namespace, local_cluster)
        for path, name in reversed(created):
            try:
                if len(path) == 4:
                    custom.delete_namespaced_custom_object(*path, name)
                else:
                    custom.delete_cluster_custom_object(*path, name)
            except client.ApiException as error:
                if error.status != 404:
                    raise
