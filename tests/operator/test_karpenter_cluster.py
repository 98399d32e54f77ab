"""A real node autoscaler under the operator: Karpenter (kwok provider) grows an autoscaled
GPUPool from zero nodes for a job and shrinks it back once the job is gone; a stockout
(Karpenter adds no node) moves the job to a smaller plan on nodes that exist, and the larger
plan wins again once the offering is back; two jobs submitted together never book the same
GPUs, and their nodes go once they complete.

The operator plans on the capacity the pool may add and creates worker pods pinned to the
pool and zone; Karpenter sees them pending and creates nodes labelled as GKE labels the node
pool's nodes (node pool, accelerator, zone, nvidia.com/gpu allocatable, GPU taint), the
cluster's kwok makes them Ready, the scheduler binds the pods and the job runs. Deleting the
job, or the job completing, leaves the nodes empty and Karpenter removes them: nothing the
operator leaves behind pins a node. Karpenter runs only in this module's fixture (it watches every pending pod).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_process import OperatorProcess
from test_autoscaled_pools_cluster import (
    pod_gpus,
    pool_status,
    running_on,
    scale_up_backed_off,
    submit,
    zone_of,
)
from test_operator_cluster import get_job, job_body, pods_of, wait_phase
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.api.gpupool import GPUPool
from sailplan.planner.workerenv import CHECKPOINT_REQUEST_ANNOTATION
from sailplan_dev.localcluster.karpenter import Karpenter
from sailplan_dev.localcluster.karpenter_shapes import (
    NODEPOOL_OF_NODE_LABEL,
    instance_types,
    node_pools,
    without_offerings,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.go_build("karpenter")]

ZONE = "us-central1-b"
MACHINE = "a2-highgpu-4g"
GPUS_PER_NODE = 4  # a2-highgpu-4g
MAX_NODES = 2
AUTOSCALING: dict[str, Any] = {
    "zones": [ZONE],
    "machineType": MACHINE,
    "minNodesPerZone": 0,
    "maxNodesPerZone": MAX_NODES,
    "provisioningSeconds": 30,
}


@pytest.fixture
def karpenter(
    kubeconfig: str,
    k8s_api: Any,
    local_cluster: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Karpenter]:
    """Karpenter against the session's local cluster (its kwok must play the new nodes'
    kubelets, hence local_cluster), stopped after the test with its nodes removed. Tests
    ask for it before `operator`, so the operator stops first: stopped while the operator
    runs, Karpenter would evict the workers and the operator would replan them.

    Started stocked out with @pytest.mark.parametrize("karpenter", [(machine type, zones)],
    indirect=True): that machine type is not offered in those zones."""
    types = instance_types([ZONE])
    stockout = getattr(request, "param", None)
    if stockout is not None:
        types = without_offerings(types, *stockout)
    running = Karpenter(Path(kubeconfig), k8s_api, tmp_path / "karpenter")
    running.start(types)
    try:
        yield running
    finally:
        running.stop()


def karpenter_pool(gpupools: Callable[..., str], node_pool: str, **autoscaling: Any) -> GPUPool:
    """A GPUPool of AUTOSCALING (and `autoscaling`) in the cluster, as the model the
    NodePools are made from."""
    spec = {"nodePool": node_pool, "autoscaling": AUTOSCALING | autoscaling}
    name = gpupools(node_pool, autoscaling=spec["autoscaling"])
    return GPUPool.model_validate({"name": name, "spec": spec})


def nodes_of(k8s_api: Any, node_pool: str) -> list[Any]:
    nodes: list[Any] = (
        client.CoreV1Api(k8s_api)
        .list_node(label_selector=f"cloud.google.com/gke-nodepool={node_pool}")
        .items
    )
    return nodes


def ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ())


def explainer(
    k8s_api: Any, karpenter: Karpenter, namespace: str, job: str | tuple[str, ...], node_pool: str
) -> Callable[[], str]:
    """What a timeout shows: the node claims, the pool's nodes, the job's (or jobs') pods
    and status, Karpenter's last log lines (why it did or did not provision or remove)."""
    jobs = (job,) if isinstance(job, str) else job

    def explain() -> str:
        claims = [
            f"  {c['metadata']['name']} "
            + " ".join(
                f"{k['type']}={k['status']}" for k in (c.get("status") or {}).get("conditions", [])
            )
            for c in karpenter.node_claims()
        ]
        nodes = [
            f"  {n.metadata.name} ready={ready(n)} deleting={n.metadata.deletion_timestamp}"
            f" taints={[t.key for t in n.spec.taints or ()]}"
            for n in nodes_of(k8s_api, node_pool)
        ]
        pods = [
            f"  {p.metadata.name} {p.status.phase} on {p.spec.node_name}"
            for name in jobs
            for p in pods_of(k8s_api, namespace, name)
        ]
        states = [
            f"  {name}: {status.get('phase')} "
            + "; ".join(
                f"{c['type']}={c['status']} {c.get('reason', '')}"
                for c in status.get("conditions", [])
            )
            for name in jobs
            for status in [get_job(k8s_api, namespace, name).get("status") or {}]
        ]
        return "\n".join(
            [
                "node claims:",
                *claims,
                "nodes:",
                *nodes,
                "pods:",
                *pods,
                "jobs:",
                *states,
                "karpenter log:",
                karpenter.log_tail(),
            ]
        )

    return explain


def test_karpenter_grows_a_pool_from_zero_for_a_job_and_removes_the_nodes_after(
    k8s_api: Any,
    namespace: str,
    karpenter: Karpenter,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
) -> None:
    node_pool = f"karp-{uuid.uuid4().hex[:6]}"
    pool = karpenter_pool(gpupools, node_pool)
    name = pool.name
    karpenter.apply_node_pools(node_pools(pool, consolidate_after_s=0))
    explain = explainer(k8s_api, karpenter, namespace, "grow", node_pool)
    assert not nodes_of(k8s_api, node_pool)

    submit(k8s_api, namespace, "grow", name)
    pods = wait_for("worker pods created", lambda: pods_of(k8s_api, namespace, "grow"), 120)
    assert {zone_of(p) for p in pods} == {ZONE}

    def running() -> list[Any] | None:
        current = pods_of(k8s_api, namespace, "grow")
        ok = current and all(p.status.phase == "Running" for p in current)
        return current if ok else None

    bound = wait_for("worker pods Running on nodes Karpenter added", running, 120, explain)
    nodes = {n.metadata.name: n for n in nodes_of(k8s_api, node_pool)}
    used = {p.spec.node_name for p in bound}
    assert used <= set(nodes)
    # Nodes as GKE would label and size them, in the zone the pods are pinned to.
    for node in nodes.values():
        labels = node.metadata.labels
        assert labels["cloud.google.com/gke-accelerator"] == "nvidia-tesla-a100"
        assert labels["topology.kubernetes.io/zone"] == ZONE
        assert labels["node.kubernetes.io/instance-type"] == "a2-highgpu-4g"
        assert labels[NODEPOOL_OF_NODE_LABEL] == name  # the NodePool made from the GPUPool
        assert node.status.allocatable["nvidia.com/gpu"] == str(GPUS_PER_NODE)
        assert ("nvidia.com/gpu", "NoSchedule") in {(t.key, t.effect) for t in node.spec.taints}
    # The workers fill whole nodes (no node half used while another is added), and the
    # pool's limit holds: nodes of a plan the job replaced before they came count too.
    assert len(used) == -(-pod_gpus(bound) // GPUS_PER_NODE)
    assert len(nodes) <= MAX_NODES
    wait_phase(k8s_api, namespace, "grow", {"Running"}, 60)
    # The GPUPool counts Karpenter's nodes as its own (they carry what it selects) and holds
    # no reservation once the workers are bound.
    wait_for(
        "the GPUPool status to count the new nodes, nothing reserved",
        lambda: (
            (s := pool_status(k8s_api, name)).get("nodesReady", 0) >= len(used)
            and s.get("gpusReserved", 0) == 0
        ),
        60,
        lambda: str(pool_status(k8s_api, name)),
    )

    client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", "grow"
    )
    wait_for(
        "Karpenter to remove the emptied nodes",
        lambda: not nodes_of(k8s_api, node_pool),
        120,
        explain,
    )


def live_workers(k8s_api: Any, namespace: str, jobs: tuple[str, ...]) -> list[Any]:
    """The jobs' workers that hold or will take GPUs: not finished, not being deleted."""
    return [
        p
        for job in jobs
        for p in pods_of(k8s_api, namespace, job)
        if p.status.phase not in ("Succeeded", "Failed") and not p.metadata.deletion_timestamp
    ]


def booked_twice(k8s_api: Any, namespace: str, jobs: tuple[str, ...], possible: int) -> list[str]:
    """Capacity booked twice, if any: the jobs' workers (bound or not) planning more GPUs in
    the pool's zone than it can ever have, or bound to a node with fewer GPUs than they
    take."""
    workers = live_workers(k8s_api, namespace, jobs)
    problems = []
    planned = pod_gpus(workers)
    if planned > possible:
        names = sorted(p.metadata.name for p in workers)
        problems.append(f"{planned} GPUs planned in a zone of {possible}: {names}")
    per_node: dict[str, list[Any]] = {}
    for pod in workers:
        if pod.spec.node_name:
            per_node.setdefault(pod.spec.node_name, []).append(pod)
    allocatable = {
        n.metadata.name: int((n.status.allocatable or {}).get("nvidia.com/gpu", 0))
        for n in client.CoreV1Api(k8s_api).list_node().items
    }
    for node, pods in sorted(per_node.items()):
        if pod_gpus(pods) > allocatable.get(node, 0):
            problems.append(f"node {node}: {pod_gpus(pods)} GPUs bound, {allocatable.get(node)}")
    return problems


def settled(k8s_api: Any, namespace: str, job: str) -> str | None:
    """Running (phase and every worker of the plan), or Unschedulable without workers and
    the reason it waits; None while neither."""
    status = get_job(k8s_api, namespace, job).get("status") or {}
    pods = [p for p in pods_of(k8s_api, namespace, job) if not p.metadata.deletion_timestamp]
    workers = (status.get("plan") or {}).get("workers")
    if status.get("phase") == "Running" and len(pods) == workers:
        return "Running" if all(p.status.phase == "Running" for p in pods) else None
    if status.get("phase") == "Unschedulable" and not pods:
        reasons = [
            c.get("reason")
            for c in status.get("conditions", [])
            if c["type"] == "Unschedulable" and c["status"] == "True"
        ]
        return f"Unschedulable: {reasons[0]}" if reasons else None
    return None


def test_two_jobs_together_never_book_the_same_gpus_and_their_nodes_go_once_they_complete(
    k8s_api: Any,
    namespace: str,
    karpenter: Karpenter,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
) -> None:
    """Both jobs plan at once on a pool that may grow to two nodes (8 A100s) and has none.
    Alone, each would plan on all eight (two workers of four GPUs, a node each); together,
    the second must see the first's unbound workers as reserved and wait with a reason (a
    job that counted them as its own would plan eight more: sixteen in a zone of eight, and
    half its workers would wait for nodes that never come). Checked every few hundred
    milliseconds from the submission on, while the jobs plan, their workers wait and
    Karpenter adds nodes: never more GPUs planned in the zone than it can have, nor bound
    to a node than it has.

    Then the jobs complete (not deleted: their finished workers stay). The first's nodes go
    to the waiting job, which runs on them and completes too, and every node goes: nothing
    the operator leaves behind a finished job (workers, reservations, a restarted worker)
    keeps a node busy, so Karpenter scales the pool back to zero. A job completes when all
    its workers exit 0; kwok runs no trainer, so the test writes what the kubelet would,
    phase Succeeded, as the trainer's exit after its last step.

    Both plans use whole nodes. Plans that use part of a node are placed one job to a node
    (reconcile.children.worker_pod_affinity), which test_exclusive_nodes_cluster.py tests
    with the scheduler alone.
    """
    pool = karpenter_pool(gpupools, f"two-{uuid.uuid4().hex[:6]}")
    karpenter.apply_node_pools(node_pools(pool, consolidate_after_s=0))
    node_pool = pool.spec.node_pool
    assert node_pool is not None
    possible = MAX_NODES * GPUS_PER_NODE
    wait_for(
        "possible capacity in the pool",
        lambda: pool_status(k8s_api, pool.name).get("gpusPossible") == possible,
        60,
    )
    jobs = ("first", "second")
    for job in jobs:
        submit(k8s_api, namespace, job, pool.name)
    explain = explainer(k8s_api, karpenter, namespace, jobs, node_pool)
    problems: list[str] = []

    def both_settled() -> dict[str, str] | None:
        problems.extend(booked_twice(k8s_api, namespace, jobs, possible))
        states = {job: settled(k8s_api, namespace, job) for job in jobs}
        done = {job: state for job, state in states.items() if state is not None}
        return done if len(done) == len(jobs) else None

    states = wait_for(
        "both jobs Running, or one Running and one waiting with a reason",
        both_settled,
        120,
        lambda: "\n".join([*problems, explain()]),
    )
    assert not problems, problems
    assert "Running" in states.values(), states
    for state in states.values():
        assert state in ("Running", "Unschedulable: NoCapacity"), states
    workers = live_workers(k8s_api, namespace, jobs)
    nodes = {n.metadata.name for n in nodes_of(k8s_api, node_pool)}
    assert {p.spec.node_name for p in workers} <= nodes
    assert pod_gpus(workers) <= possible
    # The jobs' workers share no GPU: per node, they take at most what it has (checked
    # above all along), and their GPUs add up to what the jobs' plans say.
    plans = [(get_job(k8s_api, namespace, job)["status"].get("plan") or {}) for job in jobs]
    running = [plan for job, plan in zip(jobs, plans, strict=True) if states[job] == "Running"]
    assert pod_gpus(workers) == sum(plan["gpus"] for plan in running)

    core = client.CoreV1Api(k8s_api)
    made: set[str] = set()

    def completed() -> bool:
        problems.extend(booked_twice(k8s_api, namespace, jobs, possible))
        finished = 0
        for job in jobs:
            if (get_job(k8s_api, namespace, job).get("status") or {}).get("phase") == "Succeeded":
                finished += 1
            elif settled(k8s_api, namespace, job) == "Running":
                # The trainer's last step done, it exits 0 (a job that waited runs once the
                # other's nodes are free, then completes the same way).
                for pod in pods_of(k8s_api, namespace, job):
                    made.add(pod.metadata.name)
                    if pod.status.phase == "Running":
                        core.patch_namespaced_pod_status(
                            pod.metadata.name, namespace, {"status": {"phase": "Succeeded"}}
                        )
        return finished == len(jobs)

    wait_for("both jobs Succeeded", completed, 120, lambda: "\n".join([*problems, explain()]))
    assert not problems, problems
    assert not live_workers(k8s_api, namespace, jobs)
    wait_for(
        "nothing reserved in the pool",
        lambda: pool_status(k8s_api, pool.name).get("gpusReserved", 0) == 0,
        30,
        lambda: str(pool_status(k8s_api, pool.name)),
    )
    wait_for(
        "Karpenter to remove the nodes of the finished jobs",
        lambda: not nodes_of(k8s_api, node_pool),
        90,
        explain,
    )
    # No worker made after the jobs finished (none restarted, none for a new plan).
    left = {p.metadata.name for job in jobs for p in pods_of(k8s_api, namespace, job)}
    assert left <= made, left - made
    assert all(get_job(k8s_api, namespace, job)["status"]["phase"] == "Succeeded" for job in jobs)


BACKOFF_S = 8  # the operator's scale-up backoff here: seconds, not GKE's minutes


def whole_plan_running(
    k8s_api: Any, namespace: str, job: str, gpupool: str
) -> Callable[[], list[Any] | None]:
    """A wait_for check: every worker of the job's current plan (as its status says: the
    generation and the number of workers) Running on `gpupool`."""
    on_pool = running_on(k8s_api, namespace, job, gpupool)

    def check() -> list[Any] | None:
        pods = on_pool()
        plan = (get_job(k8s_api, namespace, job).get("status") or {}).get("plan") or {}
        if not pods or len(pods) != plan.get("workers"):
            return None
        generations = {p.metadata.labels["sailplan.dev/plan-generation"] for p in pods}
        return pods if generations == {str(plan.get("generation"))} else None

    return check


@pytest.mark.parametrize("karpenter", [(MACHINE, [ZONE])], indirect=True)
@pytest.mark.parametrize(
    "operator",
    [
        (
            "--scale-up-backoff-seconds",
            str(BACKOFF_S),
            "--max-scale-up-backoff-seconds",
            str(BACKOFF_S),
        )
    ],
    indirect=True,
)
def test_a_stockout_moves_the_job_to_nodes_that_exist_and_the_larger_plan_wins_once_it_ends(
    k8s_api: Any,
    namespace: str,
    karpenter: Karpenter,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
) -> None:
    """The stockout is the A100 machine type's offering missing from Karpenter's instance
    types in the pool's zone, and it ends when Karpenter is restarted with the offering
    back. That is what a stockout is to an autoscaler: the cloud has no such machine in that
    zone for now, whatever the node pool's limits allow (GCE_STOCKOUT; an AWS Karpenter
    marks the offering unavailable for a while after an insufficient-capacity error). The
    kwok provider cannot mark an offering unavailable: it reads its instance-types file
    once, at start, and sets every offering in it Available; hence the file without the
    offering, and a restart to change it. A NodePool limit below the pool's maximum (the
    other way to deny nodes) stands for a quota instead, and Karpenter would say so at once
    rather than leave the pods waiting as a stockout does.

    Either way the operator sees what it would see on GKE: workers pinned to the zone that
    get no node. After provisioningTimeoutSeconds (60 s, the schema's minimum, most of this
    test's time) it backs the zone off for the operator's --scale-up-backoff-seconds, the
    job replans onto the V100s that exist, and when the backoff ends the A100 plan is
    offered again and has to win the replan decision: a voluntary switch (CapacityAdded)
    through a checkpoint, which this test answers as the trainer would, by exiting.
    """
    a100 = karpenter_pool(gpupools, f"stock-{uuid.uuid4().hex[:6]}", provisioningTimeoutSeconds=60)
    existing = gpupools("v100-spot")
    karpenter.apply_node_pools(node_pools(a100, consolidate_after_s=0))
    node_pool = a100.spec.node_pool
    assert node_pool is not None
    explain = explainer(k8s_api, karpenter, namespace, "stockout", node_pool)
    wait_for(
        "possible capacity in the A100 pool",
        lambda: pool_status(k8s_api, a100.name).get("gpusPossible") == MAX_NODES * GPUS_PER_NODE,
        60,
    )
    # A long job (eight A100s after a 30 s wait beat the four V100s that exist now) that
    # may switch again right after a switch.
    body = job_body(namespace, "stockout", [a100.name, existing], replan={"cooldownSeconds": 0})
    body["spec"]["training"]["steps"] = 1_000_000
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", body
    )

    def on_a100() -> list[Any] | None:
        pods = pods_of(k8s_api, namespace, "stockout")
        return [p for p in pods if p.metadata.labels["sailplan.dev/gpupool"] == a100.name] or None

    waiting = wait_for("workers pinned to the A100 pool", on_a100, 60, explain)
    assert all(p.spec.node_name is None for p in waiting)
    status = wait_for(
        "the zone backed off after the 60 s timeout",
        lambda: scale_up_backed_off(k8s_api, a100.name),
        100,
        explain,
    )
    (zone,) = status["zones"]
    assert (zone["zone"], zone["nodesPossible"]) == (ZONE, 0)
    assert zone["scaleUpBackoffSeconds"] == BACKOFF_S  # the operator's setting, not 300
    # Karpenter saw the pending workers and added nothing: no offering fits them.
    assert not nodes_of(k8s_api, node_pool) and not karpenter.node_claims()

    smaller = wait_for(
        "the job moved to the V100s that exist, Running",
        whole_plan_running(k8s_api, namespace, "stockout", existing),
        60,
        explain,
    )

    karpenter.restart(instance_types([ZONE]))  # the stockout is over
    asked: set[str] = set()
    core = client.CoreV1Api(k8s_api)

    def back_on_a100() -> list[Any] | None:
        pods = pods_of(k8s_api, namespace, "stockout")
        for pod in pods:
            # The trainer's part: a checkpoint asked for, written, and a clean exit.
            if (pod.metadata.annotations or {}).get(CHECKPOINT_REQUEST_ANNOTATION) and (
                pod.status.phase == "Running"
            ):
                asked.add(pod.metadata.name)
                core.patch_namespaced_pod_status(
                    pod.metadata.name, namespace, {"status": {"phase": "Succeeded"}}
                )
        return whole_plan_running(k8s_api, namespace, "stockout", a100.name)()

    bound = wait_for(
        "the job back on the A100 pool, on nodes Karpenter added", back_on_a100, 90, explain
    )
    assert pod_gpus(bound) > pod_gpus(smaller)
    assert {p.spec.node_name for p in bound} <= {
        n.metadata.name for n in nodes_of(k8s_api, node_pool)
    }
    assert {zone_of(p) for p in bound} == {ZONE}
    # The V100 workers were asked for a checkpoint first: a planned switch, not a loss.
    assert asked and asked <= {p.metadata.name for p in smaller}
    job = wait_phase(k8s_api, namespace, "stockout", {"Running"}, 30)
    history = job["status"]["history"]
    assert history[-1]["reason"].startswith("CapacityAdded"), history
    assert "predicted gain +" in history[-1]["reason"], history
    assert any(h["reason"].startswith("CapacityLost") for h in history[:-1]), history
