"""Atomic capacity through ProvisioningRequests (autoscaling.x-k8s.io/v1).

A GPUPool whose spec.autoscaling.provisioningRequest is set gets a plan's nodes the way
GKE's queued provisioning (Dynamic Workload Scheduler) and the cluster autoscaler's atomic
scale-up hand them out: the operator creates, per pool and zone of a plan generation, a
ProvisioningRequest whose pod sets reference PodTemplates shaped like the workers, and
creates those workers only once the request is Provisioned. A 64-GPU job then never holds
half its nodes while waiting for the rest. The workers carry the annotations that tell the
autoscaler to place them on the capacity the request booked.

Pure: `capacity_requests` renders the objects from the worker pods the reconcile rendered,
`request_state` reads a request's conditions, `stale_requests` names the ones no current
plan needs. controller/apply.py creates the requests and withholds the workers of a request
that is not Provisioned; controller/runtime.py counts a request that waits or failed against
its zone like a waiting worker (reconcile.scaleup) and deletes the stale ones; a change of a
request's conditions reaches the job and the pools through a watch (controller/registration).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from sailplan.operator.api.common import GROUP as SAILPLAN_GROUP
from sailplan.operator.api.gpupool import ProvisioningRequestOptions
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.nodes import created_at, pod_gpu_reservation

GROUP: Final = "autoscaling.x-k8s.io"
VERSION: Final = "v1"
PLURAL: Final = "provisioningrequests"
KIND: Final = "ProvisioningRequest"
# The autoscaler matches a pod to the capacity a request booked by these annotations
# (cluster-autoscaler provisioningrequest/pods; GKE documents the older cluster-autoscaler.
# kubernetes.io keys, which the autoscaler still reads).
CONSUME_ANNOTATION: Final = f"{GROUP}/consume-provisioning-request"
CLASS_ANNOTATION: Final = f"{GROUP}/provisioning-class-name"
LEGACY_CONSUME_ANNOTATION: Final = "cluster-autoscaler.kubernetes.io/consume-provisioning-request"
LEGACY_CLASS_ANNOTATION: Final = "cluster-autoscaler.kubernetes.io/provisioning-class-name"
ROLE_CAPACITY: Final = "capacity"
LABEL_ZONE: Final = f"{SAILPLAN_GROUP}/zone"
# GPUs the request's workers will take: capacity reserved while they are withheld.
GPUS_ANNOTATION: Final = f"{SAILPLAN_GROUP}/gpus"
# ProvisioningRequest condition types (cluster-autoscaler apis/provisioningrequest/v1).
PROVISIONED: Final = "Provisioned"
FAILED: Final = "Failed"

# TrainingJob Event and Running-condition reasons while its workers wait for capacity.
REASON_CAPACITY_REQUESTED: Final = "CapacityRequested"
REASON_WAITING_FOR_CAPACITY: Final = "WaitingForCapacity"
REASON_CAPACITY_REQUEST_FAILED: Final = "CapacityRequestFailed"

RequestState = Literal["Provisioned", "Failed", "Pending"]


@dataclass(frozen=True)
class CapacityRequest:
    """The ProvisioningRequest for one pool and zone of a plan generation, its PodTemplates
    and the names of the worker pods it books capacity for."""

    name: str
    gpupool: str
    zone: str
    pod_templates: tuple[dict[str, Any], ...]
    request: dict[str, Any]
    pods: tuple[str, ...]


def capacity_requests(
    pods: Sequence[Mapping[str, Any]], options: Mapping[str, ProvisioningRequestOptions]
) -> list[CapacityRequest]:
    """One request per (GPUPool, zone) among `pods` whose GPUPool is in `options`, with one
    pod set per distinct pod shape (GPUs per worker). Deterministic names: the job, plan
    generation, attempt and the group's position in (GPUPool, zone) order."""
    # (GPUPool, zone) -> GPUs per worker -> its workers
    groups: dict[tuple[str, str], dict[int, list[Mapping[str, Any]]]] = {}
    for pod in pods:
        reservation = pod_gpu_reservation(pod)
        if reservation is None or reservation[0] not in options:
            continue
        gpupool, zone, gpus_each = reservation
        groups.setdefault((gpupool, zone), {}).setdefault(gpus_each, []).append(pod)
    out: list[CapacityRequest] = []
    for index, ((gpupool, zone), shapes) in enumerate(sorted(groups.items())):
        members = [pod for shaped in shapes.values() for pod in shaped]
        first = members[0]["metadata"]
        labels = first.get("labels") or {}
        name = (
            f"{labels[naming.LABEL_JOB]}-g{labels[naming.LABEL_GENERATION]}"
            f"-a{labels[naming.LABEL_ATTEMPT]}-c{index}"
        )
        common = {
            **naming.job_labels(labels[naming.LABEL_JOB], ROLE_CAPACITY),
            naming.LABEL_GENERATION: labels[naming.LABEL_GENERATION],
            naming.LABEL_ATTEMPT: labels[naming.LABEL_ATTEMPT],
            naming.LABEL_GPUPOOL: gpupool,
            LABEL_ZONE: zone,
        }
        metadata = {
            "namespace": first["namespace"],
            "labels": common,
            "ownerReferences": first.get("ownerReferences", []),
        }
        templates = []
        pod_sets = []
        for position, (_, shaped) in enumerate(sorted(shapes.items())):
            template_name = f"{name}-t{position}"
            pod = shaped[0]
            pod_labels = {
                k: v for k, v in (pod["metadata"].get("labels") or {}).items() if k in common
            }
            templates.append(
                {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {**metadata, "name": template_name},
                    "template": {"metadata": {"labels": pod_labels}, "spec": pod["spec"]},
                }
            )
            pod_sets.append({"podTemplateRef": {"name": template_name}, "count": len(shaped)})
        option = options[gpupool]
        gpus = sum(gpus_each * len(shaped) for gpus_each, shaped in shapes.items())
        request = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {**metadata, "name": name, "annotations": {GPUS_ANNOTATION: str(gpus)}},
            "spec": {
                "provisioningClassName": option.class_name,
                "podSets": pod_sets,
                **({"parameters": dict(option.parameters)} if option.parameters else {}),
            },
        }
        out.append(
            CapacityRequest(
                name=name,
                gpupool=gpupool,
                zone=zone,
                pod_templates=tuple(templates),
                request=request,
                pods=tuple(p["metadata"]["name"] for p in members),
            )
        )
    return out


def consuming(pod: Mapping[str, Any], request: CapacityRequest) -> dict[str, Any]:
    """`pod` annotated to land on the capacity `request` booked."""
    class_name = str(request.request["spec"]["provisioningClassName"])
    metadata = dict(pod["metadata"])
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        CONSUME_ANNOTATION: request.name,
        CLASS_ANNOTATION: class_name,
        LEGACY_CONSUME_ANNOTATION: request.name,
        LEGACY_CLASS_ANNOTATION: class_name,
    }
    return {**pod, "metadata": metadata}


def request_state(body: Mapping[str, Any] | None) -> tuple[RequestState, str]:
    """Provisioned or Failed (with the autoscaler's message) once a condition says so;
    Pending otherwise, with the newest condition's message when there is one."""
    conditions = ((body or {}).get("status") or {}).get("conditions") or []
    by_type = {c.get("type"): c for c in conditions}
    failed = by_type.get(FAILED)
    if failed is not None and failed.get("status") == "True":
        return "Failed", str(failed.get("message") or failed.get("reason") or "")
    provisioned = by_type.get(PROVISIONED)
    if provisioned is not None and provisioned.get("status") == "True":
        return "Provisioned", str(provisioned.get("message") or "")
    latest = conditions[-1] if conditions else {}
    return "Pending", str(latest.get("message") or latest.get("reason") or "not accepted yet")


def waiting_requests(
    bodies: Sequence[Mapping[str, Any]], timeout_seconds: Mapping[str, int]
) -> dict[str, dict[str, datetime]]:
    """GPUPool -> zone -> since when capacity has been waited for, from the operator's
    requests that are not Provisioned: their creation time, or, for a Failed one, a time
    the zone's timeout (`timeout_seconds` by GPUPool) already lies behind, so the zone is
    backed off at once (reconcile.scaleup)."""
    out: dict[str, dict[str, datetime]] = {}
    for body in bodies:
        labels = (body.get("metadata") or {}).get("labels") or {}
        gpupool, zone = labels.get(naming.LABEL_GPUPOOL), labels.get(LABEL_ZONE)
        created = created_at(body)
        state, _ = request_state(body)
        if not gpupool or not zone or created is None or state == "Provisioned":
            continue
        if state == "Failed":
            created -= timedelta(seconds=timeout_seconds.get(gpupool, 0))
        zones = out.setdefault(gpupool, {})
        zones[zone] = min(created, zones.get(zone, created))
    return out


def request_reservations(bodies: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, int]]:
    """(GPUPool, zone, GPUs) of the requests whose workers are still withheld (not
    Provisioned, not Failed): capacity no other job may plan onto meanwhile, as unbound
    workers reserve theirs (reconcile.nodes.pod_gpu_reservation)."""
    out = []
    for body in bodies:
        metadata = body.get("metadata") or {}
        labels = metadata.get("labels") or {}
        gpupool, zone = labels.get(naming.LABEL_GPUPOOL), labels.get(LABEL_ZONE)
        try:
            gpus = int((metadata.get("annotations") or {}).get(GPUS_ANNOTATION, "0"))
        except ValueError:
            gpus = 0
        if gpupool and zone and gpus > 0 and request_state(body)[0] == "Pending":
            out.append((str(gpupool), str(zone), gpus))
    return out


def stale_requests(
    bodies: Sequence[Mapping[str, Any]], *, generation: int | None, attempt: int, active: bool
) -> list[Mapping[str, Any]]:
    """The requests among one job's `bodies` that no worker of its current plan will
    consume: every one of another plan generation or attempt than (`generation`,
    `attempt`), and all of them once the job is not `active` (finished, suspended, no
    plan). Deleting them un-pins their capacity (the autoscaler drops the booking, an
    unused node scales down). Sorted by name."""
    out = []
    for body in bodies:
        labels = (body.get("metadata") or {}).get("labels") or {}
        current = (
            active
            and generation is not None
            and labels.get(naming.LABEL_GENERATION) == str(generation)
            and labels.get(naming.LABEL_ATTEMPT) == str(attempt)
        )
        if not current:
            out.append(body)
    return sorted(out, key=lambda b: str((b.get("metadata") or {}).get("name", "")))


def pod_template_names(body: Mapping[str, Any]) -> list[str]:
    """The PodTemplates a request's pod sets reference (created with it, deleted with it)."""
    pod_sets = (body.get("spec") or {}).get("podSets") or []
    return [
        str(ref["name"])
        for ref in (s.get("podTemplateRef") or {} for s in pod_sets)
        if ref.get("name")
    ]
