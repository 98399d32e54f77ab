"""Kueue admission with the real Kueue (v0.14, built from its Go module) and the operator
against the local cluster.

A GPUPool of two 4-GPU nodes in two zones is one ResourceFlavor (the pool's node label); a
ClusterQueue grants 4 of its GPUs. Each job may spend at most what 4 GPUs cost
(objective.maxUsdPerHour over the pool's price), so its plan takes one node. The first
job, queued in a LocalQueue that does not exist yet, waits with that reason; once the queue exists Kueue admits its
plan's GPUs as one gang and its workers run. A second job finds a free node but no quota:
it waits with Kueue's reason on the TrainingJob and starts no worker until the first job
is deleted. Stopping the ClusterQueue evicts a running job, which drains and runs again on
a new plan once the queue is started. A higher-priority job preempts a lower one. A job
that replans while it waits keeps its place in the queue, and one that replans within its
admitted quota keeps its admission. The first test runs before Kueue is installed: a
queued job says so and waits, one without the label runs (the module's Kueue fixture
removes Kueue's CRDs when it stops); the second installs Kueue after the operator started,
whose Workloads it then lists and polls instead of watching. Builders: kueue_builders.py;
waits: cluster_waits.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cluster_waits import (
    RUNNING_TIMEOUT_S,
    kueue_queues,
    priority_classes,  # noqa: F401 (a fixture)
    wait_admitted,
    wait_running,
)
from kubernetes import client
from kueue_builders import KUEUE_API, admitted, queue_objects, queued
from operator_process import ClusterRbac, OperatorProcess, service_account_kubeconfig
from outcome import failed
from test_autoscaled_pools_cluster import ZONE, grown_pool, release_then_reset, running_on
from test_operator_cluster import get_job, job_body, job_events, pods_of
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.reconcile import kueue
from sailplan_dev.localcluster.kueue import Kueue
from sailplan_dev.localcluster.nodes import node_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.go_build("kueue")]

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
    Workloads included); it must never be refused. Its resync is an hour: where Kueue was
    installed when it started, only the watch of its Workloads tells it of an admission,
    eviction or preemption within a test's time (it does not poll them then)."""
    rbac = ClusterRbac(k8s_api, namespace)
    try:
        token = rbac.grant()
        limited = service_account_kubeconfig(kubeconfig, token, tmp_path / "operator.kubeconfig")
        running = OperatorProcess(
            limited, namespace, tmp_path / "operator.log", "--resync-seconds", "3600"
        )
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


def queued_job(namespace: str, name: str, pool: str, queue: str, gpus: int = 4) -> dict[str, Any]:
    """A job in `queue` whose budget buys `gpus` of the pool's GPUs (its plan takes that
    many: one node for 4)."""
    body = job_body(
        namespace,
        name,
        [pool],
        objective={"maxUsdPerHour": USD_PER_GPU_HOUR * gpus + 0.5},
    )
    body["spec"]["training"]["steps"] = 1_000_000  # runs until deleted
    # Four workers share a node of 8 CPUs (the default asks for 4 CPUs and 16 GiB each).
    body["spec"]["trainer"] |= {"cpu": "1", "memory": "4Gi"}
    return queued(body, queue)


def create_job(k8s_api: Any, body: dict[str, Any]) -> None:
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, body["metadata"]["namespace"], "trainingjobs", body
    )


def condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    conditions = (job.get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c["type"] == type_), None)


def workloads_of(k8s_api: Any, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, namespace, kueue.PLURAL
    )["items"]
    return items


def gpus_of(pods: list[Any]) -> int:
    return sum(
        int((c.resources.requests or {}).get("nvidia.com/gpu", 0))
        for p in pods
        for c in p.spec.containers
    )


def gpus_asked(workload: dict[str, Any]) -> int:
    return sum(
        int(total)
        for _, resource, total in kueue.charged(workload)
        if resource == kueue.GPU_RESOURCE
    )


def wait_reason(
    k8s_api: Any,
    namespace: str,
    name: str,
    reason: str,
    explain: Callable[[], str],
    *,
    timeout_s: float = 120,
) -> tuple[str, str, str]:
    """The job's Admitted condition once its reason is `reason`."""

    def check() -> tuple[str, str, str] | None:
        found = admitted(get_job(k8s_api, namespace, name).get("status") or {})
        return found if found and found[1] == reason else None

    found: tuple[str, str, str] = wait_for(f"{name}: Admitted {reason}", check, timeout_s, explain)
    return found


def waits_for_quota(
    k8s_api: Any, namespace: str, name: str
) -> Callable[[], tuple[str, str, str] | None]:
    """A wait_for check: the job's Admitted condition while Kueue finds no quota for it."""

    def check() -> tuple[str, str, str] | None:
        found = admitted(get_job(k8s_api, namespace, name).get("status") or {})
        return found if found and "insufficient" in found[2] else None

    return check


@dataclass(frozen=True)
class Queues:
    """This test's ResourceFlavor (the pool's nodes), ClusterQueue (QUOTA_GPUS of it) and
    LocalQueue; `define` (a context manager's function) creates them."""

    flavor: str
    cluster_queue: str
    queue: str
    objects: list[tuple[tuple[str, ...], dict[str, Any]]]


def queues(namespace: str, node_pool: str, **options: Any) -> Queues:
    suffix = uuid.uuid4().hex[:6]
    flavor, cluster_queue, queue = f"flavor-{suffix}", f"gpus-{suffix}", "gpus"
    objects = queue_objects(
        namespace, flavor, node_pool, cluster_queue, queue, gpus=QUOTA_GPUS, **options
    )
    return Queues(flavor, cluster_queue, queue, objects)


def explainer(
    k8s_api: Any, manager: Kueue | None, namespace: str, jobs: tuple[str, ...]
) -> Callable[[], str]:
    def explain() -> str:
        lines = []
        for name in jobs:
            try:
                status = get_job(k8s_api, namespace, name).get("status") or {}
            except client.ApiException as error:
                lines.append(f"{name}: {error.status} {error.reason}")
                continue
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
        for workload in workloads_of(k8s_api, namespace):
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
    try:
        pool = gpupools(node_pool, pricing={"onDemandUsdPerGpuHour": USD_PER_GPU_HOUR})
        create_job(k8s_api, queued_job(namespace, "queued", pool, "gpus"))
        explain = explainer(k8s_api, None, namespace, ("queued", "plain"))
        status, _, message = wait_reason(
            k8s_api, namespace, "queued", kueue.REASON_KUEUE_NOT_INSTALLED, explain
        )
        assert status == "False" and "Kueue is not installed" in message
        assert not pods_of(k8s_api, namespace, "queued")
        # The same job without the label runs on the node the queued one does not take.
        plain = queued_job(namespace, "plain", pool, "gpus")
        del plain["metadata"]["labels"]
        create_job(k8s_api, plain)
        wait_running(k8s_api, namespace, "plain", pool, explain)
        assert admitted(get_job(k8s_api, namespace, "plain").get("status") or {}) is None
        assert not pods_of(k8s_api, namespace, "queued")
    finally:
        release_then_reset(k8s_api, namespace, local_cluster)


def test_kueue_installed_after_the_operator_started_is_listed_and_polled(
    *,
    k8s_api: Any,
    kubeconfig: str,
    namespace: str,
    gpupools: Callable[..., str],
    local_cluster: Any,
    rbac_operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    """Second in the module, before its Kueue fixture: the operator started without Kueue's
    CRDs, so Kopf watches no Workloads; Kueue installed afterwards still admits a queued
    job, which the operator sees by listing and polling (its resync is an hour)."""
    node_pool = f"late-{uuid.uuid4().hex[:6]}"
    local_cluster.add_nodes([node_manifest(grown_pool(node_pool), ZONE, 0)])
    late = Kueue(Path(kubeconfig), k8s_api, tmp_path / "kueue")
    late.start()
    q = queues(namespace, node_pool)
    explain = explainer(k8s_api, late, namespace, ("late",))
    try:
        with kueue_queues(k8s_api, q.objects) as define:
            try:
                pool = gpupools(node_pool, pricing={"onDemandUsdPerGpuHour": USD_PER_GPU_HOUR})
                define()
                create_job(k8s_api, queued_job(namespace, "late", pool, q.queue))
                wait_running(k8s_api, namespace, "late", pool, explain)
                wait_admitted(k8s_api, namespace, "late", explain)
            finally:
                release_then_reset(k8s_api, namespace, local_cluster)
    finally:
        late.stop()
    assert "Workloads not readable" not in rbac_operator.log.read_text()


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
    q = queues(namespace, node_pool)
    explain = explainer(k8s_api, kueue_manager, namespace, ("first", "second"))
    with kueue_queues(k8s_api, q.objects) as define:
        try:
            pool = gpupools(node_pool, pricing={"onDemandUsdPerGpuHour": USD_PER_GPU_HOUR})
            create_job(k8s_api, queued_job(namespace, "first", pool, q.queue))

            # No LocalQueue of that name yet: Kueue's reason, on the job; no worker starts.
            status, _, message = wait_reason(
                k8s_api, namespace, "first", kueue.REASON_QUEUE_NOT_FOUND, explain
            )
            assert status == "False"
            assert f"LocalQueue {q.queue} doesn't exist" in message
            assert kueue.QUEUE_LABEL in message
            assert not pods_of(k8s_api, namespace, "first")

            define()
            # The job may start on an interim plan made while its pool's status still
            # counted fewer nodes, and switch (a new generation, a new Workload) once the
            # search on the current pool answers: wait for the plan that fills the quota.
            running = running_on(k8s_api, namespace, "first", pool)

            def on_the_full_plan() -> list[Any] | None:
                pods = running()
                return pods if pods and gpus_of(pods) == QUOTA_GPUS else None

            first = wait_for(
                f"first's workers Running on its {QUOTA_GPUS}-GPU plan",
                on_the_full_plan,
                RUNNING_TIMEOUT_S,
                explain,
            )
            found = wait_admitted(k8s_api, namespace, "first", explain)
            assert found[1] == kueue.REASON_ADMITTED
            job = get_job(k8s_api, namespace, "first")
            # The plan's GPUs, admitted as one Workload under the quota they fill.
            assert job["status"]["plan"]["gpus"] == QUOTA_GPUS
            (workload,) = wait_for(
                "one Workload left (an interim plan's is deleted)",
                lambda: held if len(held := workloads_of(k8s_api, namespace)) == 1 else None,
                30,
                explain,
            )
            assignments = workload["status"]["admission"]["podSetAssignments"]
            assert {a["flavors"]["nvidia.com/gpu"] for a in assignments} == {q.flavor}
            assert sum(a["count"] for a in assignments) == len(first)

            # A node is still free, the quota is not.
            create_job(k8s_api, queued_job(namespace, "second", pool, q.queue))
            status, reason, message = wait_for(
                "the second job waiting for quota",
                waits_for_quota(k8s_api, namespace, "second"),
                120,
                explain,
            )
            assert (status, reason) == ("False", kueue.REASON_PENDING)
            assert "nvidia.com/gpu" in message
            # Held by the queue: suspended, as Kueue shows a Kubeflow or JobSet job.
            second = get_job(k8s_api, namespace, "second")
            assert second["status"]["phase"] == "Suspended"
            suspended = condition(second, "Suspended")
            assert suspended is not None
            assert (suspended["status"], suspended["reason"]) == (
                "True",
                kueue.REASON_AWAITING_ADMISSION,
            )
            assert not pods_of(k8s_api, namespace, "second")

            # The first job goes, and with it its Workload: the second is admitted and runs.
            custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, "trainingjobs", "first"
            )
            wait_running(k8s_api, namespace, "second", pool, explain)
            wait_admitted(k8s_api, namespace, "second", explain)
            suspended = condition(get_job(k8s_api, namespace, "second"), "Suspended")
            assert suspended is not None
            assert (suspended["status"], suspended["reason"]) == ("False", kueue.REASON_ADMITTED)
        finally:
            release_then_reset(k8s_api, namespace, local_cluster)


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
    q = queues(namespace, node_pool)
    explain = explainer(k8s_api, kueue_manager, namespace, ("evictee",))
    with kueue_queues(k8s_api, q.objects) as define:
        try:
            pool = gpupools(node_pool, pricing={"onDemandUsdPerGpuHour": USD_PER_GPU_HOUR})
            define()
            job = queued_job(namespace, "evictee", pool, q.queue)
            job["spec"]["replan"] = {"drainTimeoutSeconds": 10}
            create_job(k8s_api, job)
            first = wait_running(k8s_api, namespace, "evictee", pool, explain)
            first_uids = {p.metadata.uid for p in first}

            def stop_policy(value: str) -> None:
                custom.patch_cluster_custom_object(
                    *KUEUE_API, "clusterqueues", q.cluster_queue, {"spec": {"stopPolicy": value}}
                )

            stop_policy("HoldAndDrain")
            wait_reason(k8s_api, namespace, "evictee", kueue.REASON_EVICTED, explain, timeout_s=60)
            wait_for(
                "the evicted workers gone",
                lambda: (
                    not {p.metadata.uid for p in pods_of(k8s_api, namespace, "evictee")}
                    & first_uids
                ),
                90,
                explain,
            )

            # The next plan is queued, and waits while the ClusterQueue is stopped.
            def next_plan_waits() -> tuple[str, str, str] | None:
                found = admitted(get_job(k8s_api, namespace, "evictee").get("status") or {})
                waiting = found and found[0] == "False" and "evictee-g1" not in found[2]
                return found if waiting else None

            wait_for("the next plan's Workload waiting", next_plan_waits, 90, explain)
            assert not pods_of(k8s_api, namespace, "evictee")
            assert get_job(k8s_api, namespace, "evictee")["status"]["phase"] == "Suspended"

            stop_policy("None")
            again = wait_running(
                k8s_api, namespace, "evictee", pool, explain, what="the job Running again"
            )
            generations = {p.metadata.labels["sailplan.dev/plan-generation"] for p in again}
            assert generations != {"1"} and len(generations) == 1
            wait_admitted(k8s_api, namespace, "evictee", explain)
            # An evicted Workload keeps its quota reservation (Kueue's own integrations
            # release it through the Workload's status): the next plan got a new one.
            names = [w["metadata"]["name"] for w in workloads_of(k8s_api, namespace)]
            assert names == [kueue.workload_name("evictee", int(generations.pop()))]
        finally:
            release_then_reset(k8s_api, namespace, local_cluster)


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
    q = queues(namespace, node_pool, preemption={"withinClusterQueue": "LowerPriority"})
    explain = explainer(k8s_api, kueue_manager, namespace, ("low", "high"))
    with kueue_queues(k8s_api, q.objects) as define:
        try:
            pool = gpupools(node_pool, pricing={"onDemandUsdPerGpuHour": USD_PER_GPU_HOUR})
            define()
            first: list[Any] = []
            for name, priority_class in (("low", low), ("high", high)):
                job = queued_job(namespace, name, pool, q.queue)
                job["spec"]["podTemplateOverrides"] = {
                    "spec": {"priorityClassName": priority_class}
                }
                job["spec"]["replan"] = {"drainTimeoutSeconds": 10}
                create_job(k8s_api, job)
                if name == "low":
                    first = wait_running(k8s_api, namespace, "low", pool, explain)
            wait_running(k8s_api, namespace, "high", pool, explain)
            wait_admitted(k8s_api, namespace, "high", explain)
            workloads = {w["metadata"]["name"]: w for w in workloads_of(k8s_api, namespace)}
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


@pytest.mark.usefixtures("rbac_operator")
def test_a_replanned_job_keeps_its_place_in_the_queue_and_its_admission(
    k8s_api: Any,
    namespace: str,
    gpupools: Callable[..., str],
    local_cluster: Any,
    kueue_manager: Kueue,
) -> None:
    """Kueue orders pending Workloads by priority, then creation time. `a` runs on the whole
    quota; `b`, then `c` wait for it. `b` replans while it waits (a smaller budget: 2 GPUs):
    its Workload takes the new pod sets in place, so it stays ahead of `c`. `a` replans to
    2 GPUs: its plan fits in the quota its Workload was admitted with, so it keeps that
    admission and its new workers start without queueing. When `a` goes, `b` (2 GPUs, the
    older Workload) is admitted before `c` (4 GPUs), which then no longer fits. Had `b`'s
    replan made a new Workload, `c` would have been first and `b` would wait."""
    node_pool = f"order-{uuid.uuid4().hex[:6]}"
    local_cluster.add_nodes(
        [node_manifest(grown_pool(node_pool), zone, 0) for zone in (ZONE, OTHER_ZONE)]
    )
    custom = client.CustomObjectsApi(k8s_api)
    q = queues(namespace, node_pool)
    explain = explainer(k8s_api, kueue_manager, namespace, ("a", "b", "c"))

    def workload(job: str) -> dict[str, Any]:
        (found,) = [w for w in workloads_of(k8s_api, namespace) if w["metadata"]["name"][0] == job]
        return found

    def smaller_budget(job: str) -> None:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "trainingjobs",
            job,
            {"spec": {"objective": {"maxUsdPerHour": USD_PER_GPU_HOUR * 2 + 0.5}}},
        )

    with kueue_queues(k8s_api, q.objects) as define:
        try:
            pool = gpupools(node_pool, pricing={"onDemandUsdPerGpuHour": USD_PER_GPU_HOUR})
            define()
            a = queued_job(namespace, "a", pool, q.queue)
            a["spec"]["replan"] = {"drainTimeoutSeconds": 10}
            create_job(k8s_api, a)
            wait_running(k8s_api, namespace, "a", pool, explain)
            wait_admitted(k8s_api, namespace, "a", explain)
            for name in ("b", "c"):
                create_job(k8s_api, queued_job(namespace, name, pool, q.queue))
                wait_for(f"{name} waiting", waits_for_quota(k8s_api, namespace, name), 120, explain)
                # Kueue orders equal priorities by creationTimestamp, which has one-second
                # resolution, and breaks a tie arbitrarily: c's Workload must be a second newer.
                created = workload(name)["metadata"]["creationTimestamp"]
                newer_at = datetime.fromisoformat(created.replace("Z", "+00:00")) + timedelta(
                    seconds=1
                )
                time.sleep(max(0.0, (newer_at - datetime.now(UTC)).total_seconds()))
            b_before, a_before = workload("b"), workload("a")

            # b replans while it waits: same Workload, the new plan's 2 GPUs.
            smaller_budget("b")

            def b_updated() -> dict[str, Any] | None:
                found = workload("b")
                labels = found["metadata"]["labels"]
                moved = labels["sailplan.dev/plan-generation"] != "1"
                return found if moved and gpus_asked(found) == 2 else None

            b_after = wait_for("b's Workload on its new plan", b_updated, 120, explain)
            for key in ("uid", "creationTimestamp", "name"):
                assert b_after["metadata"][key] == b_before["metadata"][key]
            assert admitted(get_job(k8s_api, namespace, "b")["status"])[0] == "False"  # type: ignore[index]

            # a replans within its admission: its new workers run under the same Workload.
            smaller_budget("a")

            def a_replanned() -> list[Any] | None:
                # Every worker of a later plan running, all of them (they are created one
                # by one): the 2 GPUs of the new budget.
                pods = running_on(k8s_api, namespace, "a", pool)() or []
                generations = {p.metadata.labels["sailplan.dev/plan-generation"] for p in pods}
                return pods if pods and "1" not in generations and gpus_of(pods) == 2 else None

            wait_for("a running its 2-GPU plan", a_replanned, 180, explain)
            a_after = workload("a")
            assert a_after["metadata"]["uid"] == a_before["metadata"]["uid"]
            assert a_after["metadata"]["labels"]["sailplan.dev/plan-generation"] != "1"
            assert admitted(get_job(k8s_api, namespace, "a")["status"])[0] == "True"  # type: ignore[index]
            assert not pods_of(k8s_api, namespace, "b") and not pods_of(k8s_api, namespace, "c")

            # a goes: b, ahead in the queue, is admitted; c no longer fits.
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", "a")
            wait_running(k8s_api, namespace, "b", pool, explain)
            wait_admitted(k8s_api, namespace, "b", explain)
            assert workload("b")["metadata"]["uid"] == b_before["metadata"]["uid"]
            wait_for("c waiting", waits_for_quota(k8s_api, namespace, "c"), 60, explain)
            assert not pods_of(k8s_api, namespace, "c")
        finally:
            release_then_reset(k8s_api, namespace, local_cluster)
