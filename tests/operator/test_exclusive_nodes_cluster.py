"""A node holds the workers of one TrainingJob, with the real kube-scheduler: the planner
counts whole free nodes per pool and zone, and the worker pods' affinity makes the
scheduler keep to that count (reconcile.children.worker_pod_affinity).

The children of three jobs are rendered by the operator's own code (desired_children) and
created through the API, with no operator running, so the plan shapes are exactly these:
on a pool of two 4-GPU nodes, job A's plan is three one-GPU workers (one node's worth) and
job B's one four-GPU worker (tensor-parallel 4, the other node). The scheduler packs A onto
one node and B binds on the other; without the affinity it spreads A's workers over both
nodes and B's worker stays Pending. A third job, C, of the same name as A in another
namespace, asks for one GPU: A's node has one free, but it stays Pending, since nodes are
not shared between jobs."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_builders import pool
from test_autoscaled_pools_cluster import ZONE, grown_pool
from test_operator_cluster import job_body
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.controller.observation import parse_job
from sailplan.operator.reconcile.children import desired_children
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan_dev.localcluster.nodes import node_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

JOB_UID = "sailplan.dev/job-uid"


def _plan(catalog: Catalog, gpupool: str, tensor_parallel: int, workers: int) -> Plan:
    """One stage of all of OPT-350M's layers, `workers` data-parallel replicas at
    `tensor_parallel` GPUs each, on `gpupool` in ZONE."""
    model = catalog.model("OPT-350M")
    replica = Replica(pool=f"{gpupool}/{ZONE}", gpu_type="A100-40", zone=ZONE)
    return Plan(
        model=model,
        global_batch_size=2 * workers,
        micro_batch_size=2,
        num_micro_batches=1,
        stages=(
            Stage(
                layer_start=0,
                layer_end=model.num_layers,
                tensor_parallel=tensor_parallel,
                replicas=(replica,) * workers,
            ),
        ),
    )


def _create_job(k8s_api: Any, namespace: str, name: str) -> TrainingJob:
    """A TrainingJob object (no operator runs: it only owns the children and gives its
    uid), parsed as the operator parses it."""
    body = job_body(namespace, name, None)
    # Four workers' CPU and memory fit a node's 8 CPUs and 32 GiB.
    body["spec"]["trainer"] |= {"cpu": "1", "memory": "4Gi"}
    created = client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", body
    )
    job = parse_job(namespace, name, created).job
    assert job is not None and job.uid
    return job


def _start(k8s_api: Any, job: TrainingJob, plan: Plan, gpupool: GPUPool) -> list[str]:
    """Create the job's children as the operator would; the worker pods' names."""
    core = client.CoreV1Api(k8s_api)
    children = desired_children(job, plan, 1, 0, {gpupool.name: gpupool})
    for body in children.in_creation_order():
        create = {
            "ConfigMap": core.create_namespaced_config_map,
            "Service": core.create_namespaced_service,
            "Pod": core.create_namespaced_pod,
        }[body["kind"]]
        create(job.namespace, body)
    return [p["metadata"]["name"] for p in children.pods]


def _nodes_of(k8s_api: Any, namespace: str, pods: list[str]) -> list[str] | None:
    """The pods' nodes once every one is bound."""
    core = client.CoreV1Api(k8s_api)
    nodes = [core.read_namespaced_pod(name, namespace).spec.node_name for name in pods]
    return nodes if all(nodes) else None


def _unschedulable(k8s_api: Any, namespace: str, name: str) -> str | None:
    """The scheduler's message once it found no node for the pod."""
    pod = client.CoreV1Api(k8s_api).read_namespaced_pod(name, namespace)
    for condition in pod.status.conditions or ():
        if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
            return str(condition.message)
    return None


def _jobs_per_node(k8s_api: Any, nodes: list[str]) -> dict[str, set[str]]:
    """Node -> the job uids of the workers bound there (every namespace)."""
    pods = client.CoreV1Api(k8s_api).list_pod_for_all_namespaces(
        label_selector="sailplan.dev/role=worker"
    )
    held: dict[str, set[str]] = {node: set() for node in nodes}
    for p in pods.items:
        if p.spec.node_name in held:
            held[p.spec.node_name].add(p.metadata.labels[JOB_UID])
    return held


def _release(k8s_api: Any, namespaces: tuple[str, ...], local_cluster: Any) -> None:
    """Delete the jobs (their children go with them) and wait for the pods to go while
    their nodes exist, then put the cluster's nodes back."""
    custom = client.CustomObjectsApi(k8s_api)
    core = client.CoreV1Api(k8s_api)
    for namespace in namespaces:
        for job in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs")[
            "items"
        ]:
            try:
                custom.delete_namespaced_custom_object(
                    GROUP, VERSION, namespace, "trainingjobs", job["metadata"]["name"]
                )
            except ApiException as error:
                if error.status != 404:
                    raise
    wait_for(
        "the test's pods gone",
        lambda: (
            not any(
                core.list_namespaced_pod(n, label_selector="sailplan.dev/job").items
                for n in namespaces
            )
        ),
        90,
    )
    local_cluster.reset_nodes()


def test_a_node_holds_one_jobs_workers_so_a_tensor_parallel_worker_finds_a_whole_node(
    *,
    k8s_api: Any,
    namespace: str,
    other_namespace: str,
    crds: None,
    local_cluster: Any,
    catalog: Catalog,
) -> None:
    node_pool = f"excl-{uuid.uuid4().hex[:6]}"
    nodes = local_cluster.add_nodes(
        [node_manifest(grown_pool(node_pool), ZONE, i) for i in range(2)]
    )
    # The GPUPool as the operator would see it (rendering needs only its spec).
    gpupool = pool("excl", node_pool, {ZONE: 2})
    try:
        job_a = _create_job(k8s_api, namespace, "a")
        job_b = _create_job(k8s_api, namespace, "b")
        job_c = _create_job(k8s_api, other_namespace, "a")
        assert len({job_a.uid, job_b.uid, job_c.uid}) == 3

        a_pods = _start(k8s_api, job_a, _plan(catalog, gpupool.name, 1, 3), gpupool)
        a_nodes = wait_for(
            "job A's three workers bound", lambda: _nodes_of(k8s_api, namespace, a_pods), 60
        )
        # Packed onto one node, as the plan counted, though the scheduler's default
        # scoring would spread them.
        assert len(set(a_nodes)) == 1, a_nodes
        (a_node,) = set(a_nodes)

        (b_pod,) = _start(k8s_api, job_b, _plan(catalog, gpupool.name, 4, 1), gpupool)
        b_nodes = wait_for(
            "job B's four-GPU worker bound",
            lambda: _nodes_of(k8s_api, namespace, [b_pod]),
            60,
            lambda: str(_unschedulable(k8s_api, namespace, b_pod)),
        )
        assert b_nodes == [n for n in nodes if n != a_node]

        # One GPU is free on A's node, but another job's worker is not let onto it.
        (c_pod,) = _start(k8s_api, job_c, _plan(catalog, gpupool.name, 1, 1), gpupool)
        message = wait_for(
            "job C's worker found unschedulable",
            lambda: _unschedulable(k8s_api, other_namespace, c_pod),
            60,
        )
        assert "anti-affinity" in message, message
        assert _nodes_of(k8s_api, other_namespace, [c_pod]) is None

        held = _jobs_per_node(k8s_api, nodes)
        assert held == {a_node: {job_a.uid}, b_nodes[0]: {job_b.uid}}, held
    finally:
        _release(k8s_api, (namespace, other_namespace), local_cluster)
