"""Writing a reconcile's `Outcome` to the API server, once per pass.

The runtime (sailplan.operator.controller.runtime) calls `apply_outcome` after the pure
reconcile: children first (plan ConfigMap and Service before any pod, pods in parallel
batches), then deletions and annotations, the status as one merge patch, the decisions as
Events, and the requeue the reconcile asked for. `collect_results` stores the results of
succeeded profiling Jobs in the profile store.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from sailplan.operator import metrics
from sailplan.operator.api import trainingjob as job_api
from sailplan.operator.kube import Kube
from sailplan.operator.profiling import results
from sailplan.operator.profiling.jobs import REPORT_CONTAINER
from sailplan.operator.profiling.status import RESULT_ERROR_ANNOTATION
from sailplan.operator.profiling.step import Collect
from sailplan.operator.reconcile.summary import KubeEvent
from sailplan.operator.reconcile.trainingjob import Outcome, merge_patch

log = logging.getLogger("sailplan.operator")

# Pods are created in parallel batches of this size (an API server handles it easily; one
# by one a 64-worker job would take a few seconds longer to start).
CREATE_BATCH = 16


@dataclass(frozen=True)
class JobRef:
    """The TrainingJob an outcome belongs to (what Events refer to)."""

    namespace: str
    name: str
    uid: str


async def record(kube: Kube, job: JobRef, event: KubeEvent, now: datetime) -> None:
    """A decision, as a log line and as a Kubernetes Event on the TrainingJob."""
    log.info(
        event.message,
        extra={
            "namespace": job.namespace,
            "trainingjob": job.name,
            "event": event.reason,
            "type": event.type,
        },
    )
    await asyncio.to_thread(
        functools.partial(
            kube.post_event,
            namespace=job.namespace,
            job=job.name,
            uid=job.uid,
            type_=event.type,
            reason=event.reason,
            message=event.message,
            now=now,
        )
    )


async def apply_outcome(
    kube: Kube,
    job: JobRef,
    *,
    raw_status: dict[str, Any],
    outcome: Outcome,
    now: datetime,
    requeue_after: Callable[[float], None],
) -> None:
    """Write `outcome`; `requeue_after(seconds)` when the reconcile asks to be called back."""
    namespace = job.namespace
    pods = [o for o in outcome.create if o["kind"] == "Pod"]
    others = [o for o in outcome.create if o["kind"] != "Pod"]
    for obj in others:  # the plan ConfigMap and the Service before any pod
        await asyncio.to_thread(kube.create, obj)
    for start in range(0, len(pods), CREATE_BATCH):
        batch = pods[start : start + CREATE_BATCH]
        await asyncio.gather(*(asyncio.to_thread(kube.create, pod) for pod in batch))
    for pod_name in outcome.delete_pods:
        await asyncio.to_thread(kube.delete_pod, namespace, pod_name)
    for pod_name, wanted in outcome.annotate_pods:
        await asyncio.to_thread(kube.annotate_pod, namespace, pod_name, wanted)
    if outcome.create or outcome.delete_pods:
        log.info(
            "children changed",
            extra={
                "namespace": namespace,
                "trainingjob": job.name,
                "children_created": [
                    f"{o['kind']}/{o['metadata']['name']}" for o in outcome.create
                ],
                "pods_deleted": [f"Pod/{n}" for n in outcome.delete_pods],
            },
        )
    new_status = outcome.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    patch = merge_patch(raw_status, new_status)
    if patch:
        await asyncio.to_thread(kube.patch_job_status, namespace, job.name, patch)
    for event in outcome.events:
        await record(kube, job, event, now)
    if outcome.requeue_after is not None:
        requeue_after(outcome.requeue_after)
    metrics.RECONCILES.labels(kind=job_api.KIND, result="ok").inc()


async def collect_results(
    kube: Kube,
    job: JobRef,
    collect: tuple[Collect, ...],
    profile_namespace: str,
    now: datetime,
) -> bool:
    """Results of succeeded profiling Jobs into the profile store; True if any was stored
    (which may be what other jobs wait for). A result that cannot be read marks its Jobs
    (annotation), which the next pass reports as a failed need."""
    stored = []
    for item in collect:
        problem = ""
        try:
            text = await asyncio.to_thread(
                kube.succeeded_pod_log, job.namespace, dict(item.pod_labels), REPORT_CONTAINER
            )
            if text is None:
                problem = "the Job's result pod is gone (deleted or past the Job's TTL)"
            else:
                configmap = results.collect(
                    text, item.need, profile_namespace, f"{job.namespace}/{job.name}"
                )
                if await asyncio.to_thread(kube.create, configmap):
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
                await asyncio.to_thread(
                    kube.annotate_batch_job,
                    job.namespace,
                    job_name,
                    {RESULT_ERROR_ANNOTATION: problem[:1000]},
                )
    for key, configmap_name in stored:
        message = f"stored measured profiles {key} in ConfigMap {configmap_name}"
        await record(kube, job, KubeEvent("Normal", "ProfilesStored", message), now)
    return bool(stored)
