"""Kueue admission of TrainingJobs labelled `kueue.x-k8s.io/queue-name`.

Kueue admits the workloads of the job kinds it integrates; TrainingJob is not one of them,
so the operator is its integration, as the Spark operator or AppWrapper are for theirs: it
creates the Kueue `Workload` (kueue.x-k8s.io/v1beta1, owned by the TrainingJob) and starts
workers only once Kueue admitted it. Kueue's Workload controller, scheduler and quota
accounting never look at the owner's kind, so nothing has to be registered in Kueue.

A Workload describes one plan generation: one pod set per (GPUPool, GPUs per worker) of
the plan, `count` workers each asking for `nvidia.com/gpu`, pinned by the workers' own node
affinity to the pool, so the ResourceFlavor whose nodeLabels are the pool's is the one
Kueue charges: the plan's GPUs are admitted as one gang under the ClusterQueue's quota per
flavor. Kueue does not allow an admitted Workload's pod sets to change, so a new plan
generation normally gets a new Workload and the old one is deleted (its quota released),
which queues the job again; where Kueue allows it the job's Workload is carried over
instead (`_carry_over`: a waiting one takes the new pod sets and keeps its place in the
queue, an admitted one whose quota covers the new plan keeps its admission). A Workload that loses its admission (Kueue evicted or preempted it)
while workers run suspends the job for the pass, as spec.suspend does (checkpoint, then the
pods go); the job then plans anew and queues a new Workload. A finished job's Workloads are
deleted, which returns their quota.

Pure. reconcile.trainingjob calls `evicted` before a pass and `admit` after it;
controller.observation reads the job's Workloads (None where Kueue's API is not served),
controller.apply creates and deletes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Final

from kubernetes.utils import parse_quantity as _parse_quantity

from sailplan.operator.api.common import Condition, find_condition
from sailplan.operator.api.trainingjob import (
    COND_RUNNING,
    COND_SUSPENDED,
    PHASE_SUSPENDED,
    TrainingJob,
)
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.children import owner_reference
from sailplan.operator.reconcile.nodes import requested_gpus
from sailplan.operator.reconcile.summary import KubeEvent

QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta1"
PLURAL: Final = "workloads"
KIND: Final = "Workload"
ROLE_WORKLOAD: Final = "workload"
GPU_RESOURCE: Final = "nvidia.com/gpu"
# Where a Workload's priority comes from when it is the workers' PriorityClass (Kueue's
# constants.PodPriorityClassSource): Kueue preempts lower-priority Workloads for it.
POD_PRIORITY_CLASS_SOURCE: Final = "scheduling.k8s.io/priorityclass"

# The TrainingJob's condition about its Workload, and its reasons.
COND_ADMITTED: Final = "Admitted"
REASON_ADMITTED: Final = "Admitted"
REASON_WORKLOAD_CREATED: Final = "WorkloadCreated"
# A replan's pod sets written into the job's pending Workload, which keeps its place.
REASON_WORKLOAD_UPDATED: Final = "WorkloadUpdated"
REASON_PENDING: Final = "Pending"  # Kueue's own reason: no quota (yet)
REASON_QUEUE_NOT_FOUND: Final = "QueueNotFound"
REASON_INADMISSIBLE: Final = "Inadmissible"
REASON_EVICTED: Final = "Evicted"
REASON_KUEUE_NOT_INSTALLED: Final = "KueueNotInstalled"
# Running=False while the workers wait for admission, and Suspended=True (the queue
# suspends the job, as Kueue's own integrations show it through spec.suspend); Suspended
# has reason Evicted after an eviction, and turns False with reason Admitted.
REASON_AWAITING_ADMISSION: Final = "AwaitingAdmission"
_QUEUE_SUSPENSIONS: Final = (REASON_AWAITING_ADMISSION, REASON_EVICTED)

# Where the Workloads are watched (Kueue installed when the operator started) a change of
# one runs the job's pass at once and nothing is polled. Else (Kueue installed later) the
# operator looks again soon after creating one (Kueue admits within a second when quota
# is free), this often while it waits, and this often while it runs (to notice an
# eviction).
CREATED_POLL_SECONDS: Final = 1.0
WAITING_POLL_SECONDS: Final = 5.0
ADMITTED_POLL_SECONDS: Final = 15.0
MISSING_POLL_SECONDS: Final = 60.0

# Kubernetes' quantity parser ("500m", "4Gi"), typed.
parse_quantity: Callable[[object], Decimal] = _parse_quantity


@dataclass(frozen=True)
class ObservedWorkload:
    """One of the job's Workloads as Kueue left it."""

    name: str
    generation: int
    owner_uid: str
    admitted: bool  # quota reserved and admitted, not evicted: the workers may run
    reason: str  # why not (or REASON_ADMITTED)
    message: str
    cluster_queue: str = ""
    deleting: bool = False
    # QuotaReserved=True: Kueue holds quota for it (admitted, or evicted and not yet
    # released); its pod sets may not change.
    reserved: bool = False
    resource_version: str = ""
    # (GPUPool, resource, amount): what its pod sets ask for in all, per pool (flavor).
    charged: tuple[tuple[str, str, float], ...] = ()


def queue_of(job: TrainingJob) -> str:
    return job.labels.get(QUEUE_LABEL, "")


def workload_name(job: str, generation: int) -> str:
    return f"{job}-g{generation}"


def _conditions(body: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    items = (body.get("status") or {}).get("conditions") or []
    return {str(c.get("type")): c for c in items if isinstance(c, Mapping)}


def observed_workload(body: Mapping[str, Any]) -> ObservedWorkload | None:
    """A Workload of the operator's as the reconcile sees it; None without its labels."""
    metadata = body.get("metadata") or {}
    labels = metadata.get("labels") or {}
    try:
        generation = int(labels[naming.LABEL_GENERATION])
    except (KeyError, ValueError):
        return None
    owners = [o for o in metadata.get("ownerReferences") or () if o.get("controller")]
    conditions = _conditions(body)

    def true(type_: str) -> bool:
        return conditions.get(type_, {}).get("status") == "True"

    admission = (body.get("status") or {}).get("admission") or {}
    cluster_queue = str(admission.get("clusterQueue") or "")
    admitted = true("QuotaReserved") and true("Admitted") and not true("Evicted")
    if admitted:
        reason, message = REASON_ADMITTED, f"admitted by ClusterQueue {cluster_queue}"
    elif true("Evicted"):
        evicted = conditions["Evicted"]
        reason = REASON_EVICTED
        message = str(evicted.get("message") or evicted.get("reason") or "evicted")
    else:
        reserved = conditions.get("QuotaReserved", {})
        message = str(reserved.get("message") or "")
        reason = str(reserved.get("reason") or REASON_PENDING)
        if reason == REASON_INADMISSIBLE and "doesn't exist" in message:
            reason = REASON_QUEUE_NOT_FOUND
        if not message:
            message = "not looked at by Kueue yet"
    return ObservedWorkload(
        name=str(metadata.get("name", "")),
        generation=generation,
        owner_uid=str(owners[0].get("uid", "")) if owners else "",
        admitted=admitted,
        reason=reason,
        message=message,
        cluster_queue=cluster_queue,
        deleting=bool(metadata.get("deletionTimestamp")),
        reserved=true("QuotaReserved"),
        resource_version=str(metadata.get("resourceVersion") or ""),
        charged=charged(body),
    )


def charged(workload: Mapping[str, Any]) -> tuple[tuple[str, str, float], ...]:
    """(GPUPool, resource, total) over a Workload's pod sets: what Kueue charges to the
    pool's flavor when it admits it."""
    totals: dict[tuple[str, str], float] = {}
    for pod_set in (workload.get("spec") or {}).get("podSets") or ():
        template = pod_set.get("template") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        pool = str(labels.get(naming.LABEL_GPUPOOL, ""))
        count = int(pod_set.get("count") or 0)
        for container in (template.get("spec") or {}).get("containers") or ():
            requests = (container.get("resources") or {}).get("requests") or {}
            for resource, quantity in requests.items():
                try:
                    amount = float(parse_quantity(quantity))
                except ValueError:
                    continue
                key = (pool, str(resource))
                totals[key] = totals.get(key, 0.0) + count * amount
    return tuple(sorted((pool, resource, total) for (pool, resource), total in totals.items()))


def fits_within(
    asked: Sequence[tuple[str, str, float]], admitted: Sequence[tuple[str, str, float]]
) -> bool:
    """Whether every pool's `asked` resources are at most what `admitted` holds there."""
    held = {(pool, resource): total for pool, resource, total in admitted}
    return all(total <= held.get((pool, resource), 0.0) for pool, resource, total in asked)


def _pod_set_name(gpupool: str, gpus: int, shapes: int) -> str:
    # A DNS label (pool names may hold dots); the GPU count only where a pool has several.
    base = gpupool.replace(".", "-")
    name = f"{base[:50]}-{gpus}gpu" if shapes > 1 else base[:63]
    return name.strip("-") or "workers"


def _template(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What Kueue needs of a worker: its requests (the quota it takes) and where it may
    run (node affinity, tolerations: the flavor it fits), nothing per rank."""
    spec = pod.get("spec") or {}
    template: dict[str, Any] = {
        "restartPolicy": spec.get("restartPolicy", "Never"),
        "containers": [
            {"name": c["name"], "image": c.get("image", ""), "resources": c.get("resources", {})}
            for c in spec.get("containers") or ()
        ],
    }
    for key in ("nodeSelector", "affinity", "tolerations", "priorityClassName"):
        if spec.get(key):
            template[key] = spec[key]
    return template


def render_workload(
    job: TrainingJob,
    generation: int,
    pods: Sequence[Mapping[str, Any]],
    queue: str,
    priority: int = 0,
) -> dict[str, Any]:
    """The Workload of plan generation `generation`, from all of its rendered workers: one
    pod set per (GPUPool, GPUs per worker), in that order (Kueue allows at most 8). Workers
    with a PriorityClass give it its name and `priority` (its value) to the Workload, as
    Kueue's own integrations do, so Kueue orders and preempts by it."""
    groups: dict[str, dict[int, list[Mapping[str, Any]]]] = {}
    for pod in pods:
        pool = str((pod["metadata"].get("labels") or {}).get(naming.LABEL_GPUPOOL, ""))
        groups.setdefault(pool, {}).setdefault(requested_gpus(pod), []).append(pod)
    pod_sets = [
        {
            "name": _pod_set_name(pool, gpus, len(shapes)),
            "count": len(members),
            "template": {
                "metadata": {"labels": {naming.LABEL_GPUPOOL: pool}},
                "spec": _template(members[0]),
            },
        }
        for pool, shapes in sorted(groups.items())
        for gpus, members in sorted(shapes.items())
    ]
    spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets}
    priority_class = next(
        (p["spec"]["priorityClassName"] for p in pods if p["spec"].get("priorityClassName")), ""
    )
    if priority_class:
        spec |= {
            "priorityClassName": priority_class,
            "priorityClassSource": POD_PRIORITY_CLASS_SOURCE,
            "priority": priority,
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": workload_name(job.name, generation),
            "namespace": job.namespace,
            "labels": {
                **naming.job_labels(job.name, ROLE_WORKLOAD),
                naming.LABEL_GENERATION: str(generation),
                QUEUE_LABEL: queue,
            },
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def gang_summary(workload: Mapping[str, Any]) -> str:
    """'8 GPUs: a100-pool 2x4' — what a Workload asks Kueue for."""
    parts = []
    total = 0
    for pod_set in workload["spec"]["podSets"]:
        containers = pod_set["template"]["spec"]["containers"]
        each = sum(
            int((c.get("resources") or {}).get("requests", {}).get(GPU_RESOURCE, 0) or 0)
            for c in containers
        )
        total += each * pod_set["count"]
        pool = pod_set["template"]["metadata"]["labels"][naming.LABEL_GPUPOOL]
        parts.append(f"{pool} {pod_set['count']}x{each}")
    return f"{total} GPUs: {', '.join(parts)}"


def evicted(
    job: TrainingJob, workloads: Sequence[ObservedWorkload] | None, live_pods: Sequence[int]
) -> ObservedWorkload | None:
    """The current generation's Workload when it lost its admission while workers of that
    generation are alive (`live_pods`: their generations): those were started under the
    admission, so Kueue evicted or preempted the job, which must stop as if suspended."""
    if not queue_of(job) or not workloads or job.memory.replan is None:
        return None
    generation = job.memory.replan.generation
    current = next((w for w in workloads if w.generation == generation), None)
    if current is None or current.admitted or current.deleting:
        return None
    return current if generation in live_pods else None


@dataclass(frozen=True)
class Admission:
    """What the Kueue side changes in a pass: the creations (withheld workers removed, the
    Workload added), Workloads to delete, conditions to set, Events, when to look again."""

    create: tuple[dict[str, Any], ...]
    delete_workloads: tuple[str, ...] = ()
    # (Workload name, merge patch): an earlier Workload carried over to this generation.
    patch_workloads: tuple[tuple[str, dict[str, Any]], ...] = ()
    conditions: tuple[Condition, ...] = ()
    events: tuple[KubeEvent, ...] = ()
    requeue_after: float | None = None
    # PHASE_SUSPENDED while the queue holds the workers back (the pass said Pending).
    phase: str | None = None


def admit(
    job: TrainingJob,
    workloads: Sequence[ObservedWorkload] | None,
    create: Sequence[dict[str, Any]],
    *,
    generation: int | None,
    generation_pods: Sequence[Mapping[str, Any]],
    finished: bool,
    previous: Condition | None,
    priority: int = 0,
    watched: bool = False,
) -> Admission | None:
    """Gate the pass's worker creations on the Workload of plan generation `generation`
    (`generation_pods`: all its rendered workers; `priority`: the value of their
    PriorityClass; `watched`: the Workloads are watched, so no pass is asked for to look
    at them again). None: the job is not queued."""
    admission = _admit(
        job,
        workloads,
        create,
        generation=generation,
        generation_pods=generation_pods,
        finished=finished,
        previous=previous,
        priority=priority,
    )
    if admission is None or not watched or workloads is None:
        return admission
    return replace(admission, requeue_after=None)


def _admit(
    job: TrainingJob,
    workloads: Sequence[ObservedWorkload] | None,
    create: Sequence[dict[str, Any]],
    *,
    generation: int | None,
    generation_pods: Sequence[Mapping[str, Any]],
    finished: bool,
    previous: Condition | None,
    priority: int,
) -> Admission | None:
    queue = queue_of(job)
    if not queue:
        return None
    observed = job.generation
    others = tuple(o for o in create if o["kind"] != "Pod")
    pods = [o for o in create if o["kind"] == "Pod"]
    if finished:
        # Deleting the Workload returns its quota (Kueue's own integrations mark theirs
        # Finished instead; that needs write access to Workload status).
        names = tuple(w.name for w in workloads or () if not w.deleting)
        return Admission(tuple(create), delete_workloads=names)
    if workloads is None:
        message = (
            f"label {QUEUE_LABEL}={queue} asks for Kueue admission, but the API server does "
            "not serve workloads.kueue.x-k8s.io (Kueue is not installed): install Kueue or "
            "remove the label"
        )
        return _waiting(
            job,
            others,
            reason=REASON_KUEUE_NOT_INSTALLED,
            message=message,
            previous=previous,
            poll_seconds=MISSING_POLL_SECONDS,
        )
    if generation is None:
        return Admission(tuple(create))  # nothing planned yet: nothing to queue
    stale = tuple(w.name for w in workloads if w.generation != generation and not w.deleting)
    current = next((w for w in workloads if w.generation == generation), None)
    if current is None or current.deleting:
        if not pods or not generation_pods:
            return Admission(tuple(create), delete_workloads=stale)
        workload = render_workload(job, generation, generation_pods, queue, priority)
        carried = _carry_over(
            job,
            workloads,
            workload,
            generation=generation,
            create=create,
            others=others,
            previous=previous,
            queue=queue,
        )
        if carried is not None:
            return carried
        message = (
            f"Workload {workload['metadata']['name']} ({gang_summary(workload)}) queued in "
            f"LocalQueue {queue}; the workers start once Kueue admits it"
        )
        waiting = _waiting(
            job,
            (*others, workload),
            reason=REASON_WORKLOAD_CREATED,
            message=message,
            previous=previous,
            poll_seconds=CREATED_POLL_SECONDS,
        )
        return _with(waiting, delete_workloads=stale)
    if current.admitted:
        condition = Condition(
            type=COND_ADMITTED,
            status="True",
            reason=REASON_ADMITTED,
            message=f"Workload {current.name} {current.message}",
            observed_generation=observed,
        )
        events: tuple[KubeEvent, ...] = ()
        if previous is None or previous.status != "True":
            events = (KubeEvent("Normal", REASON_ADMITTED, condition.message),)
        return Admission(
            tuple(create),
            delete_workloads=stale,
            conditions=(condition, *_resumed(job, condition.message)),
            events=events,
            requeue_after=ADMITTED_POLL_SECONDS,
        )
    message = f"Workload {current.name}: {current.message}"
    if current.reason == REASON_QUEUE_NOT_FOUND:
        message += f" (label {QUEUE_LABEL}: name a LocalQueue of namespace {job.namespace})"
    waiting = _waiting(
        job,
        others,
        reason=current.reason,
        message=message,
        previous=previous,
        poll_seconds=WAITING_POLL_SECONDS,
    )
    return _with(waiting, delete_workloads=stale)


def _carry_over(
    job: TrainingJob,
    workloads: Sequence[ObservedWorkload],
    workload: dict[str, Any],
    *,
    generation: int,
    create: Sequence[dict[str, Any]],
    others: Sequence[dict[str, Any]],
    previous: Condition | None,
    queue: str,
) -> Admission | None:
    """A new plan generation's gang on the job's newest earlier Workload, where Kueue lets
    it keep that Workload's standing: Kueue orders a ClusterQueue's pending Workloads by
    priority, then creation time, so a new Workload queues behind every equal one created
    since. An admitted Workload whose quota covers the new plan in every pool keeps its
    admission (relabelled to the generation; its pod sets stay those it was admitted with,
    and so does the quota charged). A Workload without reserved quota takes the new pod
    sets in place and keeps its place in the queue (Kueue refuses pod set changes only
    while quota is reserved; the patch carries the observed resourceVersion, so a Workload
    that Kueue admitted meanwhile is not changed). None: a new Workload (an evicted one
    holds its reservation until deleted)."""
    earlier = [w for w in workloads if w.generation != generation and not w.deleting]
    if not earlier:
        return None
    last = max(earlier, key=lambda w: w.generation)
    stale = tuple(w.name for w in earlier if w.name != last.name)
    labels: dict[str, Any] = {"metadata": {"labels": {naming.LABEL_GENERATION: str(generation)}}}
    if last.admitted and fits_within(charged(workload), last.charged):
        # Only the label: harmless whatever Kueue wrote since (an eviction meanwhile is
        # seen by the next pass), so no resourceVersion to conflict with its status writes.
        condition = Condition(
            type=COND_ADMITTED,
            status="True",
            reason=REASON_ADMITTED,
            message=(
                f"Workload {last.name} {last.message}; plan generation {generation} "
                f"({gang_summary(workload)}) runs within its quota"
            ),
            observed_generation=job.generation,
        )
        return Admission(
            tuple(create),
            delete_workloads=stale,
            patch_workloads=((last.name, labels),),
            conditions=(condition, *_resumed(job, condition.message)),
            requeue_after=ADMITTED_POLL_SECONDS,
        )
    if last.reserved:
        return None
    # New pod sets only into the Workload as read: one Kueue admitted meanwhile refuses
    # them (409), and the next pass sees the admission.
    metadata = {**labels["metadata"], "resourceVersion": last.resource_version}
    spec = {k: workload["spec"][k] for k in workload["spec"] if k != "queueName"}
    message = (
        f"Workload {last.name} now asks for plan generation {generation} "
        f"({gang_summary(workload)}) and keeps its place in LocalQueue {queue}; the workers "
        "start once Kueue admits it"
    )
    waiting = _waiting(
        job,
        others,
        reason=REASON_WORKLOAD_UPDATED,
        message=message,
        previous=previous,
        poll_seconds=CREATED_POLL_SECONDS,
    )
    return Admission(
        waiting.create,
        delete_workloads=stale,
        patch_workloads=((last.name, {"metadata": metadata, "spec": spec}),),
        conditions=waiting.conditions,
        events=waiting.events,
        requeue_after=waiting.requeue_after,
        phase=waiting.phase,
    )


def _with(admission: Admission, *, delete_workloads: tuple[str, ...]) -> Admission:
    return Admission(
        admission.create,
        delete_workloads=delete_workloads,
        patch_workloads=admission.patch_workloads,
        conditions=admission.conditions,
        events=admission.events,
        requeue_after=admission.requeue_after,
        phase=admission.phase,
    )


def _resumed(job: TrainingJob, message: str) -> tuple[Condition, ...]:
    """Suspended=False/Admitted once admitted, where the queue had suspended the job."""
    suspended = find_condition(job.status.conditions, COND_SUSPENDED)
    if job.spec.suspend or suspended is None or suspended.status != "True":
        return ()
    if suspended.reason not in _QUEUE_SUSPENSIONS:
        return ()
    return (
        Condition(
            type=COND_SUSPENDED,
            status="False",
            reason=REASON_ADMITTED,
            message=message,
            observed_generation=job.generation,
        ),
    )


def _waiting(
    job: TrainingJob,
    create: Sequence[dict[str, Any]],
    *,
    reason: str,
    message: str,
    previous: Condition | None,
    poll_seconds: float,
) -> Admission:
    """No workers start: Admitted=False and Running=False say why, Suspended=True and
    phase Suspended that the queue holds the job (not where spec.suspend does); an Event
    when the reason changes (a Warning for what the user has to fix)."""
    observed = job.generation
    admitted = Condition(
        type=COND_ADMITTED,
        status="False",
        reason=reason,
        message=message,
        observed_generation=observed,
    )
    running = Condition(
        type=COND_RUNNING,
        status="False",
        reason=REASON_AWAITING_ADMISSION,
        message=message,
        observed_generation=observed,
    )
    events: tuple[KubeEvent, ...] = ()
    if previous is None or (previous.status, previous.reason) != ("False", reason):
        warning = reason in (
            REASON_QUEUE_NOT_FOUND,
            REASON_INADMISSIBLE,
            REASON_KUEUE_NOT_INSTALLED,
        )
        events = (KubeEvent("Warning" if warning else "Normal", reason, message),)
    if job.spec.suspend:  # spec.suspend's own Suspended condition and phase stand
        return Admission(
            tuple(create), conditions=(admitted, running), events=events, requeue_after=poll_seconds
        )
    suspended = Condition(
        type=COND_SUSPENDED,
        status="True",
        reason=REASON_EVICTED if reason == REASON_EVICTED else REASON_AWAITING_ADMISSION,
        message=message,
        observed_generation=observed,
    )
    return Admission(
        tuple(create),
        conditions=(admitted, running, suspended),
        events=events,
        requeue_after=poll_seconds,
        phase=PHASE_SUSPENDED,
    )
