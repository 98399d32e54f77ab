"""Builders of the Kueue tests: a TrainingJob in a queue, its Workload as Kueue leaves it,
and the queues a cluster admin defines.

The pure reconcile tests (test_reconcile_kueue.py) and the cluster tests against the real
Kueue (test_kueue_cluster.py) both build from here, so a job is queued, and a Workload
reads, the same way in both.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from sailplan.operator.api.common import find_condition
from sailplan.operator.api.trainingjob import TrainingJob, TrainingJobStatus
from sailplan.operator.reconcile import kueue
from sailplan.operator.reconcile.trainingjob import Observed

QUEUE = "team-a-gpus"
KUEUE_API = ("kueue.x-k8s.io", "v1beta1")

Job = TypeVar("Job", TrainingJob, dict[str, Any])


def queued(job: Job, queue: str = QUEUE) -> Job:
    """`job` (a TrainingJob model or a body to create) with the queue label."""
    if isinstance(job, TrainingJob):
        return job.model_copy(update={"labels": {**job.labels, kueue.QUEUE_LABEL: queue}})
    metadata = job.setdefault("metadata", {})
    metadata["labels"] = {**(metadata.get("labels") or {}), kueue.QUEUE_LABEL: queue}
    return job


def admitted(status: TrainingJobStatus | dict[str, Any]) -> tuple[str, str, str] | None:
    """The job's Admitted condition as (status, reason, message), from a status model or
    the status of a body read from the API server."""
    if isinstance(status, TrainingJobStatus):
        found = find_condition(status.conditions, kueue.COND_ADMITTED)
        return (found.status, found.reason, found.message) if found else None
    for condition in status.get("conditions") or ():
        if condition["type"] == kueue.COND_ADMITTED:
            return condition["status"], condition["reason"], condition.get("message", "")
    return None


# -- a Workload as Kueue leaves it ---------------------------------------------------------
ADMITTED = {
    "QuotaReserved": ("True", "QuotaReserved", "Quota reserved in ClusterQueue gpus"),
    "Admitted": ("True", "Admitted", "The workload is admitted"),
}
NO_QUOTA = {
    "QuotaReserved": (
        "False",
        "Pending",
        "couldn't assign flavors to pod set a100: insufficient unused quota for "
        "nvidia.com/gpu in flavor a100, 4 more needed",
    )
}
EVICTED = {
    "QuotaReserved": ("True", "QuotaReserved", ""),
    "Admitted": ("True", "Admitted", ""),
    "Evicted": ("True", "Preempted", "Preempted to accommodate a workload of higher priority"),
}


def workload_status(
    workload: dict[str, Any], resource_version: str = "", **conditions: tuple[str, str, str]
) -> dict[str, Any]:
    """The Workload as Kueue left it: conditions type -> (status, reason, message)."""
    status: dict[str, Any] = {
        "conditions": [
            {"type": type_, "status": s, "reason": reason, "message": message}
            for type_, (s, reason, message) in conditions.items()
        ]
    }
    if conditions.get("QuotaReserved", ("False",))[0] == "True":
        status["admission"] = {"clusterQueue": "gpus"}
    body = workload | {"status": status}
    if resource_version:
        body = body | {"metadata": workload["metadata"] | {"resourceVersion": resource_version}}
    return body


def observed_with(observed: Observed, *bodies: dict[str, Any]) -> Observed:
    """`observed` with these Workloads read."""
    workloads = tuple(w for w in map(kueue.observed_workload, bodies) if w is not None)
    return dataclasses.replace(observed, workloads=workloads)


# -- the queues (docs/guide/kueue.md shows the same) ---------------------------------------
def queue_objects(
    namespace: str,
    flavor: str,
    node_pool: str,
    cluster_queue: str,
    queue: str,
    *,
    gpus: int,
    preemption: dict[str, str] | None = None,
) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """What a cluster admin defines, each with its CustomObjectsApi path (group, version,
    [namespace,] plural): the pool's ResourceFlavor, a ClusterQueue with `gpus` of quota in
    it, a LocalQueue in the job's namespace."""
    api_version = "/".join(KUEUE_API)
    return [
        (
            (*KUEUE_API, "resourceflavors"),
            {
                "apiVersion": api_version,
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
                "spec": {"nodeLabels": {"cloud.google.com/gke-nodepool": node_pool}},
            },
        ),
        (
            (*KUEUE_API, "clusterqueues"),
            {
                "apiVersion": api_version,
                "kind": "ClusterQueue",
                "metadata": {"name": cluster_queue},
                "spec": {
                    "namespaceSelector": {},
                    **({"preemption": preemption} if preemption else {}),
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", kueue.GPU_RESOURCE],
                            "flavors": [
                                {
                                    "name": flavor,
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "1000"},
                                        {"name": "memory", "nominalQuota": "10Ti"},
                                        {"name": kueue.GPU_RESOURCE, "nominalQuota": gpus},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        ),
        (
            (*KUEUE_API, namespace, "localqueues"),
            {
                "apiVersion": api_version,
                "kind": "LocalQueue",
                "metadata": {"name": queue, "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue},
            },
        ),
    ]
