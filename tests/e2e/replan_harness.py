"""Shared pieces of the replanning end-to-end tests (tests/e2e/test_replan_*.py) and of
benchmarks/replan_latency.py.

The real operator as a subprocess serving one namespace, GPUPools over runner nodes with
one GPU each (runner_harness.py), a TrainingJob of a tiny GPT checkpointing to a
runner-backed claim, readers for rank 0's JSON step log (the runner keeps every pod's log),
and the reference: the losses of an uninterrupted single-process run with the same trainer
config, made by the trainer tests' harness (tests/trainer/trainer_harness.py). The tests get
`cluster` (replan_cluster below) and `runner` as fixtures from conftest.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_process import OperatorProcess, install_crds
from runner_harness import TINY, add_runner_node, events_of, log_of, worker_log_tails
from trainer_harness import run_plan
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.api.trainingjob import CustomModel, TrainingJob
from sailplan.operator.reconcile import memory, naming
from sailplan.operator.reconcile.children import trainer_config
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan_dev.localcluster.podrunner import PodRunner

# About 40 ms a step on a CPU: long enough to act mid-run, short enough for CI.
STEPS = 400
INTERVAL = 20
GLOBAL_BATCH = 8
JOB = "tiny"
# camelCase, as the CRD schema has it (snake_case keys would be pruned by the API server).
CUSTOM = CustomModel.model_validate(TINY.model_dump()).model_dump(
    mode="json", by_alias=True, exclude_none=True
)


@dataclass(frozen=True)
class PoolSpec:
    key: str
    accelerator: str  # GKE accelerator label
    zone: str
    gpu_type: str  # catalog name


A100 = PoolSpec("a100", "nvidia-tesla-a100", "us-central1-a", "A100-40")
V100 = PoolSpec("v100", "nvidia-tesla-v100", "us-west1-b", "V100-16")


def steps_of(events: list[dict[str, Any]]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events if e.get("event") == "step"}


class Cluster:
    """The test's view: runner nodes, GPUPools, the job, its pods and rank 0's logs."""

    def __init__(
        self, k8s_api: Any, namespace: str, runner: PodRunner, operator: OperatorProcess
    ) -> None:
        self.core = client.CoreV1Api(k8s_api)
        self.custom = client.CustomObjectsApi(k8s_api)
        self.namespace = namespace
        self.runner = runner
        self.operator = operator
        self.suffix = uuid.uuid4().hex[:6]
        self.gpupools: dict[str, PoolSpec] = {}

    def gpupool(self, pool: PoolSpec) -> str:
        name = f"{pool.key}-{self.suffix}"
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GPUPool",
            "metadata": {"name": name},
            # The GPU type stated, so a pool with no nodes yet is still a known type.
            "spec": {"nodePool": self.node_pool(pool), "gpuType": pool.gpu_type},
        }
        self.custom.create_cluster_custom_object(GROUP, VERSION, "gpupools", body)
        self.gpupools[name] = pool
        return name

    def node_pool(self, pool: PoolSpec) -> str:
        return f"{pool.key}-np-{self.suffix}"

    def add_node(self, pool: PoolSpec, index: int = 0) -> str:
        return add_runner_node(
            self.runner, self.node_pool(pool), pool.accelerator, pool.zone, index=index
        )

    def job_spec(self, **replan: Any) -> dict[str, Any]:
        return {
            "model": {"custom": CUSTOM},
            "training": {"globalBatchSize": GLOBAL_BATCH, "steps": STEPS, "seed": 7},
            "pools": {"names": sorted(self.gpupools)},
            "trainer": {"image": "sailplan-trainer:local", "cpu": "1", "memory": "1Gi"},
            "checkpoint": {
                "storage": {"persistentVolumeClaim": {"claimName": "ckpt", "subPath": "run"}},
                "intervalSteps": INTERVAL,
            },
            "profiling": {"mode": "Skip"},
            "replan": replan,
        }

    def create_job(self, spec: dict[str, Any]) -> None:
        self.runner.provision_claim(self.namespace, "ckpt")
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingJob",
            "metadata": {"name": JOB, "namespace": self.namespace},
            "spec": spec,
        }
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "trainingjobs", body
        )

    def status(self) -> dict[str, Any]:
        got = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "trainingjobs", JOB
        )
        status: dict[str, Any] = got.get("status") or {}
        return status

    def memory(self) -> dict[str, Any]:
        """The operator's memory of the job: its state ConfigMap (reconcile.memory)."""
        try:
            found = self.core.read_namespaced_config_map(
                memory.state_configmap_name(JOB), self.namespace
            )
        except client.ApiException as error:
            if error.status == 404:
                return {}
            raise
        loaded: dict[str, Any] = json.loads((found.data or {}).get(memory.STATE_KEY) or "{}")
        return loaded

    def pods(self, generation: int | None = None) -> list[Any]:
        selector = f"{naming.LABEL_JOB}={JOB},{naming.LABEL_ROLE}={naming.ROLE_WORKER}"
        if generation is not None:
            selector += f",{naming.LABEL_GENERATION}={generation}"
        found: list[Any] = self.core.list_namespaced_pod(
            self.namespace, label_selector=selector
        ).items
        return found

    def explain(self) -> str:
        """What a timed-out wait prints: job status, operator log, and every worker's log tail."""
        parts = [f"job status: {json.dumps(self.status(), indent=1)}", "operator log:"]
        parts += self.operator.log_tail()
        parts += worker_log_tails(self.runner, self.namespace)
        return "\n".join(parts)

    def rank0(self, generation: int, timeout_s: float = 60) -> tuple[Any, Path]:
        """Worker 0 of `generation` (its pod) and its log, once it has started."""
        pods = wait_for(
            f"generation {generation} pods", lambda: self.pods(generation), timeout_s, self.explain
        )
        pod = next(p for p in pods if p.metadata.labels[naming.LABEL_WORKER] == "0")
        log = wait_for(
            f"generation {generation} rank 0 started",
            lambda: log_of(self.runner, self.namespace, pod.metadata.name),
            timeout_s,
            self.explain,
        )
        # Read again: the first listing may predate the scheduler binding the pod.
        return self.core.read_namespaced_pod(pod.metadata.name, self.namespace), log

    def wait_checkpoint(self, log: Path, step: int, timeout_s: float = 120) -> None:
        def reached() -> bool:
            done = [e for e in events_of(log) if e.get("event") == "step"]
            return bool(done) and (done[-1].get("last_checkpoint_step") or 0) >= step

        wait_for(f"a complete checkpoint of step {step}", reached, timeout_s, self.explain)

    def wait_finished(self, timeout_s: float = 180) -> dict[str, Any]:
        status: dict[str, Any] = wait_for(
            "the job to finish",
            lambda: (s := self.status()).get("phase") in ("Succeeded", "Failed") and s,
            timeout_s,
            self.explain,
        )
        return status


@contextmanager
def replan_cluster(
    api: Any, kubeconfig: str, namespace: str, runner: PodRunner, operator_log: Path
) -> Iterator[Cluster]:
    """The CRDs installed and the operator running for `namespace`; on exit the operator is
    stopped and the GPUPools the test made (cluster-scoped, so not deleted with the
    namespace) are deleted."""
    install_crds(api)
    # The restart cost the runner's pods really have (they start in about a second), not the
    # cloud defaults (90 s), so a switch pays off within a short test run.
    restart_costs = ("--restart-pod-start-seconds", "2", "--restart-teardown-seconds", "1")
    # Rank 0's progress read often enough to see it advance within a short run.
    progress = ("--progress-seconds", "1")
    operator = OperatorProcess(kubeconfig, namespace, operator_log, *restart_costs, *progress)
    view = Cluster(api, namespace, runner, operator)
    operator.start()
    try:
        yield view
    finally:
        operator.stop()
        for name in view.gpupools:
            view.custom.delete_cluster_custom_object(GROUP, VERSION, "gpupools", name)


# Reference losses by trainer config (checkpoint directory aside): the replanning tests' jobs
# share one config, and the run is deterministic, so the session runs it once.
_REFERENCES: dict[str, dict[int, float]] = {}


def reference_losses(spec: dict[str, Any], workdir: Path) -> dict[int, float]:
    """Rank 0's losses of an uninterrupted single-process run with the job's trainer config
    (run once per distinct config in a session)."""
    job = TrainingJob.model_validate({"name": JOB, "namespace": "reference", "spec": spec})
    single = Plan(
        model=TINY,
        global_batch_size=GLOBAL_BATCH,
        micro_batch_size=GLOBAL_BATCH,
        num_micro_batches=1,
        stages=(
            Stage(
                layer_start=0,
                layer_end=TINY.num_layers,
                tensor_parallel=1,
                replicas=(Replica(pool="ref", gpu_type="CPU", zone="local"),),
            ),
        ),
    )
    config = trainer_config(job)
    key = config.model_dump_json(exclude={"checkpoint_dir"})
    if key not in _REFERENCES:
        local = config.model_copy(update={"checkpoint_dir": str(workdir / "ckpt")})
        _REFERENCES[key] = dict(run_plan(single, local, workdir).losses)
    return dict(_REFERENCES[key])


def assert_continues(
    old: list[dict[str, Any]], new: list[dict[str, Any]], reference: dict[int, float]
) -> int:
    """The old generation's steps, then the new one's from the newest complete checkpoint the
    old one wrote: nothing lost beyond it, no step twice, every loss the reference's.
    Returns the step restored."""
    old_steps, new_steps = steps_of(old), steps_of(new)
    last_checkpoint = max(
        e.get("last_checkpoint_step") or 0 for e in old if e.get("event") in ("step", "stopped")
    )
    restored: int = next(e["step"] for e in new if e.get("event") == "restored")
    assert restored == last_checkpoint
    assert sorted(old_steps) == list(range(1, max(old_steps) + 1))
    assert restored <= max(old_steps)
    assert sorted(new_steps) == list(range(restored + 1, STEPS + 1))
    for step, loss in sorted(old_steps.items()) + sorted(new_steps.items()):
        assert loss == pytest.approx(reference[step], rel=1e-5), step
    return restored
