"""Profiling Jobs end to end: a TrainingJob whose pools have no measured profiles gets them
measured by batch/v1 Jobs, stored, and planned with; a second job reuses them.

Everything is the real system but the GPUs: the operator (as a subprocess, with exactly the
ClusterRole of manifests/base/rbac.yaml), the API server, the Job controller and the
scheduler of the local cluster; the pod runner plays the kubelet of two one-GPU "A100" nodes
and runs the profiling pods' containers (`sailplan-profile` on the CPU, then the report
container) as local processes; the operator reads the report log through the API server's
pods/log, exactly as on GKE.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_process import ClusterRbac, OperatorProcess, service_account_kubeconfig
from replan_harness import CUSTOM
from runner_harness import add_runner_node, events_of, log_of, worker_log_tails
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.profilestore import parse_profile_configmaps
from sailplan.operator.profiling.jobs import LABEL_NEED, LABEL_RANK, ROLE_PROFILER
from sailplan.operator.profiling.needs import key_id
from sailplan.operator.profiling.results import SOURCE_ANNOTATION
from sailplan.operator.reconcile import naming
from sailplan_dev.localcluster.podrunner import PodRunner

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.slow]

ZONE = "us-central1-a"
GLOBAL_BATCH = 4  # micro-batch grid 1, 2, 4: what the compute Job must measure


class Setup:
    """Two one-GPU runner nodes in one GPUPool and the operator with the manifest RBAC."""

    def __init__(self, api: Any, namespace: str, runner: PodRunner, operator: OperatorProcess):
        self.api = api
        self.namespace = namespace
        self.runner = runner
        self.operator = operator
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.gpupool = ""
        self.node_pool = ""

    def create_job(self, name: str, mode: str = "Required", **spec: Any) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "model": {"custom": CUSTOM},
                "training": {"globalBatchSize": GLOBAL_BATCH, "steps": 1000, "seed": 7},
                "pools": {"names": [self.gpupool]},
                "trainer": {"image": "sailplan-trainer:local", "cpu": "1", "memory": "1Gi"},
                "checkpoint": {
                    "storage": {"persistentVolumeClaim": {"claimName": "ckpt"}},
                    "intervalSteps": 100,
                },
                "profiling": {"mode": mode},
            }
            | spec,
        }
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "trainingjobs", body
        )

    def status(self, name: str) -> dict[str, Any]:
        job = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "trainingjobs", name
        )
        found: dict[str, Any] = job.get("status") or {}
        return found

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        found = [c for c in self.status(name).get("conditions", []) if c["type"] == type_]
        return found[0] if found else {}

    def ready_nodes(self) -> int:
        pool = self.custom.get_cluster_custom_object(GROUP, VERSION, "gpupools", self.gpupool)
        return sum(z.get("nodesReady", 0) for z in (pool.get("status") or {}).get("zones", []))

    def planned(self, name: str) -> dict[str, Any] | None:
        status = self.status(name)
        return status if status.get("plan") else None

    def profiling_jobs(self, name: str) -> list[Any]:
        selector = f"{naming.LABEL_JOB}={name},{naming.LABEL_ROLE}={ROLE_PROFILER}"
        items: list[Any] = self.batch.list_namespaced_job(
            self.namespace, label_selector=selector
        ).items
        return items

    def events(self, name: str) -> list[str]:
        return [
            e.reason
            for e in self.core.list_namespaced_event(self.namespace).items
            if e.involved_object.name == name and e.involved_object.kind == "TrainingJob"
        ]

    def store(self) -> list[Any]:
        items: list[Any] = self.core.list_namespaced_config_map(
            self.namespace, label_selector=naming.LABEL_PROFILE
        ).items
        return items

    def explain(self) -> str:
        pool = self.custom.get_cluster_custom_object(GROUP, VERSION, "gpupools", self.gpupool)
        parts = [f"job statuses: {[self.status(n) for n in self.jobs()]}"]
        parts.append(f"GPUPool status: {pool.get('status')}")
        parts += worker_log_tails(self.runner, self.namespace)
        parts += ["operator log:", *self.operator.log_tail(60)]
        return "\n".join(parts)

    def jobs(self) -> list[str]:
        listed = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "trainingjobs"
        )
        return [j["metadata"]["name"] for j in listed["items"]]


@pytest.fixture
def setup(
    *,
    k8s_api: Any,
    kubeconfig: str,
    namespace: str,
    runner: PodRunner,
    gpupools: Callable[..., str],
    tmp_path: Path,
) -> Iterator[Setup]:
    node_pool = f"prof-np-{uuid.uuid4().hex[:6]}"
    for index in (0, 1):
        add_runner_node(runner, node_pool, "nvidia-tesla-a100", ZONE, index=index)
    runner.provision_claim(namespace, "ckpt")
    gpupool = gpupools(node_pool, gpuType="A100-40")
    rbac = ClusterRbac(k8s_api, namespace)
    limited = service_account_kubeconfig(kubeconfig, rbac.grant(), tmp_path / "op.kubeconfig")
    operator = OperatorProcess(limited, namespace, tmp_path / "operator.log")
    operator.start()
    view = Setup(k8s_api, namespace, runner, operator)
    view.gpupool = gpupool
    view.node_pool = node_pool
    try:
        yield view
    finally:
        operator.stop()
        rbac.revoke()


def test_a_job_without_profiles_measures_them_and_a_second_job_reuses_them(
    setup: Setup,
) -> None:
    setup.create_job("first")
    # What the two nodes lack: the model's compute profile on A100-40, and the link between
    # two A100 nodes of one zone (one-GPU nodes have no intra-node link). The first is one
    # Job; a link takes a Job per end, on different nodes.
    compute = key_id("compute/tiny-gpt/A100-40")
    link = key_id("network/intra-zone/A100-40/A100-40/n1")
    jobs = wait_for(
        "the three profiling Jobs", lambda: len(setup.profiling_jobs("first")) == 3 or None, 60
    )
    jobs = setup.profiling_jobs("first")
    assert sorted(
        (j.metadata.labels[LABEL_NEED], j.metadata.labels.get(LABEL_RANK, "")) for j in jobs
    ) == sorted([(compute, ""), (link, "0"), (link, "1")])
    # Policy Required: no plan, no worker, until the measurements are stored.
    assert not setup.status("first").get("plan")

    status = wait_for("the first job planned", lambda: setup.planned("first"), 240, setup.explain)
    assert status["plan"].get("estimatedProfiles", []) == []
    measured = setup.condition("first", "ProfilesMeasured")
    assert (measured["status"], measured["reason"]) == ("True", "AllMeasured")
    profiling = setup.condition("first", "Profiling")
    assert (profiling["status"], profiling["reason"]) == ("False", "ProfilesReady")

    # The store holds what the Jobs measured, attributed to the job that measured it.
    store = setup.store()
    assert len(store) == 2
    assert {c.metadata.annotations[SOURCE_ANNOTATION] for c in store} == {
        f"{setup.namespace}/first"
    }
    profiles, problems = parse_profile_configmaps(
        [{"metadata": {"name": c.metadata.name}, "data": c.data} for c in store]
    )
    assert problems == []
    assert sorted(
        (p.model, p.gpu_type, p.tensor_parallel, p.micro_batch_size) for p in profiles.compute
    ) == [("tiny-gpt", "A100-40", 1, mbs) for mbs in (1, 2, 4)]
    # the pair measured one flow each way, its concurrent flows and the all-reduce over it
    assert sorted((p.link, p.measure, p.provenance.source) for p in profiles.network) == [
        ("intra-zone", measure, "measured") for measure in ("allreduce", "concurrent", "p2p")
    ]
    events = setup.events("first")
    assert "ProfilingStarted" in events and events.count("ProfilesStored") == 2

    # Free both nodes for the second job, which must find everything in the store.
    setup.custom.delete_namespaced_custom_object(
        GROUP, VERSION, setup.namespace, "trainingjobs", "first"
    )
    selector = f"{naming.LABEL_JOB}=first"
    wait_for(
        "the first job's pods gone",
        lambda: not setup.core.list_namespaced_pod(setup.namespace, label_selector=selector).items,
        60,
        setup.explain,
    )
    setup.create_job("second")
    status = wait_for("the second job planned", lambda: setup.planned("second"), 60, setup.explain)
    assert status["plan"].get("estimatedProfiles", []) == []
    assert setup.profiling_jobs("second") == []
    assert "ProfilingStarted" not in setup.events("second")
    assert len(setup.store()) == 2
    assert "Forbidden" not in "\n".join(setup.operator.log_tail(10_000))


def test_auto_trains_at_once_on_estimates_and_replans_when_the_measurements_land(
    setup: Setup,
) -> None:
    # Four nodes: the three profiling pods (the compute run and the link's two ends, one
    # GPU each) take three, so the job starts at once on the fourth with estimates.
    for index in (2, 3):
        add_runner_node(setup.runner, setup.node_pool, "nvidia-tesla-a100", ZONE, index=index)
    wait_for("four ready GPU nodes in the GPUPool", lambda: setup.ready_nodes() == 4, 60)
    # Enough steps that the measured speed makes a restart worth it; no cooldown.
    setup.create_job(
        "auto",
        mode="Auto",
        replan={"cooldownSeconds": 0},
        training={"globalBatchSize": GLOBAL_BATCH, "steps": 1_000_000, "seed": 7},
    )
    status = wait_for("the first plan", lambda: setup.planned("auto"), 60, setup.explain)
    assert status["plan"]["generation"] == 1
    assert status["plan"]["gpus"] == 1  # the node profiling does not take
    assert status["plan"]["estimatedProfiles"], "planned before anything was measured"
    assert len(setup.profiling_jobs("auto")) == 3
    # Where generation 1's worker logs (the runner forgets a pod once it is deleted).
    old_log = wait_for(
        "generation 1's worker started",
        lambda: log_of(setup.runner, setup.namespace, "auto-g1-a0-w0"),
        60,
        setup.explain,
    )

    compute_key = "compute/tiny-gpt/A100-40"

    def replanned_with_measurements() -> dict[str, Any] | None:
        found = setup.status("auto")
        plan = found.get("plan") or {}
        estimated = plan.get("estimatedProfiles", [])
        done = plan.get("generation", 0) > 1 and not any(
            e.startswith(compute_key) for e in estimated
        )
        return found if done and found.get("phase") == "Running" else None

    status = wait_for(
        "a new plan made with the measured compute profile",
        replanned_with_measurements,
        300,
        setup.explain,
    )
    reasons = [h["reason"] for h in status["history"]]
    # The switch was for the measurements (not, say, a failure), and went through the
    # replan state machine's checkpoint-and-restart, leaving gen 1 behind.
    assert any(r.startswith("ProfilesMeasured:") for r in reasons), reasons
    assert not setup.core.list_namespaced_pod(
        setup.namespace, label_selector=f"{naming.LABEL_GENERATION}=1"
    ).items
    # Generation 1 stopped at a checkpoint it wrote for the switch, and training goes on
    # from a checkpoint at least that late, not from step 0 (later generations may follow as
    # the link's profile lands: each restores the checkpoint of the one before).
    old = events_of(old_log)
    stopped = next(e for e in old if e.get("event") == "stopped")
    assert stopped["reason"] == "checkpoint-request" and stopped["last_checkpoint_step"] > 0

    def restored() -> int | None:
        now = setup.status("auto")
        generation, attempt = (now.get("plan") or {}).get("generation", 0), now.get("attempt", 0)
        log = log_of(setup.runner, setup.namespace, f"auto-g{generation}-a{attempt}-w0")
        found = [e["step"] for e in events_of(log) if e.get("event") == "restored"] if log else []
        return found[0] if generation > 1 and found else None

    assert wait_for("a restore", restored, 120, setup.explain) >= stopped["last_checkpoint_step"]
    wait_for("both profiles in the store", lambda: len(setup.store()) == 2, 60, setup.explain)
