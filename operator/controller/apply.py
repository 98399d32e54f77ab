"""Writing a reconcile's `Outcome` to the API server, once per pass.

The runtime (sailplan.operator.controller.runtime) calls `apply_outcome` after the pure
reconcile: children first (plan ConfigMap and Service before any pod, pods in parallel
batches), then deletions and annotations, the job's memory (its state ConfigMap, written
only when the pass changed it), the status as one merge patch, the decisions as Events, and
the requeue the reconcile asked for. A worker pod the API server refuses
(invalid, or forbidden by admission or quota: often what spec.podTemplateOverrides asked
for) makes Running=False with reason PodCreateFailed and the API server's message, and a
Warning; the pass is retried a minute later. `collect_results` stores the results of
succeeded profiling Jobs in the profile store.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

import kopf
from kubernetes.client.exceptions import ApiException

from sailplan.operator import metrics
from sailplan.operator.api import trainingjob as job_api
from sailplan.operator.api.common import GROUP, VERSION, Condition, set_condition
from sailplan.operator.api.gpupool import ProvisioningRequestOptions
from sailplan.operator.api.memory import JobMemory
from sailplan.operator.controller.blocking import run_blocking
from sailplan.operator.kube import Kube
from sailplan.operator.profiling import results
from sailplan.operator.profiling.jobs import REPORT_CONTAINER
from sailplan.operator.profiling.status import RESULT_ERROR_ANNOTATION
from sailplan.operator.profiling.step import Collect
from sailplan.operator.reconcile import memory, provisioning
from sailplan.operator.reconcile.provisioning import (
    Unanswered,
    capacity_requests,
    consuming,
    not_served_message,
    request_state,
)
from sailplan.operator.reconcile.summary import KubeEvent
from sailplan.operator.reconcile.trainingjob import Outcome, merge_patch, pods_refused

log = logging.getLogger("sailplan.operator")

# Pod creations the API server refuses for good reasons of the object or the namespace
# (invalid, forbidden by admission or quota): reported on the job, retried after a while.
REFUSED: Final = frozenset({400, 403, 422})
REFUSED_RETRY_SECONDS: Final = 60.0
# How often a job whose workers wait for a ProvisioningRequest looks at it again.
CAPACITY_POLL_SECONDS: Final = 10.0
# Pods are created in parallel batches of this size (an API server handles it easily; one
# by one a 64-worker job would take a few seconds longer to start).
CREATE_BATCH = 16


@dataclass(frozen=True)
class JobRef:
    """The TrainingJob an outcome belongs to (what Events refer to)."""

    namespace: str
    name: str
    uid: str

    def body(self) -> kopf.Body:
        """The fields of the job an Event's involvedObject is built from."""
        return kopf.Body(
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": job_api.KIND,
                "metadata": {"namespace": self.namespace, "name": self.name, "uid": self.uid},
            }
        )


def record(job: JobRef, event: KubeEvent) -> None:
    """A decision, as a log line and as a Kubernetes Event on the TrainingJob.

    Kopf posts the Event in the background (retrying with its backoffs) through the posting
    queue it binds to the operator's tasks in context variables; the runtime's workers are
    started inside a handler so that they inherit it. `kopf.event` posts whatever
    `settings.posting.level` says (that level only filters Kopf's own log-based events).
    """
    log.info(
        event.message,
        extra={
            "namespace": job.namespace,
            "trainingjob": job.name,
            "event": event.reason,
            "type": event.type,
        },
    )
    kopf.event(job.body(), type=event.type, reason=event.reason, message=event.message)


async def apply_outcome(
    kube: Kube,
    job: JobRef,
    *,
    raw_status: dict[str, Any],
    outcome: Outcome,
    requeue_after: Callable[[float], None],
    # The job's memory as read (reconcile.memory); None: the pass does not touch it.
    stored: memory.Stored | None = None,
    provisioning: Mapping[str, ProvisioningRequestOptions] | None = None,
    unanswered: Mapping[str, Unanswered] | None = None,
) -> None:
    """Write `outcome`; `requeue_after(seconds)` when the reconcile asks to be called back.

    `provisioning`: the GPUPools whose capacity comes through a ProvisioningRequest; their
    workers are created only once it is Provisioned (the next pass tries again).
    `unanswered`: the requests (namespace/name) of classes no autoscaler serves."""
    namespace = job.namespace
    if not outcome.managed:
        return  # spec.managedBy names another controller: its status is not ours to write
    if outcome.delete_job:
        log.info(
            "deleting the job: spec.ttlSecondsAfterFinished has passed",
            extra={"namespace": namespace, "trainingjob": job.name},
        )
        await run_blocking(kube.delete_job, namespace, job.name, job.uid)
        metrics.RECONCILES.labels(kind=job_api.KIND, result="ok").inc()
        return
    pods = [o for o in outcome.create if o["kind"] == "Pod"]
    others = [o for o in outcome.create if o["kind"] != "Pod"]
    # Kueue: an earlier Workload carried over to the plan before the workers it admits, so a
    # refused patch (409) starts none of them.
    for workload, workload_patch in outcome.patch_workloads:
        await run_blocking(kube.patch_workload, job.namespace, workload, workload_patch)
    for obj in others:  # the plan ConfigMap and the Service before any pod
        await run_blocking(kube.create, obj)
    if provisioning and pods:
        pods, gate = await _gate_on_capacity(kube, pods, provisioning, unanswered or {})
        if gate is not None:
            outcome = replace(outcome, events=(*outcome.events, *gate.events))
        if gate is not None and gate.condition is not None:
            condition = gate.condition.model_copy(
                update={"observed_generation": outcome.status.observed_generation}
            )
            now = datetime.now(UTC).replace(microsecond=0)
            outcome = replace(
                outcome,
                status=outcome.status.model_copy(
                    update={"conditions": set_condition(outcome.status.conditions, condition, now)}
                ),
                # Polled as well: the watch on requests needs their CRD at the operator's
                # start (controller.registration).
                requeue_after=min(
                    outcome.requeue_after or CAPACITY_POLL_SECONDS, CAPACITY_POLL_SECONDS
                ),
            )
    refused: list[str] = []
    for start in range(0, len(pods), CREATE_BATCH):
        batch = pods[start : start + CREATE_BATCH]
        results = await asyncio.gather(
            *(run_blocking(kube.create, pod) for pod in batch), return_exceptions=True
        )
        for pod, result in zip(batch, results, strict=True):
            if isinstance(result, ApiException) and result.status in REFUSED:
                refused.append(f"{pod['metadata']['name']}: {_api_message(result)}")
            elif isinstance(result, BaseException):
                raise result
    if refused:
        # What the user asked for (spec.podTemplateOverrides, the trainer's service account)
        # or the namespace's quota and admission policies: a reason, not a retry loop.
        message = f"the API server refused {len(refused)} worker pods; {refused[0]}"
        outcome = replace(
            outcome,
            status=pods_refused(outcome.status, message, datetime.now(UTC).replace(microsecond=0)),
            events=(
                *outcome.events,
                KubeEvent("Warning", job_api.REASON_POD_CREATE_FAILED, message),
            ),
            requeue_after=min(
                outcome.requeue_after or REFUSED_RETRY_SECONDS, REFUSED_RETRY_SECONDS
            ),
        )
    for pod_name in outcome.delete_pods:
        await run_blocking(kube.delete_pod, namespace, pod_name)
    for workload in outcome.delete_workloads:  # Kueue: a replaced plan's, a finished job's
        await run_blocking(kube.delete_workload, namespace, workload)
    for pod_name, wanted in outcome.annotate_pods:
        await run_blocking(kube.annotate_pod, namespace, pod_name, wanted)
    if outcome.create or outcome.delete_pods or outcome.delete_workloads or outcome.patch_workloads:
        log.info(
            "children changed",
            extra={
                "namespace": namespace,
                "trainingjob": job.name,
                "children_created": [
                    f"{o['kind']}/{o['metadata']['name']}" for o in outcome.create
                ],
                "pods_deleted": [f"Pod/{n}" for n in outcome.delete_pods],
                "workloads_deleted": [f"Workload/{n}" for n in outcome.delete_workloads],
                "workloads_patched": [f"Workload/{n}" for n, _ in outcome.patch_workloads],
            },
        )
    if stored is not None and outcome.memory is not None and stored.needs_write(outcome.memory):
        # Before the status: a status that shows a step the memory does not hold yet would
        # be repeated from the older memory after a crash, never skipped.
        await _write_memory(kube, job, stored, outcome.memory)
    new_status = outcome.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    patch = merge_patch(raw_status, new_status)
    if patch:
        await run_blocking(kube.patch_job_status, namespace, job.name, patch)
    for event in outcome.events:
        record(job, event)
    if outcome.requeue_after is not None:
        requeue_after(outcome.requeue_after)
    metrics.RECONCILES.labels(kind=job_api.KIND, result="ok").inc()


async def _write_memory(kube: Kube, job: JobRef, stored: memory.Stored, new: JobMemory) -> None:
    """The job's state ConfigMap with `new`: created, or replaced at the resourceVersion it
    was read at (a 409 fails the pass, which the queue retries from a fresh read)."""
    body = memory.render(job.namespace, job.name, job.uid, new, stored.resource_version)
    if not await run_blocking(kube.write_configmap, body):
        # A ConfigMap of that name the job does not own (a user's, or an earlier job's the
        # garbage collector has not removed yet): never overwritten.
        log.warning(
            "state ConfigMap exists and is not this job's; the job's memory is not kept",
            extra={
                "namespace": job.namespace,
                "trainingjob": job.name,
                "configmap": memory.state_configmap_name(job.name),
            },
        )
    elif stored.legacy:
        log.info(
            "job memory moved from its status to its state ConfigMap",
            extra={"namespace": job.namespace, "trainingjob": job.name},
        )


@dataclass(frozen=True)
class _CapacityGate:
    """Why some workers were withheld: the Running condition to show, Events to post."""

    condition: Condition | None
    events: tuple[KubeEvent, ...]


async def _gate_on_capacity(
    kube: Kube,
    pods: list[dict[str, Any]],
    options: Mapping[str, ProvisioningRequestOptions],
    unanswered: Mapping[str, Unanswered],
) -> tuple[list[dict[str, Any]], _CapacityGate | None]:
    """Create each pool's ProvisioningRequest (and its PodTemplates) for `pods`; the pods
    that may be created now (those of Provisioned requests annotated to consume them, and
    every pod of a pool without one), and why the others wait: a request that failed, one
    of a class no autoscaler serves (`unanswered`, by namespace/name), or one not yet
    Provisioned."""
    requests = capacity_requests(pods, options)
    if not requests:
        return pods, None
    by_pod = {name: request for request in requests for name in request.pods}
    provisioned: set[str] = set()
    waiting: list[str] = []
    failed: list[str] = []
    not_served: list[str] = []
    events: list[KubeEvent] = []
    for request in requests:
        for template in request.pod_templates:
            await run_blocking(kube.create, template)
        try:
            created = await run_blocking(kube.create_provisioning_request, request.request)
        except ApiException as error:
            if error.status != 404:
                raise
            # No ProvisioningRequest CRD: the job says so instead of a pass that fails.
            failed.append(
                f"{request.gpupool}/{request.zone}: the API server does not serve "
                f"{provisioning.PLURAL}.{provisioning.GROUP}; install that CRD (GKE's queued "
                "provisioning or the cluster autoscaler brings it) or remove "
                f"spec.autoscaling.provisioningRequest from GPUPool {request.gpupool}"
            )
            continue
        if created:
            events.append(
                KubeEvent(
                    "Normal",
                    provisioning.REASON_CAPACITY_REQUESTED,
                    f"ProvisioningRequest {request.name} for {len(request.pods)} workers in "
                    f"{request.gpupool}/{request.zone}",
                )
            )
        namespace = request.request["metadata"]["namespace"]
        body = await run_blocking(kube.get_provisioning_request, namespace, request.name)
        state, message = request_state(body)
        where = f"{request.name} ({request.gpupool}/{request.zone})"
        ignored = unanswered.get(f"{namespace}/{request.name}")
        if state == "Provisioned":
            provisioned.add(request.name)
        elif state == "Pending" and ignored is not None:
            not_served.append(f"{where}: {not_served_message(ignored)}")
        elif state == "Failed":
            failed.append(f"{where}: {message}")
        else:
            waiting.append(f"{where}: {message}")
    allowed = [
        consuming(pod, by_pod[pod["metadata"]["name"]])
        if pod["metadata"]["name"] in by_pod
        else pod
        for pod in pods
        if pod["metadata"]["name"] not in by_pod
        or by_pod[pod["metadata"]["name"]].name in provisioned
    ]
    if not waiting and not failed and not not_served:
        return allowed, _CapacityGate(None, tuple(events)) if events else None
    if not_served:  # the job's Warning comes from the pools' refresh (controller.runtime)
        reason = provisioning.REASON_CLASS_NOT_SERVED
    elif failed:
        reason = provisioning.REASON_CAPACITY_REQUEST_FAILED
    else:
        reason = provisioning.REASON_WAITING_FOR_CAPACITY
    return allowed, _CapacityGate(
        Condition(
            type=job_api.COND_RUNNING,
            status="False",
            reason=reason,
            message="workers wait for their ProvisioningRequest: "
            + "; ".join(not_served + failed + waiting),
        ),
        tuple(events),
    )


def _api_message(error: ApiException) -> str:
    """The API server's own message (the Status body's), else the HTTP reason."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        body = None
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or f"{error.status} {error.reason}")


async def collect_results(
    kube: Kube,
    job: JobRef,
    collect: tuple[Collect, ...],
    profile_namespace: str,
) -> bool:
    """Results of succeeded profiling Jobs into the profile store; True if any was stored
    (which may be what other jobs wait for). A result that cannot be read marks its Jobs
    (annotation), which the next pass reports as a failed need."""
    stored = []
    for item in collect:
        problem = ""
        try:
            text = await run_blocking(
                kube.succeeded_pod_log, job.namespace, dict(item.pod_labels), REPORT_CONTAINER
            )
            if text is None:
                problem = "the Job's result pod is gone (deleted or past the Job's TTL)"
            else:
                configmap = results.collect(
                    text, item.need, profile_namespace, f"{job.namespace}/{job.name}"
                )
                if await run_blocking(kube.create, configmap):
                    stored.append((item.need.key, configmap["metadata"]["name"]))
                else:
                    # Usually another job stored the same key a moment ago, and the
                    # next pass finds the need met; if not, that ConfigMap is broken.
                    problem = (
                        f"profile store ConfigMap {configmap['metadata']['name']} already "
                        "exists; if the store still lacks this profile, delete that "
                        "ConfigMap and this Job to measure it again"
                    )
        except results.ProfilingResultError as error:
            problem = str(error)
        except ApiException as error:
            # Logs come through the node's kubelet: a node that cannot serve them will
            # not start to; the message says which call failed.
            problem = f"reading the result log failed: {error.status} {error.reason}"
        if problem:
            log.warning(
                "profiling result unreadable",
                extra={"namespace": job.namespace, "trainingjob": job.name, "problem": problem},
            )
            for job_name in item.jobs:
                await run_blocking(
                    kube.annotate_batch_job,
                    job.namespace,
                    job_name,
                    {RESULT_ERROR_ANNOTATION: problem[:1000]},
                )
    for key, configmap_name in stored:
        message = f"stored measured profiles {key} in ConfigMap {configmap_name}"
        record(job, KubeEvent("Normal", "ProfilesStored", message))
    return bool(stored)
