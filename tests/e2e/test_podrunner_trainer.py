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

import uuid
from typing import Any

import pytest
from kubernetes import client
from runner_harness import TINY, TRAINER_IMAGE, add_runner_node, events_of, worker_log_tails
from trainer_harness import free_port
from waiting import wait_for

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.children import desired_children
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan_dev.localcluster.podrunner import PodRunner

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

ZONE = "us-central1-a"
STEPS = 4


def test_operator_rendered_workers_train_and_checkpoint(
    runner: PodRunner, namespace: str, k8s_api: Any
) -> None:
    core = client.CoreV1Api(k8s_api)
    node_pool = f"pr-{uuid.uuid4().hex[:8]}"
    add_runner_node(
        runner, node_pool, "nvidia-tesla-a100", ZONE, gpus=4, machine_type="a2-highgpu-4g"
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
                    "image": TRAINER_IMAGE,
                    "cpu": "1",
                    "memory": "1Gi",
                    "masterPort": free_port(),
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

    def finished() -> list[Any] | None:
        # Done when all have ended, or as soon as one failed: its peers then hang until the
        # collective timeout, and the phase assertion below shows the logs.
        pods = [core.read_namespaced_pod(n, namespace) for n in names]
        phases = {p.status.phase for p in pods}
        return pods if "Failed" in phases or phases == {"Succeeded"} else None

    pods = wait_for(
        "both workers to finish",
        finished,
        150.0,
        lambda: "\n".join(worker_log_tails(runner, namespace)),
        interval_s=0.5,
    )
    logs = {name: runner.log_path(namespace, name).read_text() for name in names}
    assert [p.status.phase for p in pods] == ["Succeeded", "Succeeded"], logs

    rank0 = events_of(runner.log_path(namespace, names[0]))
    steps = [event["step"] for event in rank0 if event.get("event") == "step"]
    assert steps == list(range(1, STEPS + 1))
    marker = shared / "run" / f"step-{STEPS:09d}" / "sailplan-complete.json"
    assert marker.exists(), sorted(str(p) for p in shared.rglob("*"))


def test_worker_writes_checkpoints_into_the_directory_its_image_owns(
    runner: PodRunner, namespace: str, k8s_api: Any
) -> None:
    """The uid of the operator's worker pods against the trainer image: checkpoint storage
    `uri: /checkpoints` is the directory the image creates for its USER (10001), with no
    volume over it, so only a worker running as that uid can write there (the runner makes
    the image's directories with the Dockerfile's owners and runs the trainer as the pod's
    uid). Expected: the pod Succeeded and its checkpoint of the last step is complete in
    the container's /checkpoints."""
    core = client.CoreV1Api(k8s_api)
    node_pool = f"pr-{uuid.uuid4().hex[:8]}"
    add_runner_node(runner, node_pool, "nvidia-tesla-a100", ZONE)
    job = TrainingJob.model_validate(
        {
            "name": "inimage",
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "spec": {
                "model": {"custom": TINY.model_dump()},
                "training": {"globalBatchSize": 2, "steps": 2, "seed": 1},
                "trainer": {
                    "image": TRAINER_IMAGE,
                    "cpu": "1",
                    "memory": "1Gi",
                    "masterPort": free_port(),
                },
                "checkpoint": {"storage": {"uri": "/checkpoints"}, "intervalSteps": 2},
            },
        }
    )
    pool = GPUPool.model_validate(
        {"name": "a100", "spec": {"nodePool": node_pool}, "status": {"gpuType": "A100-40"}}
    )
    replica = Replica(pool=naming.pool_key("a100", ZONE), gpu_type="A100-40", zone=ZONE)
    plan = Plan(
        model=TINY,
        global_batch_size=2,
        micro_batch_size=1,
        num_micro_batches=2,
        stages=(Stage(layer_start=0, layer_end=6, tensor_parallel=1, replicas=(replica,)),),
    )
    children = desired_children(job, plan, generation=1, attempt=0, pools={"a100": pool})
    for obj in children.in_creation_order():
        obj["metadata"].pop("ownerReferences", None)
    core.create_namespaced_config_map(namespace, children.configmap)
    core.create_namespaced_service(namespace, children.service)
    (pod,) = children.pods
    name = pod["metadata"]["name"]
    core.create_namespaced_pod(namespace, pod)

    def ended() -> Any:
        read = core.read_namespaced_pod(name, namespace)
        return read if read.status.phase in ("Succeeded", "Failed") else None

    ended_pod = wait_for(
        "the worker to finish", ended, 120.0, lambda: "\n".join(worker_log_tails(runner, namespace))
    )
    log = runner.log_path(namespace, name).read_text()
    assert ended_pod.status.phase == "Succeeded", log
    checkpoints = runner.pod_dir(namespace, name) / "rootfs" / "trainer" / "checkpoints"
    assert (checkpoints / "step-000000002" / "sailplan-complete.json").exists(), log
