"""The node agent against the local API server, with --fake-nvml, under exactly the
ClusterRole of manifests/nodeagent/rbac.yaml.

An opted-in TrainingJob, its plan ConfigMap and its worker 0 as the operator renders them
(bound to an A100 node of the local cluster, where kwok runs it); the agent, a subprocess
with a ServiceAccount token, locks the worker's GPUs (its metrics say so) and, once the
pod is deleted, resets them and drops the series; SIGTERM ends it cleanly.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from operator_builders import JOB_SPEC
from operator_process import service_account_kubeconfig
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.nodeagent.assignment import OPT_IN_ANNOTATION
from sailplan.operator.nodeagent.clocks import plan_clocks
from sailplan.operator.reconcile.children import desired_children
from sailplan.planner.catalog import Catalog
from sailplan.planner.cli_sources import cluster_of, plan_context
from sailplan.planner.energy import plan_energy
from sailplan.planner.plan import Plan
from sailplan_dev.apply import apply

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _grant(api: Any, namespace: str) -> str:
    """manifests/nodeagent/rbac.yaml bound to a ServiceAccount of the test namespace."""
    name = f"sailplan-nodeagent-{namespace}"
    documents = list(yaml.safe_load_all((ROOT / "manifests/nodeagent/rbac.yaml").read_text()))
    for document in documents:
        document["metadata"]["name"] = name
        if document["kind"] == "ClusterRoleBinding":
            document["roleRef"]["name"] = name
            document["subjects"] = [
                {"kind": "ServiceAccount", "name": "nodeagent", "namespace": namespace}
            ]
    core = client.CoreV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "nodeagent"}})
    apply(api, documents)
    request = core.create_namespaced_service_account_token(
        "nodeagent", namespace, {"spec": {"expirationSeconds": 3600}}
    )
    token: str = request.status.token
    return token


def _revoke(api: Any, namespace: str) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    name = f"sailplan-nodeagent-{namespace}"
    for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
        try:
            delete(name)
        except client.exceptions.ApiException as error:
            if error.status != 404:
                raise


def _metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text: str = reply.read().decode()
            return text
    except OSError:
        return ""


# spec.energy.clocks, and the deprecated annotation it replaced
OPT_INS = {
    "spec": ({}, {"energy": {"clocks": "NoSlowdown"}}),
    "annotation": ({OPT_IN_ANNOTATION: "no-slowdown"}, {}),
}


@pytest.mark.parametrize("opt_in", sorted(OPT_INS))
def test_the_agent_locks_and_resets_a_workers_gpus_on_the_api_server(
    opt_in: str,
    *,
    kubeconfig: str,
    k8s_api: Any,
    namespace: str,
    crds: None,
    plan: Plan,
    pools: tuple[GPUPool, ...],
    catalog: Catalog,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(k8s_api)
    node = next(
        n.metadata.name
        for n in core.list_node(label_selector="cloud.google.com/gke-accelerator").items
        if "a100" in n.metadata.labels["cloud.google.com/gke-accelerator"]
    )
    job_body = client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "trainingjobs",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingJob",
            "metadata": {"name": "opt", "annotations": OPT_INS[opt_in][0]},
            "spec": JOB_SPEC | OPT_INS[opt_in][1],
        },
    )
    job = TrainingJob.model_validate(
        {
            "name": "opt",
            "namespace": namespace,
            "uid": job_body["metadata"]["uid"],
            "generation": 1,
            "spec": JOB_SPEC,
            "status": {},
        }
    )
    # the plan carries the one-clock-per-GPU clocks of a 1% slowdown, as the operator
    # stores them for a job with energy predictions: the agent must lock exactly those
    assert plan.predictions is not None
    context = plan_context(plan, cluster_of(plan, catalog), None, catalog)
    energy = plan_energy(plan, context, max_slowdown=0.01).prediction()
    plan = plan.model_copy(
        update={"predictions": plan.predictions.model_copy(update={"energy": energy})}
    )
    children = desired_children(job, plan, 1, 0, {p.name: p for p in pools})
    core.create_namespaced_config_map(namespace, children.configmap)
    worker = json.loads(json.dumps(children.pods[0]))  # stage 0, replica 0, TP 2
    worker["spec"]["nodeName"] = node  # bound directly: what the scheduler would do
    worker["spec"].pop("affinity", None)
    core.create_namespaced_pod(namespace, worker)
    pod_name = worker["metadata"]["name"]
    clocks = plan_clocks(plan, catalog)
    assert clocks.source == "plan"
    expected_mhz = clocks.mhz(0, 0)
    assert (
        expected_mhz == energy.stage_clocks[0].steady_mhz[0] == energy.stage_clocks[0].fill_mhz[0]
    )
    assert expected_mhz < 1410

    token = _grant(k8s_api, namespace)
    agent_kubeconfig = service_account_kubeconfig(kubeconfig, token, tmp_path / "agent.kubeconfig")
    port = _free_port()
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sailplan.operator.nodeagent",
                "--node-name",
                node,
                "--fake-nvml",
                "A100-40:4",
                "--kubeconfig",
                agent_kubeconfig,
                "--metrics-port",
                str(port),
                "--interval",
                "0.5",
                "--state-file",
                str(tmp_path / "locked.json"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        locked = f'sailplan_gpu_sm_clock_locked_mhz{{gpu="GPU-fake-{node}-0",namespace="{namespace}",stage="0",trainingjob="opt"}} {float(expected_mhz)}'
        wait_for(
            "the agent to lock the worker's GPUs",
            lambda: locked in _metrics(port),
            90,
            explain=lambda: log.read_text(errors="replace")[-3000:],
        )
        assert f'gpu="GPU-fake-{node}-1"' in _metrics(port)  # TP 2: both of its GPUs
        assert json.loads((tmp_path / "locked.json").read_text()) == {
            f"GPU-fake-{node}-0": expected_mhz,
            f"GPU-fake-{node}-1": expected_mhz,
        }
        core.delete_namespaced_pod(pod_name, namespace, grace_period_seconds=0)
        wait_for(
            "the agent to reset the GPUs of the deleted worker",
            lambda: "sailplan_gpu_sm_clock_locked_mhz{" not in _metrics(port),
            90,
            explain=lambda: log.read_text(errors="replace")[-3000:],
        )
        assert json.loads((tmp_path / "locked.json").read_text()) == {}
    finally:
        agent.terminate()
        code = agent.wait(timeout=30)
        _revoke(k8s_api, namespace)
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "Forbidden" not in text and "pass failed" not in text, text[-3000:]
    assert "clocks reset to the driver default" in text
