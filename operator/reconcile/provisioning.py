"""Atomic capacity through ProvisioningRequests (autoscaling.x-k8s.io/v1).

A GPUPool whose spec.autoscaling.provisioningRequest is set gets a plan's nodes the way
GKE's queued provisioning (Dynamic Workload Scheduler) and the cluster autoscaler's atomic
scale-up hand them out: the operator creates, per pool and zone of a plan generation, a
ProvisioningRequest whose pod sets reference PodTemplates shaped like the workers, and
creates those workers only once the request is Provisioned. A 64-GPU job then never holds
half its nodes while waiting for the rest. The workers carry the annotations that tell the
autoscaler to place them on the capacity the request booked.

A request of a class no autoscaler serves never gets a condition (the cluster autoscaler
skips classes it does not know without a word). The autoscalers that serve a class mark
its requests Accepted, one per loop (cluster-autoscaler processors/provreq: one request per
loop of --scan-interval, 10 s by default), so a request still without any condition
`acceptanceTimeoutSeconds` after its creation, while no request of its class has one, is
taken as not served: its zone backs off like a Failed request's, the job says
ProvisioningClassNotServed, and the pool's ProvisioningClassServed condition is False. The
job's own ProvisioningClassServed condition (`job_class_condition`) is re-derived from its
pools' each pass, so it holds across the job's replans while the class is still not served.

Pure: `capacity_requests` renders the objects from the worker pods the reconcile rendered,
`request_state` reads a request's conditions, `verdicts` finds the requests no autoscaler
answers, `stale_requests` names the ones no current plan needs. controller/apply.py creates the requests and withholds the workers of a request
that is not Provisioned; controller/runtime.py counts a request that waits or failed against
its zone like a waiting worker (reconcile.scaleup) and deletes the stale ones; a change of a
request's conditions reaches the job and the pools through a watch (controller/registration).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from sailplan.operator.api.common import GROUP as SAILPLAN_GROUP
from sailplan.operator.api.common import Condition, find_condition
from sailplan.operator.api.gpupool import GPUPool, ProvisioningRequestOptions
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
REASON_CLASS_NOT_SERVED: Final = "ProvisioningClassNotServed"

# The provisioning classes an autoscaler is known to serve: GKE's queued provisioning (DWS)
# and the cluster autoscaler's own (provisioningrequest.SupportedProvisioningClasses).
KNOWN_CLASSES: Final = (
    "queued-provisioning.gke.io",
    "check-capacity.autoscaling.x-k8s.io",
    "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
)
# GPUPool condition (pools with spec.autoscaling.provisioningRequest): whether an autoscaler
# answers requests of the pool's class.
CLASS_SERVED: Final = "ProvisioningClassServed"
REASON_ANSWERED: Final = "Answered"
REASON_NONE_UNANSWERED: Final = "NoneUnanswered"  # the job's condition, once none is False
REASON_NOT_ASKED_YET: Final = "NotAskedYet"
REASON_UNKNOWN_CLASS: Final = "UnknownProvisioningClass"
CLASS_FIELD: Final = "spec.autoscaling.provisioningRequest.className"

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


def request_key(body: Mapping[str, Any]) -> str:
    """namespace/name: a request's identity across namespaces."""
    metadata = body.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def class_of(body: Mapping[str, Any]) -> str:
    return str((body.get("spec") or {}).get("provisioningClassName") or "")


@dataclass(frozen=True)
class Unanswered:
    """A request no autoscaler answered within its pool's acceptance timeout."""

    gpupool: str
    zone: str
    class_name: str
    seconds: int  # the timeout it outlived


@dataclass(frozen=True)
class Verdicts:
    """What the operator's requests say about the autoscalers: the classes with a request
    that has any condition (some autoscaler serves them), and the requests (by
    `request_key`) of classes that none serves."""

    answered: frozenset[str] = frozenset()
    unanswered: Mapping[str, Unanswered] = field(default_factory=dict)
    # When the next request without a condition reaches its timeout (None: none will).
    next_due: datetime | None = None


def verdicts(
    bodies: Sequence[Mapping[str, Any]], acceptance_seconds: Mapping[str, int], now: datetime
) -> Verdicts:
    """Judge the operator's requests `bodies` at `now`: one without any condition is
    unanswered once it is older than its GPUPool's acceptance timeout (`acceptance_seconds`
    by GPUPool; pools not in it are not judged) while no request of its class has a
    condition (a served class's request may just wait its turn behind others)."""
    answered = frozenset(
        class_of(b) for b in bodies if ((b.get("status") or {}).get("conditions") or [])
    )
    unanswered: dict[str, Unanswered] = {}
    due: list[datetime] = []
    for body in bodies:
        labels = (body.get("metadata") or {}).get("labels") or {}
        gpupool, zone = labels.get(naming.LABEL_GPUPOOL), labels.get(LABEL_ZONE)
        created = created_at(body)
        class_name = class_of(body)
        seconds = acceptance_seconds.get(str(gpupool))
        if (
            not gpupool
            or not zone
            or created is None
            or seconds is None
            or class_name in answered
            or ((body.get("status") or {}).get("conditions") or [])
        ):
            continue
        deadline = created + timedelta(seconds=seconds)
        if now >= deadline:
            unanswered[request_key(body)] = Unanswered(str(gpupool), str(zone), class_name, seconds)
        else:
            due.append(deadline)
    return Verdicts(answered, unanswered, min(due) if due else None)


def requester(body: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(namespace, name, uid) of the TrainingJob a request is for: its job label and its
    controlling owner reference (None when either is missing)."""
    metadata = body.get("metadata") or {}
    job = (metadata.get("labels") or {}).get(naming.LABEL_JOB)
    uid = next(
        (
            str(ref.get("uid"))
            for ref in metadata.get("ownerReferences") or ()
            if ref.get("controller") and ref.get("uid")
        ),
        None,
    )
    if not job or uid is None:
        return None
    return str(metadata.get("namespace") or ""), str(job), uid


def not_served_message(request: Unanswered) -> str:
    """Why the request's workers will not come, and what to change."""
    return (
        f"no autoscaler answered a ProvisioningRequest of class {request.class_name} within "
        f"{request.seconds} s (none of that class has a condition): install the autoscaler "
        f"that serves it, or set {CLASS_FIELD} of GPUPool {request.gpupool} to a class that "
        f"one serves ({', '.join(KNOWN_CLASSES)})"
    )


def job_class_condition(pools: Sequence[GPUPool], previous: Condition | None) -> Condition | None:
    """The TrainingJob's ProvisioningClassServed condition from the GPUPools it may use
    (`pools`): False with reason ProvisioningClassNotServed, naming the pool, while one of
    them that asks for capacity through ProvisioningRequests says no autoscaler serves its
    class (the pool's condition stays so until a request of the class is answered or the
    pool's spec changes); True once none does, where the job showed it (`previous`); else
    None, nothing to show."""
    for pool in sorted(pools, key=lambda p: p.name):
        autoscaling = pool.spec.autoscaling
        if autoscaling is None or autoscaling.provisioning_request is None:
            continue
        served = find_condition(pool.status.conditions, CLASS_SERVED)
        if served is not None and served.status == "False":
            return Condition(
                type=CLASS_SERVED,
                status="False",
                reason=REASON_CLASS_NOT_SERVED,
                message=f"GPUPool {pool.name}: {served.message}",
            )
    if previous is None:
        return None
    return Condition(
        type=CLASS_SERVED,
        status="True",
        reason=REASON_NONE_UNANSWERED,
        message="no GPUPool the job may use asks for capacity of a class no autoscaler answers",
    )


def class_condition(
    class_name: str, gpupool: str, found: Verdicts, previous: Condition | None
) -> Condition:
    """The pool's ProvisioningClassServed condition: True once a request of its class has a
    condition, False while one of the pool's requests is unanswered; otherwise the previous
    one (the caller drops it when the spec changed), else Unknown, with reason
    UnknownProvisioningClass for a class that is none of KNOWN_CLASSES (a warning, not a
    refusal: an autoscaler may serve classes this list does not know)."""
    mine = [u for u in found.unanswered.values() if u.gpupool == gpupool]
    if mine:
        return Condition(
            type=CLASS_SERVED,
            status="False",
            reason=REASON_CLASS_NOT_SERVED,
            message=not_served_message(mine[0]),
        )
    if class_name in found.answered:
        return Condition(
            type=CLASS_SERVED,
            status="True",
            reason=REASON_ANSWERED,
            message=f"an autoscaler answers ProvisioningRequests of class {class_name}",
        )
    if previous is not None:
        return previous
    if class_name not in KNOWN_CLASSES:
        return Condition(
            type=CLASS_SERVED,
            status="Unknown",
            reason=REASON_UNKNOWN_CLASS,
            message=f"{CLASS_FIELD} {class_name} is none of the classes an autoscaler is known "
            f"to serve ({', '.join(KNOWN_CLASSES)}); if none serves it, its requests get no "
            "answer and the zone backs off after acceptanceTimeoutSeconds",
        )
    return Condition(
        type=CLASS_SERVED,
        status="Unknown",
        reason=REASON_NOT_ASKED_YET,
        message=f"no ProvisioningRequest of class {class_name} has been answered yet",
    )


def waiting_requests(
    bodies: Sequence[Mapping[str, Any]],
    timeout_seconds: Mapping[str, int],
    unanswered: Collection[str] = (),
) -> dict[str, dict[str, datetime]]:
    """GPUPool -> zone -> since when capacity has been waited for, from the operator's
    requests that are not Provisioned: their creation time, or, for a Failed one or one no
    autoscaler answers (`unanswered`: request keys), a time the zone's timeout
    (`timeout_seconds` by GPUPool) already lies behind, so the zone is backed off at once
    (reconcile.scaleup)."""
    out: dict[str, dict[str, datetime]] = {}
    for body in bodies:
        labels = (body.get("metadata") or {}).get("labels") or {}
        gpupool, zone = labels.get(naming.LABEL_GPUPOOL), labels.get(LABEL_ZONE)
        created = created_at(body)
        state, _ = request_state(body)
        if not gpupool or not zone or created is None or state == "Provisioned":
            continue
        if state == "Failed" or request_key(body) in unanswered:
            created -= timedelta(seconds=timeout_seconds.get(gpupool, 0))
        zones = out.setdefault(gpupool, {})
        zones[zone] = min(created, zones.get(zone, created))
    return out


def request_reservations(
    bodies: Sequence[Mapping[str, Any]],
    unanswered: Collection[str] = (),
    *,
    besides: tuple[str, str] | None = None,
) -> list[tuple[str, str, int]]:
    """(GPUPool, zone, GPUs) of the requests whose workers are still withheld (not
    Provisioned, not Failed, not `unanswered`): capacity no other job may plan onto
    meanwhile, as unbound workers reserve theirs (reconcile.nodes.pod_gpu_reservation).
    The requests of the job `besides` (namespace, name) are left out: they book its own
    plan's capacity, which must not count against that plan."""
    out = []
    for body in bodies:
        metadata = body.get("metadata") or {}
        labels = metadata.get("labels") or {}
        if besides is not None and (metadata.get("namespace"), labels.get(naming.LABEL_JOB)) == (
            besides
        ):
            continue
        gpupool, zone = labels.get(naming.LABEL_GPUPOOL), labels.get(LABEL_ZONE)
        try:
            gpus = int((metadata.get("annotations") or {}).get(GPUS_ANNOTATION, "0"))
        except ValueError:
            gpus = 0
        if (
            gpupool
            and zone
            and gpus > 0
            and request_state(body)[0] == "Pending"
            and request_key(body) not in unanswered
        ):
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
