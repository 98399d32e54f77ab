"""`sailplan demo`: the quickstart, end to end, on whatever cluster the kubeconfig names.

Installs the CRDs, starts the operator as a subprocess, applies manifests/examples/, waits
until the TrainingJob runs (or says why it cannot), and prints the plan and where each
worker pod landed as tables. Meant for `sailplan cluster up && sailplan demo`: kwok marks
the bound pods Running, so the whole path from TrainingJob to placed pods is real except
the GPUs. With `--preempt` (local cluster only) it then preempts the node of worker 0 the
way GKE preempts a spot VM and shows the replanning loop: the history entry, the new plan
generation and where its pods landed (`sailplan cluster up` puts the node back).
With `--autoscale` (local cluster only) the job plans on a GPUPool at zero nodes instead:
the real Karpenter (kwok provider, sailplan_dev.localcluster.karpenter) stands in for GKE's
autoscaler, adds nodes for the pending workers, and the demo shows the pool's possible
capacity, each node as it appears and the pods landing on them; it removes the job, the
pool and Karpenter's nodes when it ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.table import Table
from urllib3.exceptions import HTTPError

from sailplan.operator.api import crd
from sailplan.operator.kube import Kube
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.trainingjob import observed_plan
from sailplan.planner.plan import Plan
from sailplan_dev.apply import apply, load_documents

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
DEMO_NAMESPACE = "sailplan-demo"
DEMO_JOB = "opt-350m"
_SETTLED = ("Running", "Unschedulable", "Invalid", "Failed", "Succeeded")
# --autoscale: a GPUPool of a2-highgpu-4g nodes (4 A100s) at zero nodes in two zones.
AUTOSCALED_POOL = "a100-autoscaled"
AUTOSCALED_ZONES = ("us-central1-a", "us-central1-b")


def autoscaled_pool() -> dict[str, Any]:
    return {
        "apiVersion": "sailplan.dev/v1beta1",
        "kind": "GPUPool",
        "metadata": {"name": AUTOSCALED_POOL},
        "spec": {
            "nodePool": AUTOSCALED_POOL,
            "autoscaling": {
                "zones": list(AUTOSCALED_ZONES),
                "machineType": "a2-highgpu-4g",
                "maxNodesPerZone": 2,
                # What Karpenter with kwok takes (seconds), not a cloud VM's boot.
                "provisioningSeconds": 30,
            },
        },
    }


def on_autoscaled_pool(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The examples with the TrainingJob planning on the autoscaled pool only."""
    for document in documents:
        if document.get("kind") == "TrainingJob":
            document.setdefault("spec", {})["pools"] = {"names": [AUTOSCALED_POOL]}
    return documents


class DemoError(RuntimeError):
    """Something the user can fix (no cluster, no examples); one line."""


def for_fake_nodes(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The examples with profiling off: kwok's nodes run no containers, so a profiling Job
    there would "succeed" without measuring anything (tests/e2e/test_profiling_jobs.py runs
    profiling on nodes whose pods really run)."""
    for document in documents:
        if document.get("kind") == "TrainingJob":
            document.setdefault("spec", {})["profiling"] = {"mode": "Skip"}
    return documents


def _kubeconfig(explicit: Path | None) -> Path:
    if explicit is not None:
        if not explicit.exists():
            raise DemoError(f"no kubeconfig at {explicit}")
        return explicit
    try:
        from sailplan_dev.localcluster import kwokctl
        from sailplan_dev.localcluster.cluster import DEFAULT_NAME

        local = kwokctl.kubeconfig_path(DEFAULT_NAME)
        if local.exists():
            return local
    except ImportError:
        pass
    env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    if env and Path(env).exists():
        return Path(env)
    raise DemoError("no cluster: run `sailplan cluster up` first, or pass --kubeconfig")


def _wait_crds(api: client.ApiClient, timeout_s: float) -> None:
    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + timeout_s
    for definition in crd.all_crds():
        name = definition["metadata"]["name"]
        while True:
            status = ext.read_custom_resource_definition(name).status
            conditions = (status.conditions if status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise DemoError(f"CRD {name} was not established in {timeout_s:.0f}s")
            time.sleep(0.2)


def _start_operator(kubeconfig: Path, log_path: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "sailplan.operator",
        "operator",
        "run",
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        DEMO_NAMESPACE,
        "--profile-namespace",
        DEMO_NAMESPACE,
        "--metrics-port",
        "0",
        "--health-port",
        "0",
    ]
    with log_path.open("wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def _wait_settled(
    api: client.ApiClient, timeout_s: float, operator: subprocess.Popen[bytes], log: Path
) -> dict[str, Any]:
    kube = Kube(api)
    deadline = time.monotonic() + timeout_s
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if operator.poll() is not None:
            raise DemoError(f"the operator exited with code {operator.returncode}; see {log}")
        job = kube.get_job(DEMO_NAMESPACE, DEMO_JOB) or {}
        if (job.get("status") or {}).get("phase") in _SETTLED:
            return job
        time.sleep(0.5)
    phase = (job.get("status") or {}).get("phase", "no status")
    raise DemoError(f"TrainingJob {DEMO_JOB} did not settle in {timeout_s:.0f}s (phase {phase})")


def plan_table(plan: Plan) -> Table:
    table = Table(title="Plan: pipeline stages and their data-parallel replicas")
    for column in ("stage", "layers", "TP", "replica", "GPU", "pool", "zone"):
        table.add_column(column)
    for index, stage in enumerate(plan.stages):
        for replica_index, replica in enumerate(stage.replicas):
            first = replica_index == 0
            pool, _ = naming.split_pool_key(replica.pool)
            table.add_row(
                str(index) if first else "",
                f"[{stage.layer_start}, {stage.layer_end})" if first else "",
                str(stage.tensor_parallel) if first else "",
                str(replica_index),
                replica.gpu_type,
                pool,
                replica.zone,
            )
    return table


def pods_table(pods: list[dict[str, Any]], nodes: dict[str, dict[str, str]]) -> Table:
    table = Table(title="Worker pods as the scheduler placed them")
    for column in ("pod", "stage", "GPUs", "GPUPool", "node", "node pool", "node zone", "phase"):
        table.add_column(column)

    def index(pod: dict[str, Any]) -> int:
        return int(pod["metadata"]["labels"].get(naming.LABEL_WORKER, 0))

    for pod in sorted(pods, key=index):
        labels = pod["metadata"]["labels"]
        node = (pod.get("spec") or {}).get("nodeName") or ""
        node_labels = nodes.get(node, {})
        gpus = pod["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", "")
        table.add_row(
            pod["metadata"]["name"],
            labels.get(naming.LABEL_STAGE, ""),
            str(gpus),
            labels.get(naming.LABEL_GPUPOOL, ""),
            node or "(unscheduled)",
            node_labels.get("cloud.google.com/gke-nodepool", ""),
            node_labels.get("topology.kubernetes.io/zone", ""),
            (pod.get("status") or {}).get("phase", ""),
        )
    return table


def run_demo(
    *,
    kubeconfig: Path | None,
    timeout_s: float,
    keep_operator: bool,
    preempt: bool = False,
    autoscale: bool = False,
) -> None:
    # Piped output gets a wide fixed width instead of rich's 80 columns: the tables are the point.
    console = Console(width=None if sys.stdout.isatty() else 150)
    path = _kubeconfig(kubeconfig)
    if not EXAMPLES.is_dir():
        raise DemoError(f"examples not found at {EXAMPLES}: run the demo from a source checkout")
    api = config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
    try:
        client.VersionApi(api).get_code()
    except (ApiException, HTTPError, OSError) as error:
        raise DemoError(f"the API server in {path} does not answer: {error}") from error

    console.print(f"[bold]cluster[/bold] {path}")
    console.print("installing CRDs: " + ", ".join(apply(api, crd.all_crds())))
    _wait_crds(api, 30)

    log_path = Path(tempfile.gettempdir()) / "sailplan-demo-operator.log"
    operator = _start_operator(path, log_path)
    console.print(f"operator started (pid {operator.pid}, log {log_path})")
    karpenter = None
    try:
        documents = for_fake_nodes(load_documents(EXAMPLES.glob("*.yaml")))
        if autoscale:
            karpenter = _start_autoscaler(console, api, path, log_path.parent)
            documents = on_autoscaled_pool(documents)
        applied = apply(api, documents)
        console.print("applied examples: " + ", ".join(applied))
        started = time.monotonic()
        if karpenter is not None:
            job = _watch_scale_up(console, api, timeout_s, operator, log_path)
        else:
            job = _wait_settled(api, timeout_s, operator, log_path)
        elapsed = time.monotonic() - started
        _report(console, api, job, elapsed)
        if preempt:
            _preempt(
                console,
                api,
                path,
                job=job,
                timeout_s=timeout_s,
                operator=operator,
                log=log_path,
            )
        if keep_operator:
            console.print("operator keeps running; Ctrl-C stops it")
            operator.wait()
    finally:
        if karpenter is not None:
            _stop_autoscaler(console, api, karpenter)
        if operator.poll() is None:
            operator.terminate()
            try:
                operator.wait(timeout=15)
            except subprocess.TimeoutExpired:
                operator.kill()


def _report(console: Console, api: client.ApiClient, job: dict[str, Any], elapsed: float) -> None:
    status = job.get("status") or {}
    phase = status.get("phase")
    console.print(
        f"TrainingJob {DEMO_NAMESPACE}/{DEMO_JOB}: [bold]{phase}[/bold] after {elapsed:.1f}s"
    )
    for condition in status.get("conditions") or ():
        if condition.get("status") == "True":
            console.print(
                f"  {condition['type']}: {condition.get('reason')} {condition.get('message', '')}"
            )
    if phase != "Running":
        return
    kube = Kube(api)
    pods, plans, _ = kube.list_job_children(DEMO_NAMESPACE, DEMO_JOB)
    summary = status.get("plan") or {}
    generation = summary.get("generation")
    current = next(
        p for p in (observed_plan(cm) for cm in plans) if p and p.generation == generation
    )
    console.print(plan_table(current.plan))
    mine = [
        p for p in pods if p["metadata"]["labels"].get(naming.LABEL_GENERATION) == str(generation)
    ]
    console.print(pods_table(mine, kube.node_labels()))
    console.print(f"plan generation {summary.get('generation')}: {summary.get('summary')}")
    console.print(f"inspect: kubectl get trainingjobs,pods -n {DEMO_NAMESPACE} -o wide")


def _preempt(
    console: Console,
    api: client.ApiClient,
    kubeconfig: Path,
    *,
    job: dict[str, Any],
    timeout_s: float,
    operator: subprocess.Popen[bytes],
    log: Path,
) -> None:
    """Preempt a spot node of the plan and show the operator replanning onto what remains.

    The node is that of the lowest-ranked worker on a spot node: GKE preempts spot VMs only,
    and an on-demand pool that autoscales would be planned to get its node back (the
    planner counts the replacement a real autoscaler brings, which the local cluster lacks).
    Worker 0's node when no worker runs on spot.
    """
    from sailplan.operator.api.gpupool import SPOT_LABEL
    from sailplan_dev.localcluster.cluster import LocalCluster

    status = job.get("status") or {}
    if status.get("phase") != "Running":
        raise DemoError("--preempt needs the job Running first")
    generation = (status.get("plan") or {}).get("generation")
    kube = Kube(api)
    pods, _, _ = kube.list_job_children(DEMO_NAMESPACE, DEMO_JOB)
    workers = sorted(
        (
            p
            for p in pods
            if p["metadata"]["labels"].get(naming.LABEL_GENERATION) == str(generation)
            and p["spec"].get("nodeName")
        ),
        key=lambda p: int(p["metadata"]["labels"].get(naming.LABEL_WORKER, "0")),
    )
    if not workers:
        raise DemoError("--preempt needs the plan's workers on nodes first")
    labels = kube.node_labels()
    on_spot = [
        w for w in workers if labels.get(w["spec"]["nodeName"], {}).get(SPOT_LABEL) == "true"
    ]
    victim = (on_spot or workers)[0]
    node = victim["spec"]["nodeName"]
    rank = victim["metadata"]["labels"].get(naming.LABEL_WORKER)
    kind = "a spot node" if on_spot else "no worker is on spot; an on-demand node"
    console.print(
        f"\n[bold]preempting[/bold] node {node} (worker {rank}'s, {kind}), as GKE preempts a spot VM"
    )
    LocalCluster.attach(kubeconfig).preempt_node(node)
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        if operator.poll() is not None:
            raise DemoError(f"the operator exited with code {operator.returncode}; see {log}")
        job = kube.get_job(DEMO_NAMESPACE, DEMO_JOB) or {}
        status = job.get("status") or {}
        moved = (status.get("plan") or {}).get("generation") != generation
        if moved and status.get("phase") in _SETTLED:
            break
        if time.monotonic() > deadline:
            raise DemoError(f"no new plan within {timeout_s:.0f}s (phase {status.get('phase')})")
        time.sleep(0.25)
    history = (status.get("history") or [{}])[-1]
    console.print(f"replanned: {history.get('reason', '')}")
    _report(console, api, job, time.monotonic() - started)


def _start_autoscaler(
    console: Console, api: client.ApiClient, kubeconfig: Path, workdir: Path
) -> Any:
    """The autoscaled GPUPool and Karpenter's NodePools for it, Karpenter running."""
    from sailplan.operator.api.gpupool import GPUPool
    from sailplan_dev.localcluster.karpenter import Karpenter, KarpenterError
    from sailplan_dev.localcluster.karpenter_shapes import instance_types, node_pools

    manifest = autoscaled_pool()
    console.print("GPUPool: " + ", ".join(apply(api, [manifest])))
    karpenter = Karpenter(kubeconfig, api, workdir / "sailplan-demo-karpenter")
    try:
        karpenter.start(instance_types(list(AUTOSCALED_ZONES)))
    except KarpenterError as error:
        raise DemoError(f"Karpenter did not start: {error} (see {karpenter.log})") from error
    pool = GPUPool.model_validate({"name": AUTOSCALED_POOL, "spec": manifest["spec"]})
    karpenter.apply_node_pools(node_pools(pool, consolidate_after_s=0))
    console.print(f"Karpenter (kwok provider) started; log {karpenter.log}")
    custom: Any = client.CustomObjectsApi(api)
    deadline = time.monotonic() + 60
    status: dict[str, Any] = {}
    while time.monotonic() < deadline and not status.get("gpusPossible"):
        time.sleep(0.5)
        found = custom.get_cluster_custom_object(
            "sailplan.dev", "v1beta1", "gpupools", AUTOSCALED_POOL
        )
        status = found.get("status") or {}
    console.print(
        f"GPUPool {AUTOSCALED_POOL}: {status.get('nodesTotal', 0)} nodes, "
        f"{status.get('gpusPossible', 0)} GPUs possible ({status.get('gpuType')}, "
        f"zones {', '.join(AUTOSCALED_ZONES)})"
    )
    return karpenter


def _watch_scale_up(
    console: Console,
    api: client.ApiClient,
    timeout_s: float,
    operator: subprocess.Popen[bytes],
    log: Path,
) -> dict[str, Any]:
    """Wait for the job to settle, printing each node of the pool as it appears."""
    core: Any = client.CoreV1Api(api)
    kube = Kube(api)
    started = time.monotonic()
    seen: set[str] = set()
    job: dict[str, Any] = {}
    while time.monotonic() - started < timeout_s:
        if operator.poll() is not None:
            raise DemoError(f"the operator exited with code {operator.returncode}; see {log}")
        selector = f"cloud.google.com/gke-nodepool={AUTOSCALED_POOL}"
        for node in core.list_node(label_selector=selector).items:
            if node.metadata.name not in seen:
                seen.add(node.metadata.name)
                zone = (node.metadata.labels or {}).get("topology.kubernetes.io/zone", "?")
                console.print(
                    f"  {time.monotonic() - started:5.1f}s node {node.metadata.name} "
                    f"appeared in {zone}"
                )
        job = kube.get_job(DEMO_NAMESPACE, DEMO_JOB) or {}
        if (job.get("status") or {}).get("phase") in _SETTLED:
            return job
        time.sleep(0.5)
    phase = (job.get("status") or {}).get("phase", "no status")
    raise DemoError(f"TrainingJob {DEMO_JOB} did not settle in {timeout_s:.0f}s (phase {phase})")


def _stop_autoscaler(console: Console, api: client.ApiClient, karpenter: Any) -> None:
    """The job and the pool go first (nothing pins a node), then Karpenter's nodes."""
    custom = client.CustomObjectsApi(api)
    for call, args in (
        (
            custom.delete_namespaced_custom_object,
            ("sailplan.dev", "v1beta1", DEMO_NAMESPACE, "trainingjobs", DEMO_JOB),
        ),
        (
            custom.delete_cluster_custom_object,
            ("sailplan.dev", "v1beta1", "gpupools", AUTOSCALED_POOL),
        ),
    ):
        try:
            call(*args)
        except ApiException as error:
            if error.status != 404:
                raise
    karpenter.stop()
    console.print("removed the demo job, its GPUPool and Karpenter's nodes")
