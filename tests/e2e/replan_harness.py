"""Shared pieces of the replanning end-to-end tests (tests/e2e/test_replan_*.py).

The real operator as a subprocess serving one namespace, GPUPools over runner nodes with
one GPU each, a TrainingJob of a tiny GPT checkpointing to a runner-backed claim, readers
for rank 0's JSON step log (the runner keeps every pod's log), and the reference: the
losses of an uninterrupted single-process run with the same trainer config, made by the
trainer tests' harness (tests/trainer/trainer_harness.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sailplan.operator.api import crd
from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.api.trainingjob import CustomModel, TrainingJob
from sailplan.operator.apply import apply
from sailplan.operator.localcluster.nodes import NodePool
from sailplan.operator.localcluster.podrunner import PodRunner, runner_node_manifest
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.children import trainer_config
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage

# About 40 ms a step on a CPU: long enough to act mid-run, short enough for CI.
STEPS = 400
INTERVAL = 20
GLOBAL_BATCH = 8
JOB = "tiny"
TINY = ModelSpec(
    name="tiny-gpt",
    family="opt",
    hidden_size=32,
    num_blocks=4,
    num_heads=4,
    vocab_size=64,
    sequence_length=16,
)
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


def wait_for(
    what: str, check: Callable[[], Any], timeout_s: float, explain: Callable[[], str] = str
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s:.0f}s waiting for {what}\n{explain()}"
            )
        time.sleep(0.1)


def events_of(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a trainer's stdout."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue  # the line being written right now
    return found


def steps_of(events: list[dict[str, Any]]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events if e.get("event") == "step"}


class OperatorProcess:
    """`python -m sailplan.operator operator run`, as the Deployment runs it."""

    def __init__(self, kubeconfig: str, namespace: str, log: Path) -> None:
        self.args = [sys.executable, "-m", "sailplan.operator", "operator", "run"]
        self.args += ["--kubeconfig", kubeconfig, "--namespace", namespace]
        self.args += ["--profile-namespace", namespace, "--metrics-port", "0"]
        self.args += ["--health-port", "0"]
        # The restart cost the runner's pods really have (they start in about a second),
        # not the cloud defaults (90 s), so a switch pays off within a short test run.
        self.args += ["--restart-pod-start-seconds", "2", "--restart-teardown-seconds", "1"]
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL: no cleanup, like the operator's node crashing."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


class Cluster:
    """The test's view: runner nodes, GPUPools, the job, its pods and rank 0's logs."""

    def __init__(self, k8s_api: Any, namespace: str, runner: PodRunner) -> None:
        self.core = client.CoreV1Api(k8s_api)
        self.custom = client.CustomObjectsApi(k8s_api)
        self.namespace = namespace
        self.runner = runner
        self.suffix = uuid.uuid4().hex[:6]
        self.gpupools: dict[str, PoolSpec] = {}
        self.operator: OperatorProcess | None = None

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
        spec = NodePool(
            name=self.node_pool(pool),
            accelerator=pool.accelerator,
            gpus_per_node=1,
            machine_type="a2-highgpu-1g",
            zones={pool.zone: 1},
        )
        return self.runner.add_node(runner_node_manifest(spec, pool.zone, index))

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

    def pods(self, generation: int | None = None) -> list[Any]:
        selector = f"{naming.LABEL_JOB}={JOB},{naming.LABEL_ROLE}={naming.ROLE_WORKER}"
        if generation is not None:
            selector += f",{naming.LABEL_GENERATION}={generation}"
        found: list[Any] = self.core.list_namespaced_pod(
            self.namespace, label_selector=selector
        ).items
        return found

    def log_of(self, pod: str) -> Path | None:
        try:
            return self.runner.log_path(self.namespace, pod)
        except KeyError:  # not started yet
            return None

    def explain(self) -> str:
        """What a timed-out wait prints: job status, operator log, and every worker's log tail."""
        lines = self.operator.log.read_text().splitlines()[-40:] if self.operator else []
        parts = [f"job status: {json.dumps(self.status(), indent=1)}", "operator log:", *lines]
        pods = self.core.list_namespaced_pod(self.namespace).items
        for pod in pods:
            log = self.log_of(pod.metadata.name)
            if log is not None and log.exists():
                parts.append(f"log of pod {pod.metadata.name} ({pod.status.phase}):")
                parts.extend(log.read_text(errors="replace").splitlines()[-25:])
        return "\n".join(parts)

    def rank0(self, generation: int, timeout_s: float = 60) -> tuple[Any, Path]:
        """Worker 0 of `generation` (its pod) and its log, once it has started."""
        pods = wait_for(
            f"generation {generation} pods", lambda: self.pods(generation), timeout_s, self.explain
        )
        pod = next(p for p in pods if p.metadata.labels[naming.LABEL_WORKER] == "0")
        log = wait_for(
            f"generation {generation} rank 0 started",
            lambda: self.log_of(pod.metadata.name),
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


@pytest.fixture
def runner(k8s_api: Any, tmp_path: Path) -> Iterator[PodRunner]:
    pod_runner = PodRunner(
        k8s_api,
        tmp_path / "runner",
        env={"SAILPLAN_COLLECTIVE_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1"},
    )
    try:
        yield pod_runner
    finally:
        left = pod_runner.nodes()
        pod_runner.close(grace_s=2.0)
        for name in left:
            client.CoreV1Api(k8s_api).delete_node(name)


@pytest.fixture
def cluster(
    k8s_api: Any, kubeconfig: str, namespace: str, runner: PodRunner, tmp_path: Path
) -> Iterator[Cluster]:
    apply(k8s_api, crd.all_crds())
    view = Cluster(k8s_api, namespace, runner)
    view.operator = OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log")
    view.operator.start()
    try:
        yield view
    finally:
        view.operator.stop()
        for name in view.gpupools:
            view.custom.delete_cluster_custom_object(GROUP, VERSION, "gpupools", name)


def reference_losses(spec: dict[str, Any], workdir: Path) -> dict[int, float]:
    """Rank 0's losses of an uninterrupted single-process run with the job's trainer config."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
    from trainer_harness import run_plan  # the trainer tests' harness

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
    config = trainer_config(job).model_copy(update={"checkpoint_dir": str(workdir / "ckpt")})
    return run_plan(single, config, workdir).losses


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
