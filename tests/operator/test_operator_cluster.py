"""The operator against a real API server (tests/conftest.py fixtures): placement, API-server
validation, infeasible jobs, crash safety, garbage collection, GPUPool status.

The operator runs as a subprocess (`python -m sailplan.operator operator run`), exactly as
the Deployment runs it, serving only the test's namespace. Jobs are kept small (one or two
node pools, global batch 16) so the real planner answers in seconds.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from argocd_lua import health
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_process import (
    ClusterRbac,
    OperatorProcess,
    service_account_kubeconfig,
)
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.reconcile.trainingjob import observed_plan
from sailplan_dev.apply import apply, load_documents
from sailplan_dev.demo import for_fake_nodes

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"
JOB_LABEL = "sailplan.dev/job"


def job_body(namespace: str, name: str, pools: list[str] | None, **spec: Any) -> dict[str, Any]:
    """A small valid TrainingJob; `pools` None plans over every GPUPool."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "OPT-350M"},
            "training": {"globalBatchSize": 16, "steps": 10},
            **({"pools": {"names": pools}} if pools is not None else {}),
            "trainer": {"image": "sailplan-trainer:test"},
            "checkpoint": {"storage": {"uri": "gs://bucket/test"}},
            # kwok's nodes run no containers, so profiling Jobs there could measure nothing;
            # tests/e2e/test_profiling_jobs.py runs them on nodes that do.
            "profiling": {"mode": "Skip"},
        },
    }
    body["spec"].update(spec)
    return body


def get_job(k8s_api: Any, namespace: str, name: str) -> dict[str, Any]:
    job: dict[str, Any] = client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", name
    )
    return job


def wait_phase(
    k8s_api: Any, namespace: str, name: str, phases: set[str], timeout_s: float = 120
) -> dict[str, Any]:
    def settled() -> dict[str, Any] | None:
        job = get_job(k8s_api, namespace, name)
        return job if (job.get("status") or {}).get("phase") in phases else None

    def explain() -> str:
        status = get_job(k8s_api, namespace, name).get("status") or {}
        conditions = [
            f"  {c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
            for c in status.get("conditions", [])
        ]
        pods = [
            f"  {p.metadata.name} {p.status.phase} on {p.spec.node_name}"
            for p in pods_of(k8s_api, namespace, name)
        ]
        nodes = [
            f"  {n.metadata.name} unschedulable={bool(n.spec.unschedulable)} "
            f"taints={[t.key for t in n.spec.taints or ()]}"
            for n in client.CoreV1Api(k8s_api).list_node().items
        ]
        return "\n".join(
            [f"phase {status.get('phase')!r}", *conditions, "pods:", *pods, "nodes:", *nodes]
        )

    job: dict[str, Any] = wait_for(f"TrainingJob {name} in {phases}", settled, timeout_s, explain)
    return job


def job_events(k8s_api: Any, namespace: str, job: str) -> list[Any]:
    events: list[Any] = (
        client.CoreV1Api(k8s_api)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={job}")
        .items
    )
    return events


def pods_of(k8s_api: Any, namespace: str, job: str) -> list[Any]:
    pods: list[Any] = (
        client.CoreV1Api(k8s_api)
        .list_namespaced_pod(
            namespace, label_selector=f"{JOB_LABEL}={job},sailplan.dev/role=worker"
        )
        .items
    )
    return pods


def current_plan(k8s_api: Any, namespace: str, job: str) -> Any:
    maps = (
        client.CoreV1Api(k8s_api)
        .list_namespaced_config_map(
            namespace, label_selector=f"{JOB_LABEL}={job},sailplan.dev/role=plan"
        )
        .items
    )
    assert len(maps) == 1, [m.metadata.name for m in maps]
    observed = observed_plan(
        {
            "metadata": {"name": maps[0].metadata.name, "labels": maps[0].metadata.labels},
            "data": maps[0].data,
        }
    )
    assert observed is not None
    return observed.plan


def test_examples_place_pods_on_exactly_the_planned_pools_and_zones(
    k8s_api: Any, namespace: str, operator: OperatorProcess
) -> None:
    documents = for_fake_nodes(load_documents(EXAMPLES.glob("*.yaml")))
    for document in documents:
        # Namespaced examples go to the test's namespace; the GPUPools are cluster-scoped.
        if document["kind"] == "Namespace":
            continue
        if document["kind"] != "GPUPool":
            document["metadata"]["namespace"] = namespace
        for subject in document.get("subjects", []):
            subject["namespace"] = namespace
    apply(k8s_api, [d for d in documents if d["kind"] != "Namespace"])
    (job_doc,) = [d for d in documents if d["kind"] == "TrainingJob"]
    name = job_doc["metadata"]["name"]
    job = wait_phase(k8s_api, namespace, name, {"Running", "Unschedulable", "Invalid"}, 300)
    assert job["status"]["phase"] == "Running", job["status"]

    plan = current_plan(k8s_api, namespace, name)
    workers = {w.index: w for w in plan.workers()}
    pools = {
        p["metadata"]["name"]: p
        for p in client.CustomObjectsApi(k8s_api).list_cluster_custom_object(
            GROUP, VERSION, "gpupools"
        )["items"]
    }
    core = client.CoreV1Api(k8s_api)
    pods = pods_of(k8s_api, namespace, name)
    assert sorted(int(p.metadata.labels["sailplan.dev/worker-index"]) for p in pods) == sorted(
        workers
    )
    for pod in pods:
        worker = workers[int(pod.metadata.labels["sailplan.dev/worker-index"])]
        node = core.read_node(pod.spec.node_name)
        gpupool, zone = worker.pool.split("/")
        selects = (
            pools[gpupool]["spec"].get("nodePool")
            or pools[gpupool]["spec"]["selector"]["matchLabels"]["cloud.google.com/gke-nodepool"]
        )
        assert node.metadata.labels["cloud.google.com/gke-nodepool"] == selects, pod.metadata.name
        assert node.metadata.labels["topology.kubernetes.io/zone"] == zone == worker.zone
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == str(
            worker.tensor_parallel
        )
        assert pod.status.phase == "Running"
    assert job["status"]["plan"]["gpus"] == plan.world_size


def test_invalid_trainingjobs_are_rejected_by_the_api_server(
    k8s_api: Any, namespace: str, crds: None
) -> None:
    custom = client.CustomObjectsApi(k8s_api)

    def create(body: dict[str, Any]) -> str:
        with pytest.raises(ApiException) as error:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", body)
        assert error.value.status == 422
        return str(error.value.body)

    body = job_body(namespace, "bad", ["x"])
    body["spec"]["training"]["globalBatchSize"] = 0
    assert "spec.training.globalBatchSize" in create(body)

    body = job_body(
        namespace,
        "bad",
        ["x"],
        model={
            "name": "OPT-350M",
            "custom": {
                "name": "c",
                "hiddenSize": 64,
                "numBlocks": 2,
                "numHeads": 2,
                "vocabSize": 10,
                "sequenceLength": 8,
            },
        },
    )
    assert "set exactly one of name and custom" in create(body)

    shape = {
        "name": "c",
        "hiddenSize": 100,
        "numBlocks": 2,
        "numHeads": 3,
        "vocabSize": 10,
        "sequenceLength": 8,
    }
    body = job_body(namespace, "bad", ["x"], model={"custom": shape})
    assert "hiddenSize must be divisible by numHeads" in create(body)

    body = job_body(namespace, "x" * 41, ["x"])
    assert "at most 40 characters" in create(body)

    # The model is immutable once created.
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", job_body(namespace, "good", ["x"])
    )
    with pytest.raises(ApiException) as error:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "trainingjobs",
            "good",
            {"spec": {"model": {"name": "OPT-30B"}}},
        )
    assert error.value.status == 422 and "model is immutable" in str(error.value.body)


def wait_warning(k8s_api: Any, namespace: str, job: str, reason: str) -> None:
    """A Warning Event `reason` on the job; the operator posts Events right after its status
    write, so they may trail the phase a test waited for."""
    wait_for(
        f"a Warning Event {reason}",
        lambda: any(
            e.reason == reason and e.type == "Warning" for e in job_events(k8s_api, namespace, job)
        ),
        timeout_s=30,
    )


def test_infeasible_job_is_unschedulable_with_the_reason(
    k8s_api: Any, namespace: str, operator: OperatorProcess, gpupools: Callable[..., str]
) -> None:
    pool = gpupools("a100-ondemand")
    body = job_body(namespace, "greedy", [pool], objective={"minSamplesPerSecond": 1.0e9})
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", body
    )
    job = wait_phase(k8s_api, namespace, "greedy", {"Unschedulable", "Running", "Invalid"})
    conditions = {c["type"]: c for c in job["status"]["conditions"]}
    assert job["status"]["phase"] == "Unschedulable"
    assert conditions["Unschedulable"]["reason"] == "BelowThroughputFloor"
    assert conditions["Unschedulable"]["message"]
    # Argo CD's health of the object as the API server returns it.
    status, message = health(job)
    assert status == "Degraded" and message.startswith("BelowThroughputFloor: "), message
    assert not pods_of(k8s_api, namespace, "greedy")
    wait_warning(k8s_api, namespace, "greedy", "BelowThroughputFloor")


def test_a_profiling_job_without_a_result_fails_profiling_with_its_reason(
    k8s_api: Any, namespace: str, operator: OperatorProcess, gpupools: Callable[..., str]
) -> None:
    # kwok "completes" a Job's pods without running anything, so the operator finds no
    # result log: a real way for a profiling Job to give nothing usable.
    pool = gpupools("v100-spot")
    body = job_body(namespace, "noresult", [pool], profiling={"mode": "Required"})
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", body
    )

    def failed() -> dict[str, Any] | None:
        status = get_job(k8s_api, namespace, "noresult").get("status") or {}
        planned = {c["type"]: c for c in status.get("conditions", [])}.get("Planned", {})
        return status if planned.get("reason") == "ProfilingFailed" else None

    status = wait_for("Planned=False/ProfilingFailed", failed, 120)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Pending" and not status.get("plan")
    assert conditions["Profiling"]["reason"] == "ProfilingFailed"
    assert "ResultUnreadable" in conditions["Profiling"]["message"]
    assert "delete that Job to retry" in conditions["Planned"]["message"]
    assert not pods_of(k8s_api, namespace, "noresult")
    wait_warning(k8s_api, namespace, "noresult", "ProfilingFailed")


def test_unknown_model_is_invalid_with_the_valid_names(
    k8s_api: Any, namespace: str, operator: OperatorProcess
) -> None:
    body = job_body(namespace, "typo", ["x"], model={"name": "OPT-305M"})
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", body
    )
    job = wait_phase(k8s_api, namespace, "typo", {"Invalid"})
    invalid = next(c for c in job["status"]["conditions"] if c["type"] == "Invalid")
    assert invalid["reason"] == "UnknownModel" and "OPT-350M" in invalid["message"]
    status, message = health(job)
    assert status == "Degraded" and message.startswith("UnknownModel: "), message


def test_operator_killed_mid_reconcile_restarts_without_duplicates(
    k8s_api: Any, namespace: str, operator: OperatorProcess, gpupools: Callable[..., str]
) -> None:
    pool = gpupools("a100-ondemand")
    core = client.CoreV1Api(k8s_api)
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", job_body(namespace, "crash", [pool])
    )
    # SIGKILL the moment the plan ConfigMap exists: pods are being created, status unwritten.
    wait_for(
        "the plan ConfigMap",
        lambda: (
            core.list_namespaced_config_map(namespace, label_selector=f"{JOB_LABEL}=crash").items
        ),
        120,
    )
    operator.kill()
    before = {p.metadata.name for p in pods_of(k8s_api, namespace, "crash")}
    operator.start()
    job = wait_phase(k8s_api, namespace, "crash", {"Running"})
    plan = current_plan(k8s_api, namespace, "crash")  # still exactly one plan ConfigMap
    pods = pods_of(k8s_api, namespace, "crash")
    names = [p.metadata.name for p in pods]
    assert len(names) == len(set(names)) == len(plan.workers())
    assert before <= set(names)  # nothing created before the crash was replaced
    assert all(n.startswith("crash-g1-a0-w") for n in names)
    assert job["status"]["plan"]["generation"] == 1
    assert [h["generation"] for h in job["status"]["history"]] == [1]


def test_deleting_the_job_removes_its_children(
    k8s_api: Any, namespace: str, operator: OperatorProcess, gpupools: Callable[..., str]
) -> None:
    pool = gpupools("a100-ondemand")
    custom = client.CustomObjectsApi(k8s_api)
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", job_body(namespace, "gone", [pool])
    )
    wait_phase(k8s_api, namespace, "gone", {"Running"})
    core = client.CoreV1Api(k8s_api)
    assert core.read_namespaced_service("gone", namespace).spec.cluster_ip == "None"
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", "gone")

    def all_gone() -> bool:
        selector = f"{JOB_LABEL}=gone"
        return not (
            core.list_namespaced_pod(namespace, label_selector=selector).items
            or core.list_namespaced_config_map(namespace, label_selector=selector).items
            or core.list_namespaced_service(namespace, label_selector=selector).items
        )

    wait_for("the garbage collector to delete the job's children", all_gone, 90)


def test_gpus_held_by_a_finished_pod_are_free_again(
    k8s_api: Any, namespace: str, operator: OperatorProcess, gpupools: Callable[..., str]
) -> None:
    # A GPU held by an init container counts (as the scheduler counts it: a profiling pod's
    # GPU is its profiler's), and a pod that finished holds nothing any more.
    custom = client.CustomObjectsApi(k8s_api)
    core = client.CoreV1Api(k8s_api)
    pool = gpupools("v100-spot")

    def in_use() -> int:
        status = custom.get_cluster_custom_object(GROUP, VERSION, "gpupools", pool).get("status")
        return int((status or {}).get("gpusInUse", -1))

    wait_for("pool status", lambda: in_use() == 0, 90)
    gpu = {"limits": {"nvidia.com/gpu": "2"}}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "holds-gpus", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"cloud.google.com/gke-nodepool": "v100-spot"},
            "tolerations": [{"operator": "Exists"}],
            "initContainers": [{"name": "init", "image": "x", "resources": gpu}],
            "containers": [{"name": "main", "image": "x"}],
        },
    }
    core.create_namespaced_pod(namespace, body)
    wait_for("the init container's GPUs counted", lambda: in_use() == 2, 60)
    # What the kubelet writes when the containers exit 0 (kwok leaves such a pod Running).
    core.patch_namespaced_pod_status("holds-gpus", namespace, {"status": {"phase": "Succeeded"}})
    wait_for("the finished pod's GPUs released", lambda: in_use() == 0, 60)


def test_gpupool_status_follows_node_cordon_deletion_addition_and_notready(
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
    local_cluster: Any,
) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    pool = gpupools("v100-spot")

    def status() -> dict[str, Any]:
        found: dict[str, Any] = (
            custom.get_cluster_custom_object(GROUP, VERSION, "gpupools", pool).get("status") or {}
        )
        return found

    nodes = sorted(local_cluster.node_names("cloud.google.com/gke-nodepool=v100-spot"))
    assert len(nodes) == 2
    try:
        first = wait_for(
            "pool status",
            lambda: status() if status().get("nodesReady") == 2 else None,
            90,
        )
        assert (first["gpuType"], first["spot"], first["gpusAllocatable"]) == ("V100-16", True, 4)
        local_cluster.cordon(nodes[0])
        cordoned = wait_for(
            "cordon seen",
            lambda: status() if status().get("nodesReady") == 1 else None,
            90,
        )
        assert cordoned["nodesTotal"] == 2
        local_cluster.delete_node(nodes[1])
        wait_for("deletion seen", lambda: status().get("nodesTotal") == 1, 90)
        ready = next(c for c in status()["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "NoReadyNodes")
        # The pool scales up in another zone: a new zone entry appears.
        local_cluster.add_node("v100-spot", "us-central1-a")
        grown = wait_for(
            "node addition seen",
            lambda: status() if status().get("nodesReady") == 1 else None,
            90,
        )
        zones = {z["zone"]: z for z in grown["zones"]}
        assert zones["us-central1-a"]["nodesReady"] == 1
        assert zones["us-central1-a"]["gpusPerNode"] == 2
        # Its kubelet stops answering: NotReady counts as not ready.
        added = next(
            n
            for n in local_cluster.node_names("cloud.google.com/gke-nodepool=v100-spot")
            if n not in nodes
        )
        local_cluster.set_node_ready(added, False)
        wait_for("NotReady seen", lambda: status().get("nodesReady") == 0, 90)
    finally:
        local_cluster.reset_nodes()


def _kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    from sailplan_dev.localcluster import build

    binary = build.bin_dir() / "kubectl"
    if not binary.exists():
        pytest.skip(f"the built kubectl is missing ({binary}): run `sailplan cluster build`")
    return subprocess.run(
        [str(binary), "--kubeconfig", kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_finished_job_is_complete_for_kubectl_wait_and_prints_rounded_numbers(
    kubeconfig: str,
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
) -> None:
    pool = gpupools("a100-ondemand")
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", job_body(namespace, "done", [pool])
    )
    running = wait_phase(k8s_api, namespace, "done", {"Running"})
    # Argo CD's health of the objects as the API server returns them, at each state.
    assert health(running) == ("Healthy", "training")
    gpupool = client.CustomObjectsApi(k8s_api).get_cluster_custom_object(
        GROUP, VERSION, "gpupools", pool
    )
    assert health(gpupool)[0] == "Healthy", gpupool.get("status")
    waiting = _kubectl(
        kubeconfig, "wait", "-n", namespace, "--for=condition=Complete", "tj/done", "--timeout=1s"
    )
    assert waiting.returncode != 0, waiting.stdout  # not before the workers finish
    core = client.CoreV1Api(k8s_api)
    for pod in pods_of(k8s_api, namespace, "done"):
        # What the kubelet writes when the trainer exits 0 (kwok leaves such a pod Running).
        core.patch_namespaced_pod_status(
            pod.metadata.name, namespace, {"status": {"phase": "Succeeded"}}
        )
    done = _kubectl(
        kubeconfig, "wait", "-n", namespace, "--for=condition=Complete", "tj/done", "--timeout=90s"
    )
    assert done.returncode == 0, done.stderr
    finished = get_job(k8s_api, namespace, "done")
    assert finished["status"]["phase"] == "Succeeded"
    assert health(finished) == ("Healthy", "training complete")
    wide = _kubectl(kubeconfig, "get", "-n", namespace, "tj", "done", "-o", "wide")
    assert wide.returncode == 0, wide.stderr
    header, row = wide.stdout.splitlines()
    # Columns are aligned under their headers; an unset value prints as blank.
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    columns = {
        header[a:b].strip(): row[a:b].strip()
        for a, b in zip(starts, [*starts[1:], None], strict=True)
    }
    assert columns["PHASE"] == "Succeeded"
    for name in ("PREDICTED", "USD/H"):
        # At most 3 significant digits, as the operator wrote it.
        digits = columns[name].replace(".", "").strip("0")
        assert columns[name] and len(digits) <= 3, columns


def test_kustomize_base_and_examples_apply_with_kubectl(
    kubeconfig: str, k8s_api: Any, crds: None
) -> None:
    installed = _kubectl(
        kubeconfig, "apply", "--server-side", "--force-conflicts", "-k", str(ROOT / "manifests")
    )
    assert installed.returncode == 0, installed.stderr
    for kind in (
        "customresourcedefinition.apiextensions.k8s.io/trainingjobs.sailplan.dev",
        "clusterrole.rbac.authorization.k8s.io/sailplan-operator",
        "deployment.apps/sailplan-operator",
    ):
        assert kind in installed.stdout
    gke = _kubectl(kubeconfig, "kustomize", str(ROOT / "manifests" / "overlays" / "gke"))
    assert gke.returncode == 0, gke.stderr
    assert "us-docker.pkg.dev/PROJECT_ID/sailplan/operator:0.1.0" in gke.stdout
    # The examples validate against the served CRDs (server-side dry run: nothing is kept
    # but their namespace, which a dry run could not create for the objects inside it).
    namespace = _kubectl(kubeconfig, "apply", "-f", str(EXAMPLES / "00-namespace.yaml"))
    assert namespace.returncode == 0, namespace.stderr
    examples = _kubectl(
        kubeconfig, "apply", "--server-side", "--dry-run=server", "-f", str(EXAMPLES)
    )
    assert examples.returncode == 0, examples.stderr
    assert (
        "gpupool.sailplan.dev/a100-ondemand serverside-applied (server dry run)" in examples.stdout
    )
    assert (
        "trainingjob.sailplan.dev/opt-350m serverside-applied (server dry run)" in examples.stdout
    )


def test_operator_runs_with_exactly_the_manifest_rbac(
    kubeconfig: str,
    k8s_api: Any,
    namespace: str,
    gpupools: Callable[..., str],
    tmp_path: Path,
) -> None:
    """The ClusterRole in manifests/base/rbac.yaml is enough (and is what the operator gets)."""
    rbac = ClusterRbac(k8s_api, namespace)
    try:
        token = rbac.grant()
        limited = service_account_kubeconfig(kubeconfig, token, tmp_path / "operator.kubeconfig")
        pool = gpupools("a100-ondemand")
        operator = OperatorProcess(limited, namespace, tmp_path / "operator.log")
        operator.start()
        try:
            client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
                GROUP, VERSION, namespace, "trainingjobs", job_body(namespace, "rbac", [pool])
            )
            job = wait_phase(
                k8s_api, namespace, "rbac", {"Running", "Invalid", "Unschedulable"}, 180
            )
            assert job["status"]["phase"] == "Running", job["status"]
            pool_status = client.CustomObjectsApi(k8s_api).get_cluster_custom_object(
                GROUP, VERSION, "gpupools", pool
            )["status"]
            assert pool_status["gpuType"] == "A100-40"
            wait_for(
                "Events Planned and PodsCreated",
                lambda: (
                    {"Planned", "PodsCreated"}
                    <= {e.reason for e in job_events(k8s_api, namespace, "rbac")}
                ),
                30,
                lambda: operator.log.read_text()[-3000:],
            )
            log = operator.log.read_text()
            assert "Forbidden" not in log, log[-2000:]
        finally:
            operator.stop()
            client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(
                GROUP, VERSION, namespace, "trainingjobs", "rbac"
            )
    finally:
        rbac.revoke()
