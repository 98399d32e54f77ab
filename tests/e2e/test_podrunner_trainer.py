"""The operator's own worker pods, run by the pod runner, train and checkpoint for real.

The pods are what the operator renders (reconcile.children.desired_children) for a two-stage
pipeline of a tiny GPT on one runner node: plan ConfigMap, headless rendezvous Service, one
`sailplan-train` pod per worker with the plan mounted at /etc/sailplan/plan, the pod info
at /etc/podinfo, checkpoints on a PersistentVolumeClaim at /checkpoints and MASTER_ADDR
naming worker 0 through the Service. The runner must make all of that work for two local
gloo processes: the rendezvous (DNS name -> 127.0.0.1), the mounted files (the trainer config
in the ConfigMap names /checkpoints), the claim. Expected: both pods Succeeded, rank 0
logged steps 1..STEPS, and a complete checkpoint of the last step is in the claim.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.localcluster.nodes import NodePool
from sailplan.operator.localcluster.podrunner import PodRunner, runner_node_manifest
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.children import desired_children
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

ZONE = "us-central1-a"
STEPS = 4
TINY = ModelSpec(
    name="tiny-gpt",
    family="opt",
    hidden_size=32,
    num_blocks=4,
    num_heads=4,
    vocab_size=64,
    sequence_length=16,
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def runner(k8s_api: Any, tmp_path: Path) -> Iterator[PodRunner]:
    pod_runner = PodRunner(
        k8s_api,
        tmp_path / "runner",
        # Fail fast instead of the trainer's 10-minute collective timeout if wiring is wrong.
        env={"SAILPLAN_COLLECTIVE_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1"},
    )
    try:
        yield pod_runner
    finally:
        left = pod_runner.nodes()
        pod_runner.close(grace_s=2.0)
        for name in left:
            client.CoreV1Api(k8s_api).delete_node(name)


def test_operator_rendered_workers_train_and_checkpoint(
    runner: PodRunner, namespace: str, k8s_api: Any
) -> None:
    core = client.CoreV1Api(k8s_api)
    node_pool = f"pr-{uuid.uuid4().hex[:8]}"
    runner.add_node(
        runner_node_manifest(
            NodePool(
                name=node_pool,
                accelerator="nvidia-tesla-a100",
                gpus_per_node=4,
                machine_type="a2-highgpu-4g",
                zones={ZONE: 1},
            ),
            ZONE,
            0,
        )
    )
    shared = runner.provision_claim(namespace, "ckpt")
    job = TrainingJob.model_validate(
        {
            "name": "tiny",
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "spec": {
                "model": {"custom": TINY.model_dump()},
                "training": {"globalBatchSize": 4, "steps": STEPS, "seed": 1},
                "trainer": {
                    "image": "sailplan-trainer:local",
                    "cpu": "1",
                    "memory": "1Gi",
                    "masterPort": _free_port(),
                },
                "checkpoint": {
                    "storage": {"persistentVolumeClaim": {"claimName": "ckpt", "subPath": "run"}},
                    "intervalSteps": 2,
                },
            },
        }
    )
    pool = GPUPool.model_validate(
        {
            "name": "a100",
            "spec": {"nodePool": node_pool},
            "status": {"gpuType": "A100-40", "spot": False},
        }
    )
    replica = Replica(pool=naming.pool_key("a100", ZONE), gpu_type="A100-40", zone=ZONE)
    plan = Plan(
        model=TINY,
        global_batch_size=4,
        micro_batch_size=1,
        num_micro_batches=4,
        stages=(
            Stage(layer_start=0, layer_end=3, tensor_parallel=1, replicas=(replica,)),
            Stage(layer_start=3, layer_end=6, tensor_parallel=1, replicas=(replica,)),
        ),
    )
    children = desired_children(job, plan, generation=1, attempt=0, pools={"a100": pool})
    for obj in children.in_creation_order():
        # No TrainingJob object exists here: an owner reference to it would let the garbage
        # collector delete the children.
        obj["metadata"].pop("ownerReferences", None)
    core.create_namespaced_config_map(namespace, children.configmap)
    core.create_namespaced_service(namespace, children.service)
    for pod in children.pods:
        core.create_namespaced_pod(namespace, pod)

    names = [p["metadata"]["name"] for p in children.pods]
    finished = _wait_all_finished(core, namespace, names, timeout_s=150.0)
    logs = {name: runner.log_path(namespace, name).read_text() for name in names}
    assert [p.status.phase for p in finished] == ["Succeeded", "Succeeded"], logs

    steps = [
        event["step"]
        for event in map(_json_or_none, logs[names[0]].splitlines())
        if event and event.get("event") == "step"
    ]
    assert steps == list(range(1, STEPS + 1))
    marker = shared / "run" / f"step-{STEPS:09d}" / "sailplan-complete.json"
    assert marker.exists(), sorted(str(p) for p in shared.rglob("*"))


def _json_or_none(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _wait_all_finished(core: Any, namespace: str, names: list[str], timeout_s: float) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        pods = [core.read_namespaced_pod(n, namespace) for n in names]
        if all(p.status.phase in ("Succeeded", "Failed") for p in pods):
            return pods
        if any(p.status.phase == "Failed" for p in pods) or time.monotonic() > deadline:
            return pods
        time.sleep(0.5)
