"""Render a TrainingJob's children for one plan: the plan ConfigMap, the rendezvous Service
and one worker Pod per Plan.workers() entry.

The pod shape is the contract of sailplan.planner.workerenv: where the plan and trainer
config are mounted, the env vars, the downward-API pod info. Each pod is pinned to its
replica's GPUPool and zone by required node affinity, asks for `nvidia.com/gpu` equal to its
tensor-parallel degree, tolerates the GPU taint, and runs non-root; spec.podTemplateOverrides
is merged in last (reconcile.overrides). Pure: returns dicts ready for the API server.

A node holds the workers of one TrainingJob at most (`worker_pod_affinity`): the planner
counts whole free nodes per pool and zone (reconcile.snapshot), and the scheduler, which
picks the nodes within them, would otherwise spread two jobs' one-GPU workers over nodes
another job's tensor-parallel worker needs whole.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sailplan.operator.api.common import API_VERSION
from sailplan.operator.api.gpupool import (
    GPU_RESOURCE,
    NODEPOOL_LABEL,
    ZONE_LABEL,
    GPUPool,
)
from sailplan.operator.api.trainingjob import KIND, TrainingJob
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.overrides import apply_overrides, ignored_notes
from sailplan.planner import workerenv
from sailplan.planner.plan import Plan, Worker

PLAN_MOUNT = "/etc/sailplan/plan"
CHECKPOINT_MOUNT = "/checkpoints"
# The trainer image's USER (trainer_image/Dockerfile), which owns the directories the image
# creates (/checkpoints, its home): the pods run as it so the trainer can write there.
RUN_AS_USER = 10001
TMP_MOUNT = "/tmp"
# A node's name label: the topology of "one job per node".
HOSTNAME_LABEL = "kubernetes.io/hostname"
# SIGTERM gives the trainer this long to write a checkpoint before SIGKILL.
TERMINATION_GRACE_SECONDS = 120


class RenderError(ValueError):
    """The plan refers to a GPUPool that no longer exists."""


@dataclass(frozen=True)
class Children:
    configmap: dict[str, Any]
    service: dict[str, Any]
    pods: tuple[dict[str, Any], ...]
    # spec.podTemplateOverrides entries the plan overruled (reconcile.overrides), once each.
    ignored_overrides: tuple[str, ...] = ()

    def in_creation_order(self) -> list[dict[str, Any]]:
        # The plan first: pods mount it, and after a crash the ConfigMap is what tells the
        # operator which plan was being rolled out.
        return [self.configmap, self.service, *self.pods]


def owner_reference(job: TrainingJob) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controller_uid(metadata: Mapping[str, Any]) -> str:
    """The uid in an object's controlling ownerReference (owner_reference's inverse); ''."""
    for reference in metadata.get("ownerReferences") or ():
        if reference.get("controller"):
            return str(reference.get("uid", ""))
    return ""


def _metadata(job: TrainingJob, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(job)],
    }


def trainer_config(job: TrainingJob) -> workerenv.TrainerConfig:
    spec = job.spec
    storage = spec.checkpoint.storage
    if storage.persistent_volume_claim is not None:
        sub_path = storage.persistent_volume_claim.sub_path.strip("/")
        checkpoint_dir = f"{CHECKPOINT_MOUNT}/{sub_path}" if sub_path else CHECKPOINT_MOUNT
    else:
        checkpoint_dir = storage.uri or ""
    return workerenv.TrainerConfig(
        steps=spec.training.steps,
        learning_rate=spec.training.learning_rate,
        seed=spec.training.seed,
        data=workerenv.DataConfig(
            kind=spec.training.data.kind,
            path=spec.training.data.path,
            seed=spec.training.seed,
        ),
        checkpoint_dir=checkpoint_dir,
        checkpoint_interval_steps=spec.checkpoint.interval_steps,
        checkpoints_to_keep=spec.checkpoint.keep,
        mixed_precision=spec.training.mixed_precision,
        zero_stage=spec.training.zero_stage,
    )


def render_configmap(job: TrainingJob, plan: Plan, generation: int) -> dict[str, Any]:
    labels = naming.job_labels(job.name, naming.ROLE_PLAN) | {
        naming.LABEL_GENERATION: str(generation)
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, naming.plan_configmap_name(job.name, generation), labels),
        # A generation's plan never changes; a replan writes a new ConfigMap.
        "immutable": True,
        "data": {
            naming.PLAN_KEY: plan.to_json(),
            naming.TRAINER_KEY: trainer_config(job).model_dump_json(indent=2),
        },
    }


def render_service(job: TrainingJob) -> dict[str, Any]:
    """Headless Service that gives every worker a stable DNS name (hostname.subdomain)."""
    name = naming.service_name(job.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, name, naming.job_labels(job.name, naming.ROLE_RENDEZVOUS)),
        "spec": {
            "clusterIP": "None",
            "selector": {naming.LABEL_JOB: job.name, naming.LABEL_ROLE: naming.ROLE_WORKER},
            # Rendezvous happens before any worker is ready.
            "publishNotReadyAddresses": True,
            "ports": [
                {
                    "name": "rendezvous",
                    "port": job.spec.trainer.master_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def master_address(job: TrainingJob, generation: int, attempt: int) -> str:
    worker0 = naming.worker_pod_name(job.name, generation, attempt, 0)
    return f"{worker0}.{naming.service_name(job.name)}.{job.namespace}.svc"


def node_affinity(pool: GPUPool, zone: str) -> dict[str, Any]:
    """Required node affinity to the GPUPool's nodes in one zone (worker and profiling pods)."""
    expressions: list[dict[str, Any]] = []
    if pool.spec.node_pool is not None:
        expressions.append(
            {"key": NODEPOOL_LABEL, "operator": "In", "values": [pool.spec.node_pool]}
        )
    elif pool.spec.selector is not None:
        expressions.extend(
            {"key": key, "operator": "In", "values": [value]}
            for key, value in sorted(pool.spec.selector.match_labels.items())
        )
    expressions.append({"key": ZONE_LABEL, "operator": "In", "values": [zone]})
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": expressions}]
        }
    }


def worker_pod_affinity(job_uid: str) -> dict[str, Any]:
    """The workers' pod affinity, given their job's LABEL_JOB_UID value.

    Required anti-affinity, per node (hostname) and over every namespace, to the workers of
    any other TrainingJob: the scheduler also checks the existing pods' required
    anti-affinity against a pod it places, so a node runs one job's workers whichever came
    first. (Workers without the uid label, made by an operator before it, are not matched.)
    Preferred affinity (the largest weight) to the job's own workers, so they fill as few
    nodes as the plan counted: the default scoring spreads pods over nodes instead."""
    worker = {"key": naming.LABEL_ROLE, "operator": "In", "values": [naming.ROLE_WORKER]}
    other_jobs = {
        "labelSelector": {
            "matchExpressions": [
                worker,
                {"key": naming.LABEL_JOB_UID, "operator": "Exists"},
                {"key": naming.LABEL_JOB_UID, "operator": "NotIn", "values": [job_uid]},
            ]
        },
        "namespaceSelector": {},
        "topologyKey": HOSTNAME_LABEL,
    }
    own_job = {
        "labelSelector": {
            "matchExpressions": [
                worker,
                {"key": naming.LABEL_JOB_UID, "operator": "In", "values": [job_uid]},
            ]
        },
        "topologyKey": HOSTNAME_LABEL,
    }
    return {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": own_job}
            ]
        },
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [other_jobs]},
    }


def pool_tolerations(pool: GPUPool) -> list[dict[str, Any]]:
    """Tolerations for exactly the taints of `pool`'s nodes (GPUPool.node_taints): a pod
    placed on the pool schedules there and nowhere a taint it was not meant for."""
    tolerations: list[dict[str, Any]] = []
    for taint in pool.node_taints():
        toleration: dict[str, Any] = {"key": taint.key, "effect": taint.effect}
        if taint.value is None:
            toleration["operator"] = "Exists"
        else:
            toleration |= {"operator": "Equal", "value": taint.value}
        tolerations.append(toleration)
    return tolerations


def pod_security_context() -> dict[str, Any]:
    """Non-root with the runtime's seccomp profile: every pod the operator creates. fsGroup
    makes the volumes (emptyDir, a claim's filesystem) writable by that uid's group."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(read_only_root: bool = True) -> dict[str, Any]:
    """No privileges; the image's filesystem read-only unless the container must write
    into it (a checkpoint path on the image's filesystem, `checkpoint_in_image`)."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only_root,
    }


def checkpoint_in_image(job: TrainingJob) -> bool:
    """Whether the job checkpoints to a local path with no volume behind it (storage.uri
    "/checkpoints"): the trainer then writes into the image's filesystem."""
    uri = job.spec.checkpoint.storage.uri
    return uri is not None and (uri.startswith("/") or uri.startswith("file://"))


def _env(
    job: TrainingJob, plan: Plan, worker: Worker, generation: int, attempt: int
) -> list[dict[str, Any]]:
    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    return [
        {"name": workerenv.PLAN_PATH, "value": workerenv.DEFAULT_PLAN_PATH},
        {"name": workerenv.TRAINER_CONFIG_PATH, "value": workerenv.DEFAULT_TRAINER_CONFIG_PATH},
        {"name": workerenv.PLAN_GENERATION, "value": str(generation)},
        {"name": workerenv.WORKER_INDEX, "value": str(worker.index)},
        {"name": workerenv.MASTER_ADDR, "value": master_address(job, generation, attempt)},
        {"name": workerenv.MASTER_PORT, "value": str(job.spec.trainer.master_port)},
        {"name": workerenv.WORLD_SIZE, "value": str(plan.world_size)},
        {"name": workerenv.POD_NAME, "valueFrom": field("metadata.name")},
        {"name": workerenv.POD_NAMESPACE, "valueFrom": field("metadata.namespace")},
        {"name": workerenv.PODINFO_DIR, "value": workerenv.DEFAULT_PODINFO_DIR},
        {"name": workerenv.METRICS_PORT, "value": str(workerenv.DEFAULT_METRICS_PORT)},
    ]


def _volumes(job: TrainingJob, generation: int) -> tuple[list[Any], list[Any]]:
    volumes: list[dict[str, Any]] = [
        {
            "name": "plan",
            "configMap": {"name": naming.plan_configmap_name(job.name, generation)},
        },
        {
            "name": "podinfo",
            "downwardAPI": {
                "items": [
                    {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                ]
            },
        },
        # NCCL and data loaders need more shared memory than the runtime's 64 MiB default.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        # Libraries' temporary files, with the root filesystem read-only.
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},
        {"name": "podinfo", "mountPath": workerenv.DEFAULT_PODINFO_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": TMP_MOUNT},
    ]
    claim = job.spec.checkpoint.storage.persistent_volume_claim
    if claim is not None:
        volumes.append(
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim.claim_name}}
        )
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT})
    return volumes, mounts


# Kubernetes quantity suffixes (resource.Quantity): binary and decimal multiples of a byte
_SUFFIX_BYTES: dict[str, int] = {
    "": 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
}
_MEMORY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|)$")


def worker_memory(memory: str, plan: Plan, worker: Worker) -> str:
    """The worker container's memory: spec.trainer.memory, plus for a stage with
    optimizer_offload the host memory its GPUs' optimizer state takes (the plan's
    prediction per GPU, times the worker's GPUs), so the offloaded Adam state is not
    OOM-killed by the pod's limit. A quantity this cannot read is left as it is."""
    stage = plan.stages[worker.stage]
    predictions = plan.predictions
    matched = _MEMORY.match(memory)
    if not stage.optimizer_offload or predictions is None or matched is None:
        return memory
    base = float(matched.group(1)) * _SUFFIX_BYTES[matched.group(2)]
    host = predictions.stages[worker.stage].host_memory_bytes * worker.tensor_parallel
    return str(math.ceil(base + host))


def render_worker_pod(
    job: TrainingJob,
    plan: Plan,
    worker: Worker,
    *,
    generation: int,
    attempt: int,
    pools: Mapping[str, GPUPool],
) -> dict[str, Any]:
    gpupool_name, zone = naming.split_pool_key(worker.pool)
    pool = pools.get(gpupool_name)
    if pool is None:
        raise RenderError(
            f"plan generation {generation} places worker {worker.index} on GPUPool "
            f"{gpupool_name!r}, which no longer exists"
        )
    name = naming.worker_pod_name(job.name, generation, attempt, worker.index)
    job_uid = naming.job_uid_label(job.namespace, job.name, job.uid)
    labels = naming.job_labels(job.name, naming.ROLE_WORKER) | {
        naming.LABEL_JOB_UID: job_uid,
        naming.LABEL_GENERATION: str(generation),
        naming.LABEL_ATTEMPT: str(attempt),
        naming.LABEL_WORKER: str(worker.index),
        naming.LABEL_STAGE: str(worker.stage),
        naming.LABEL_GPUPOOL: gpupool_name,
    }
    metadata = _metadata(job, name, labels)
    metadata["annotations"] = {
        "sailplan.dev/worker": json.dumps(
            {
                "stage": worker.stage,
                "replica": worker.replica,
                "firstRank": worker.first_rank,
                "tensorParallel": worker.tensor_parallel,
                "gpuType": worker.gpu_type,
                "zone": worker.zone,
            },
            sort_keys=True,
        )
    }
    trainer = job.spec.trainer
    volumes, mounts = _volumes(job, generation)
    gpus = str(worker.tensor_parallel)
    memory = worker_memory(trainer.memory, plan, worker)
    pod_spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": naming.service_name(job.name),
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "enableServiceLinks": False,
        # The trainer makes no API call: its progress is read from its metrics endpoint.
        "automountServiceAccountToken": False,
        "affinity": {"nodeAffinity": node_affinity(pool, zone)} | worker_pod_affinity(job_uid),
        "tolerations": pool_tolerations(pool),
        "securityContext": pod_security_context(),
        "containers": [
            {
                "name": "trainer",
                "image": trainer.image,
                "imagePullPolicy": trainer.image_pull_policy,
                "command": list(trainer.command),
                "env": _env(job, plan, worker, generation, attempt),
                "ports": [
                    {"name": "rendezvous", "containerPort": trainer.master_port},
                    # The operator reads rank 0's progress here (controller.progress).
                    {
                        "name": workerenv.METRICS_PORT_NAME,
                        "containerPort": workerenv.DEFAULT_METRICS_PORT,
                    },
                ],
                "resources": {
                    "requests": {"cpu": trainer.cpu, "memory": memory, GPU_RESOURCE: gpus},
                    "limits": {"memory": memory, GPU_RESOURCE: gpus},
                },
                "volumeMounts": mounts,
                "securityContext": container_security_context(
                    read_only_root=not checkpoint_in_image(job)
                ),
            }
        ],
        "volumes": volumes,
    }
    if trainer.service_account_name is not None:
        pod_spec["serviceAccountName"] = trainer.service_account_name
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
    apply_overrides(pod, job.spec.pod_template_overrides)
    return pod


def desired_children(
    job: TrainingJob, plan: Plan, generation: int, attempt: int, pools: Mapping[str, GPUPool]
) -> Children:
    pods = tuple(
        render_worker_pod(job, plan, worker, generation=generation, attempt=attempt, pools=pools)
        for worker in plan.workers()
    )
    ignored = [
        note for pod in pods for note in ignored_notes(pod["metadata"].get("annotations", {}))
    ]
    return Children(
        configmap=render_configmap(job, plan, generation),
        service=render_service(job),
        pods=pods,
        ignored_overrides=tuple(dict.fromkeys(ignored)),
    )
