"""Render the batch/v1 Jobs (and the one Service) that measure what a TrainingJob lacks.

Compute (`sailplan-profile model`): one Job, one pod on one node of the pool, asking for
as many GPUs as the largest TP degree profiled. Network intra-node: one pod with all the
node's GPUs (one local rank each). Network between nodes: TWO Jobs, node 0 and node 1, each
pod with the smaller node's GPU count (one rank per GPU, for concurrent flows and the
all-reduce over both nodes), plus a headless
Service that gives rank 0 a DNS name (hostname.subdomain) for rank 1's MASTER_ADDR. Two
Jobs rather than one Indexed Job with 2 completions because the two ranks must land on
DIFFERENT pools and zones, and an Indexed Job has one pod template (one node affinity)
for all its indexes; a required pod anti-affinity keeps them on distinct nodes when both
ends are the same pool.

How results reach the profile store (least privilege): the profiler runs as an init
container writing files to an emptyDir; a second container (`report`, no GPU) prints them
as one JSON document between markers (profiling.report) and exits. The operator, which
watches these Jobs, reads that container's log from the succeeded pod (RBAC: `pods/log`
get) and writes a labelled ConfigMap into the profile store (profiling.results). The
profiling pod holds NO API credentials (automountServiceAccountToken: false): a pod
running the user's image never gets write access to the store every other job trusts.
A termination message would avoid the log read but is capped at 4 KiB, less than one
model's compute profiles.

Every object carries an ownerReference to the TrainingJob (deleted with it), labels to
find it again (job, role, need id, rank) and the need itself in an annotation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from sailplan.operator.api.common import GROUP
from sailplan.operator.api.gpupool import (
    GPU_RESOURCE,
    GPUPool,
)
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.profiling.needs import ComputeNeed, Need, NetworkNeed, Site, need_id
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.children import (
    container_security_context,
    node_affinity,
    owner_reference,
    pod_security_context,
    pool_tolerations,
)
from sailplan.operator.reconcile.overrides import apply_to_profiling_pod

ROLE_PROFILER: Final = "profiler"
ROLE_PROFILER_RENDEZVOUS: Final = "profiler-rendezvous"
LABEL_NEED: Final = f"{GROUP}/profile-need"
LABEL_RANK: Final = f"{GROUP}/profile-rank"
NEED_ANNOTATION: Final = f"{GROUP}/profile-need"
MODEL_ANNOTATION: Final = f"{GROUP}/model-spec"

PROFILER_CONTAINER: Final = "profiler"
REPORT_CONTAINER: Final = "report"
RESULTS_DIR: Final = "/results"
MODEL_DIR: Final = "/etc/sailplan/model"
PROFILER_PORT: Final = 29600

# A profiling run measures a few blocks per grid point: minutes. The deadline stops a pod
# whose peer never came (network) or a hung GPU; one retry covers a flaky node, and the
# finished Job lingers an hour so its log can be read after an operator restart.
ACTIVE_DEADLINE_SECONDS: Final = 1800
BACKOFF_LIMIT: Final = 1
TTL_AFTER_FINISHED_SECONDS: Final = 3600


def job_name(job: TrainingJob, need: Need, rank: int | None = None) -> str:
    suffix = "" if rank is None else f"-r{rank}"
    return f"{job.name}-prof-{need_id(need)}{suffix}"


def service_name(job: TrainingJob, need: Need) -> str:
    return f"{job.name}-prof-{need_id(need)}"


def labels(job: TrainingJob, need: Need, role: str = ROLE_PROFILER) -> dict[str, str]:
    return naming.job_labels(job.name, role) | {LABEL_NEED: need_id(need)}


def need_document(need: Need) -> str:
    """The need as JSON (annotation): what the status and the result reader report."""
    if isinstance(need, ComputeNeed):
        body: dict[str, Any] = {
            "key": need.key,
            "kind": "compute",
            "model": need.model.name,
            "gpuType": need.site.gpu_type,
            "tensorParallel": list(need.tensor_parallel),
            "microBatchSizes": list(need.micro_batch_sizes),
            "pool": need.site.gpupool,
            "zone": need.site.zone,
        }
    else:
        body = {
            "key": need.key,
            "kind": "network",
            "link": need.link,
            "gpusPerNode": need.flows,
            "pools": [
                f"{need.site.gpupool}/{need.site.zone}",
                f"{need.peer.gpupool}/{need.peer.zone}",
            ],
        }
    return json.dumps(body, sort_keys=True)


def _pod_spec(
    job: TrainingJob,
    site: Site,
    pool: GPUPool,
    *,
    command: list[str],
    gpus: int,
    env: tuple[dict[str, Any], ...] = (),
    extra_volumes: tuple[dict[str, Any], ...] = (),
    extra_mounts: tuple[dict[str, Any], ...] = (),
) -> dict[str, Any]:
    trainer = job.spec.trainer
    results = {"name": "results", "mountPath": RESULTS_DIR}
    return {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "affinity": {"nodeAffinity": node_affinity(pool, site.zone)},
        "tolerations": pool_tolerations(pool),
        "securityContext": pod_security_context(),
        "initContainers": [
            {
                "name": PROFILER_CONTAINER,
                "image": trainer.image,
                "imagePullPolicy": trainer.image_pull_policy,
                "command": command,
                "env": list(env),
                "resources": {
                    "requests": {
                        "cpu": trainer.cpu,
                        "memory": trainer.memory,
                        GPU_RESOURCE: str(gpus),
                    },
                    "limits": {"memory": trainer.memory, GPU_RESOURCE: str(gpus)},
                },
                "volumeMounts": [results, {"name": "dshm", "mountPath": "/dev/shm"}, *extra_mounts],
                "securityContext": container_security_context(),
            }
        ],
        "containers": [
            {
                "name": REPORT_CONTAINER,
                "image": trainer.image,
                "imagePullPolicy": trainer.image_pull_policy,
                "command": ["python", "-m", "sailplan.operator.profiling.report", RESULTS_DIR],
                "resources": {
                    "requests": {"cpu": "100m", "memory": "256Mi"},
                    "limits": {"memory": "256Mi"},
                },
                "volumeMounts": [{**results, "readOnly": True}],
                "securityContext": container_security_context(),
            }
        ],
        "volumes": [
            {"name": "results", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            *extra_volumes,
        ],
    }


def _job(
    job: TrainingJob,
    name: str,
    need: Need,
    *,
    pod_labels: dict[str, str],
    pod_spec: dict[str, Any],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    metadata = {
        "name": name,
        "namespace": job.namespace,
        "labels": pod_labels,
        "annotations": {NEED_ANNOTATION: need_document(need)},
        "ownerReferences": [owner_reference(job)],
    }
    template = {
        "metadata": {"labels": dict(pod_labels), "annotations": dict(annotations or {})},
        "spec": pod_spec,
    }
    # spec.podTemplateOverrides that concern profiling pods too (which, and why not the
    # others: reconcile.overrides).
    apply_to_profiling_pod(template, job.spec.pod_template_overrides)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "activeDeadlineSeconds": ACTIVE_DEADLINE_SECONDS,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_SECONDS,
            # A spot node taken away is not the profiler's fault: retry without counting.
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    }
                ]
            },
            "template": template,
        },
    }


def render_compute_job(job: TrainingJob, need: ComputeNeed, pool: GPUPool) -> dict[str, Any]:
    """`sailplan-profile model` on one node of the pool; the model comes as a ModelSpec file
    (downward API from an annotation), so catalog and custom models are profiled alike."""
    command = [
        "sailplan-profile",
        "model",
        "--model-file",
        f"{MODEL_DIR}/model.json",
        "--gpu-type",
        need.site.gpu_type,
        "--tp",
        ",".join(map(str, need.tensor_parallel)),
        "--mbs",
        ",".join(map(str, need.micro_batch_sizes)),
        "--out",
        RESULTS_DIR,
    ]
    volume = {
        "name": "model",
        "downwardAPI": {
            "items": [
                {
                    "path": "model.json",
                    "fieldRef": {"fieldPath": f"metadata.annotations['{MODEL_ANNOTATION}']"},
                }
            ]
        },
    }
    mount = {"name": "model", "mountPath": MODEL_DIR, "readOnly": True}
    spec = _pod_spec(
        job,
        need.site,
        pool,
        command=command,
        gpus=max(need.tensor_parallel),
        extra_volumes=(volume,),
        extra_mounts=(mount,),
    )
    return _job(
        job,
        job_name(job, need),
        need,
        pod_labels=labels(job, need),
        pod_spec=spec,
        annotations={MODEL_ANNOTATION: need.model.model_dump_json()},
    )


def _network_command(need: NetworkNeed, site: Site, other: Site) -> list[str]:
    """One rank per GPU the pod holds (`flows`); every measure of the link, filed under that
    node shape (and, between zones, under this pod's and the peer's zones), so the results
    carry the need's key (importing.store_key)."""
    zones = ["--zone", site.zone, "--peer-zone", other.zone] if need.zone_pair else []
    return [
        "sailplan-profile",
        "network",
        "--link",
        need.link,
        "--gpu-type",
        site.gpu_type,
        "--peer-gpu-type",
        other.gpu_type,
        *zones,
        "--gpus-per-node",
        str(need.flows),
        "--procs-per-node",
        str(need.flows),
        "--measure",
        "p2p,concurrent,allreduce",
        "--out",
        RESULTS_DIR,
    ]


def render_network_objects(
    job: TrainingJob, need: NetworkNeed, pools: Mapping[str, GPUPool]
) -> list[dict[str, Any]]:
    """The objects one network need takes: one Job (intra-node), or a Service and two Jobs."""
    if need.link == "intra-node":
        command = _network_command(need, need.site, need.site)
        spec = _pod_spec(job, need.site, pools[need.site.gpupool], command=command, gpus=need.flows)
        return [_job(job, job_name(job, need), need, pod_labels=labels(job, need), pod_spec=spec)]
    service = service_name(job, need)
    rank0_host = job_name(job, need, 0)
    master = f"{rank0_host}.{service}.{job.namespace}.svc"
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": service,
                "namespace": job.namespace,
                "labels": labels(job, need, ROLE_PROFILER_RENDEZVOUS),
                "ownerReferences": [owner_reference(job)],
            },
            "spec": {
                "clusterIP": "None",
                "selector": labels(job, need) | {LABEL_RANK: "0"},
                "publishNotReadyAddresses": True,
                "ports": [{"name": "rendezvous", "port": PROFILER_PORT, "protocol": "TCP"}],
            },
        }
    ]
    ends = ((need.site, need.peer), (need.peer, need.site))
    for rank, (site, other) in enumerate(ends):
        env = [
            {"name": "RANK", "value": str(rank)},
            {"name": "MASTER_ADDR", "value": master},
            {"name": "MASTER_PORT", "value": str(PROFILER_PORT)},
        ]
        command = _network_command(need, site, other)
        spec = _pod_spec(
            job, site, pools[site.gpupool], command=command, gpus=need.flows, env=tuple(env)
        )
        pod_labels = labels(job, need) | {LABEL_RANK: str(rank)}
        # The two ranks never share a node: the link under test is between nodes.
        spec["affinity"]["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": labels(job, need)},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
        if rank == 0:
            spec |= {"hostname": rank0_host, "subdomain": service}
            spec["initContainers"][0]["ports"] = [
                {"name": "rendezvous", "containerPort": PROFILER_PORT}
            ]
        name = job_name(job, need, rank)
        objects.append(_job(job, name, need, pod_labels=pod_labels, pod_spec=spec))
    return objects


def render_profiling_objects(
    job: TrainingJob, needs: tuple[Need, ...], pools: Mapping[str, GPUPool]
) -> list[dict[str, Any]]:
    """Every object to create for `needs` (create each; 409 Conflict means already there).

    `pools` maps GPUPool names to GPUPools; a need whose pool is gone is skipped (the next
    pass computes needs from the pools that exist).
    """
    objects: list[dict[str, Any]] = []
    for need in needs:
        if isinstance(need, ComputeNeed):
            if need.site.gpupool in pools:
                objects.append(render_compute_job(job, need, pools[need.site.gpupool]))
        elif need.site.gpupool in pools and need.peer.gpupool in pools:
            objects.extend(render_network_objects(job, need, pools))
    return objects
