"""Kopf wiring: which watch events trigger which reconcile, and the I/O around it.

Handlers stay thin. Node, GPU-pod and GPUPool events refresh every GPUPool's status from
Kopf indices (which Kopf fills completely before any handler runs, so a restarted operator
never computes a status from a half-listed cluster). TrainingJob and worker-pod events put
the job on a de-duplicating work queue; a worker takes it, reads the job and its children
fresh from the API server (not from a cache: the plan ConfigMaps and `status.replan` there
are the truth about which plan is being rolled out), calls the pure `reconcile` with the
nodes from the index, creates/deletes/annotates what it says, writes the status once, and
requeues the job itself when the reconcile asks to be called back (restart backoff, drain
timeout). Worker pod events reach the queue at once, so a failed or preempted worker is
replanned for within a second; node events refresh the GPUPool statuses, and a changed
status enqueues every job. Nothing the operator needs to survive a restart lives in
memory; the queue and the indices are rebuilt from the cluster on start.

No finalizers: children are owned through ownerReferences and the garbage collector
removes them, so deleting a job never waits on the operator being up.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sailplan.operator import metrics
from sailplan.operator.api import gpupool as pool_api
from sailplan.operator.api import trainingjob as job_api
from sailplan.operator.api.common import GROUP
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob, TrainingJobStatus
from sailplan.operator.kube import Kube
from sailplan.operator.planning import planner_for
from sailplan.operator.profilestore import parse_profile_configmaps
from sailplan.operator.profiling import results
from sailplan.operator.profiling.jobs import REPORT_CONTAINER, ROLE_PROFILER
from sailplan.operator.profiling.status import RESULT_ERROR_ANNOTATION, observed_job
from sailplan.operator.profiling.step import Collect
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.gpupool import pool_status
from sailplan.operator.reconcile.nodes import NodeInfo, node_info, pod_gpu_request, requested_gpus
from sailplan.operator.reconcile.summary import KubeEvent
from sailplan.operator.reconcile.trainingjob import (
    Observed,
    Outcome,
    invalid_status,
    merge_patch,
    observed_plan,
    observed_pod,
    reconcile,
)
from sailplan.operator.replan.decision import ReplanConfig
from sailplan.planner.api import Infeasible, PlanRequest, PlanResult
from sailplan.planner.catalog import Catalog
from sailplan.planner.profiles.types import ProfileSet

log = logging.getLogger("sailplan.operator")

JobKey = tuple[str, str]  # (namespace, name)
# Pods are created in parallel batches of this size (an API server handles it easily; one
# by one a 64-worker job would take a few seconds longer to start).
CREATE_BATCH = 16
RETRY_SECONDS = 5.0


@dataclass
class OperatorConfig:
    catalog: Catalog
    namespaces: tuple[str, ...] = ()  # TrainingJob namespaces served; empty = all
    profile_namespace: str = "sailplan-system"
    metrics_port: int | None = None
    workers: int = 4
    resync_seconds: float = 60.0
    replan: ReplanConfig = field(default_factory=ReplanConfig)


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class WorkQueue:
    """At most one reconcile per key at a time; a key enqueued meanwhile runs once more after."""

    def __init__(self, process: Callable[[JobKey], Awaitable[None]]) -> None:
        self._process = process
        self._queue: asyncio.Queue[JobKey] = asyncio.Queue()
        self._pending: set[JobKey] = set()
        self._active: set[JobKey] = set()
        self._dirty: set[JobKey] = set()

    def enqueue(self, key: JobKey) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._pending:
            self._pending.add(key)
            self._queue.put_nowait(key)

    async def work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            key = await self._queue.get()
            self._pending.discard(key)
            self._active.add(key)
            try:
                await self._process(key)
            except Exception:
                log.exception(
                    "reconcile failed; retrying",
                    extra={"namespace": key[0], "trainingjob": key[1]},
                )
                metrics.RECONCILES.labels(kind=job_api.KIND, result="error").inc()
                loop.call_later(RETRY_SECONDS, self.enqueue, key)
            finally:
                self._active.discard(key)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.enqueue(key)


class Coalesced:
    """Run an async function on demand; requests during a run collapse into one more run."""

    def __init__(self, fn: Callable[[], Awaitable[None]]) -> None:
        self._fn = fn
        self._running = False
        self._again = False

    async def kick(self) -> None:
        if self._running:
            self._again = True
            return
        self._running = True
        try:
            while True:
                self._again = False
                await self._fn()
                if not self._again:
                    break
        finally:
            self._running = False


def parse_pool(body: dict[str, Any]) -> GPUPool:
    metadata = body.get("metadata") or {}
    return GPUPool(
        name=metadata.get("name", ""),
        generation=metadata.get("generation", 0),
        labels=metadata.get("labels") or {},
        spec=body.get("spec") or {},
        status=body.get("status") or {},
    )


@dataclass
class Runtime:
    """What the handlers share: the client, the queue, and the catalog-bound planner."""

    config: OperatorConfig
    kube: Kube
    jobs: set[JobKey] = field(default_factory=set)
    pod_phases: dict[JobKey, dict[str, int]] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    queue: WorkQueue | None = None
    pools: Coalesced | None = None
    indices: dict[str, Any] = field(default_factory=dict)

    # -- planner with metrics ------------------------------------------------------------
    def plan(self, request: PlanRequest, measured: ProfileSet) -> PlanResult:
        started = time.perf_counter()
        try:
            result = planner_for(self.config.catalog)(request, measured)
        except Exception:
            metrics.PLANS.labels(result="error").inc()
            raise
        finally:
            metrics.PLANNING_SECONDS.observe(time.perf_counter() - started)
        metrics.PLANS.labels(
            result="infeasible" if isinstance(result, Infeasible) else "planned"
        ).inc()
        return result

    # -- GPUPools ------------------------------------------------------------------------
    async def refresh_pools(self) -> None:
        nodes_index = self.indices.get("nodes")
        gpu_index = self.indices.get("gpus")
        pools_index = self.indices.get("pools")
        if nodes_index is None or gpu_index is None or pools_index is None:
            return
        nodes: list[NodeInfo] = [info for store in nodes_index.values() for info in store]
        in_use = {node: sum(store) for node, store in gpu_index.items()}
        now = _now()
        changed = False
        for name, store in sorted(pools_index.items()):
            for body in store:
                try:
                    pool = parse_pool(body)
                except ValidationError as error:
                    log.warning(
                        "GPUPool does not parse", extra={"gpupool": name, "error": str(error)}
                    )
                    continue
                status = pool_status(pool, nodes, in_use, self.config.catalog, now)
                if status == pool.status:
                    continue
                patch = merge_patch(
                    pool.status.model_dump(mode="json", by_alias=True, exclude_none=True),
                    status.model_dump(mode="json", by_alias=True, exclude_none=True),
                )
                try:
                    await asyncio.to_thread(self.kube.patch_pool_status, name, patch)
                except ApiException as error:
                    # One pool (e.g. deleted meanwhile) must not keep the others stale.
                    log.warning(
                        "GPUPool status not written",
                        extra={"gpupool": name, "status_code": error.status},
                    )
                    metrics.RECONCILES.labels(kind=pool_api.KIND, result="error").inc()
                    continue
                metrics.RECONCILES.labels(kind=pool_api.KIND, result="ok").inc()
                changed = True
        if changed and self.queue is not None:
            # Capacity changed: jobs waiting for GPUs may now plan.
            for key in sorted(self.jobs):
                self.queue.enqueue(key)

    # -- TrainingJobs --------------------------------------------------------------------
    async def reconcile_job(self, key: JobKey) -> None:
        namespace, name = key
        body = await asyncio.to_thread(self.kube.get_job, namespace, name)
        if body is None:
            self.jobs.discard(key)
            self.pod_phases.pop(key, None)
            metrics.publish_pod_phases(self.pod_phases.values())
            return
        now = _now()
        metadata = body["metadata"]
        raw_status = body.get("status") or {}
        try:
            old_status = TrainingJobStatus.model_validate(raw_status)
        except ValidationError:
            old_status = TrainingJobStatus()
        try:
            job = TrainingJob(
                name=name,
                namespace=namespace,
                uid=metadata.get("uid", ""),
                generation=metadata.get("generation", 0),
                spec=body.get("spec") or {},
                status=old_status,
            )
        except ValidationError as error:
            # What the schema could not catch (e.g. a custom shape whose heads do not divide
            # the hidden size) still gets a clear condition.
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            message = f"spec.{where}: {first['msg']}"
            status = invalid_status(
                old_status, metadata.get("generation", 0), job_api.REASON_INVALID_SPEC, message, now
            )
            outcome = Outcome(status=status)
            await self._apply(
                namespace=namespace,
                name=name,
                uid=metadata.get("uid", ""),
                raw_status=raw_status,
                outcome=outcome,
                now=now,
            )
            return

        pods, plans, service = await asyncio.to_thread(self.kube.list_job_children, namespace, name)
        profiling_jobs = await asyncio.to_thread(self.kube.list_profiling_jobs, namespace, name)
        observed_plans = tuple(p for p in (observed_plan(cm) for cm in plans) if p is not None)
        # Always read: newly measured profiles are a reason to replan (policy Auto).
        configmaps = await asyncio.to_thread(
            self.kube.list_profile_configmaps, self.config.profile_namespace
        )
        measured, problems = parse_profile_configmaps(configmaps)
        for problem in problems:
            log.warning("profile store: document skipped", extra={"problem": problem})
        pools: list[GPUPool] = []
        for pool_body in await asyncio.to_thread(self.kube.list_pools):
            try:
                pools.append(parse_pool(pool_body))
            except ValidationError as error:
                log.warning("GPUPool does not parse", extra={"error": str(error)})
        observed = Observed(
            job=job,
            pools=tuple(pools),
            plans=observed_plans,
            pods=tuple(p for p in (observed_pod(b) for b in pods) if p is not None),
            service_exists=service,
            measured=measured,
            nodes=await self._nodes(),
            profiling_jobs=tuple(
                j for j in (observed_job(b) for b in profiling_jobs) if j is not None
            ),
        )
        outcome = await asyncio.to_thread(
            reconcile, observed, self.plan, self.config.catalog, now, self.config.replan
        )
        await self._apply(
            namespace=namespace,
            name=name,
            uid=job.uid,
            raw_status=raw_status,
            outcome=outcome,
            now=now,
        )
        if outcome.collect:
            await self._collect(namespace, name, job.uid, outcome.collect, now)
        workers = outcome.status.workers
        self.pod_phases[key] = {
            "Pending": workers.pending,
            "Running": workers.running,
            "Succeeded": workers.succeeded,
            "Failed": workers.failed,
        }
        metrics.publish_pod_phases(self.pod_phases.values())

    async def _record(
        self, namespace: str, name: str, uid: str, event: KubeEvent, now: datetime
    ) -> None:
        """A decision, as a log line and as a Kubernetes Event on the TrainingJob."""
        log.info(
            event.message,
            extra={
                "namespace": namespace,
                "trainingjob": name,
                "event": event.reason,
                "type": event.type,
            },
        )
        await asyncio.to_thread(
            functools.partial(
                self.kube.post_event,
                namespace=namespace,
                job=name,
                uid=uid,
                type_=event.type,
                reason=event.reason,
                message=event.message,
                now=now,
            )
        )

    async def _collect(
        self, namespace: str, name: str, uid: str, collect: tuple[Collect, ...], now: datetime
    ) -> None:
        """Results of succeeded profiling Jobs into the profile store. A result that cannot
        be read marks its Jobs (annotation), which the next pass reports as a failed need;
        a stored one wakes every job, since any of them may be waiting for it."""
        stored = []
        for item in collect:
            problem = ""
            try:
                text = await asyncio.to_thread(
                    self.kube.succeeded_pod_log, namespace, dict(item.pod_labels), REPORT_CONTAINER
                )
                if text is None:
                    problem = "the Job's result pod is gone (deleted or past the Job's TTL)"
                else:
                    configmap = results.collect(
                        text, item.need, self.config.profile_namespace, f"{namespace}/{name}"
                    )
                    if await asyncio.to_thread(self.kube.create, configmap):
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
                    extra={"namespace": namespace, "trainingjob": name, "problem": problem},
                )
                for job_name in item.jobs:
                    await asyncio.to_thread(
                        self.kube.annotate_batch_job,
                        namespace,
                        job_name,
                        {RESULT_ERROR_ANNOTATION: problem[:1000]},
                    )
        for key, configmap_name in stored:
            message = f"stored measured profiles {key} in ConfigMap {configmap_name}"
            event = KubeEvent("Normal", "ProfilesStored", message)
            await self._record(namespace, name, uid, event, now)
        if stored and self.queue is not None:
            for other in sorted(self.jobs):
                self.queue.enqueue(other)

    async def _nodes(self) -> dict[str, NodeInfo]:
        """Every node by name: from the index once Kopf has filled it, else listed (a job
        reconciled before the first node event must not take every node for gone)."""
        index = self.indices.get("nodes")
        if index is not None:
            return {info.name: info for store in index.values() for info in store}
        bodies = await asyncio.to_thread(self.kube.list_nodes)
        return {info.name: info for info in map(node_info, bodies)}

    async def _apply(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        raw_status: dict[str, Any],
        outcome: Outcome,
        now: datetime,
    ) -> None:
        pods = [o for o in outcome.create if o["kind"] == "Pod"]
        others = [o for o in outcome.create if o["kind"] != "Pod"]
        for obj in others:  # the plan ConfigMap and the Service before any pod
            await asyncio.to_thread(self.kube.create, obj)
        for start in range(0, len(pods), CREATE_BATCH):
            batch = pods[start : start + CREATE_BATCH]
            await asyncio.gather(*(asyncio.to_thread(self.kube.create, pod) for pod in batch))
        for pod_name in outcome.delete_pods:
            await asyncio.to_thread(self.kube.delete_pod, namespace, pod_name)
        for pod_name, wanted in outcome.annotate_pods:
            await asyncio.to_thread(self.kube.annotate_pod, namespace, pod_name, wanted)
        if outcome.create or outcome.delete_pods:
            log.info(
                "children changed",
                extra={
                    "namespace": namespace,
                    "trainingjob": name,
                    "children_created": [
                        f"{o['kind']}/{o['metadata']['name']}" for o in outcome.create
                    ],
                    "pods_deleted": [f"Pod/{n}" for n in outcome.delete_pods],
                },
            )
        new_status = outcome.status.model_dump(mode="json", by_alias=True, exclude_none=True)
        patch = merge_patch(raw_status, new_status)
        if patch:
            await asyncio.to_thread(self.kube.patch_job_status, namespace, name, patch)
        for event in outcome.events:
            await self._record(namespace, name, uid, event, now)
        if outcome.requeue_after is not None and self.queue is not None:
            asyncio.get_running_loop().call_later(
                outcome.requeue_after, self.queue.enqueue, (namespace, name)
            )
        metrics.RECONCILES.labels(kind=job_api.KIND, result="ok").inc()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self.queue = WorkQueue(self.reconcile_job)
        self.pools = Coalesced(self.refresh_pools)
        self.tasks = [asyncio.create_task(self.queue.work()) for _ in range(self.config.workers)]
        self.tasks.append(asyncio.create_task(self._resync()))

    async def _resync(self) -> None:
        # Level-triggered safety net: whatever a missed event left behind is fixed here.
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            if self.queue is not None:
                for key in sorted(self.jobs):
                    self.queue.enqueue(key)
            if self.pools is not None:
                await self.pools.kick()

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def connection_info(
    configuration: client.Configuration, settings: kopf.OperatorSettings
) -> kopf.ConnectionInfo:
    header = configuration.get_api_key_with_prefix(
        "BearerToken"
    ) or configuration.get_api_key_with_prefix("authorization")
    scheme, _, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        trust_env=settings.networking.trust_env,
    )


def _holds_gpus(body: kopf.Body, **_: Any) -> bool:
    return requested_gpus(body) > 0


def _serves(config: OperatorConfig, namespace: str | None) -> bool:
    return not config.namespaces or namespace in config.namespaces


def build_registry(config: OperatorConfig, api_client: client.ApiClient) -> kopf.OperatorRegistry:
    """A Kopf registry with every handler of the operator, bound to `config`."""
    registry = kopf.OperatorRegistry()
    runtime = Runtime(config=config, kube=Kube(api_client))

    @kopf.on.login(id="login", registry=registry)
    def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        # Kopf's watches use exactly the credentials of our own client (not whatever the
        # kubernetes package's global default happens to be).
        return connection_info(api_client.configuration, settings)

    @kopf.on.startup(id="startup", registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Discovery once at start instead of watching CRDs: one permission less.
        settings.scanning.disabled = True
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        if config.metrics_port:
            metrics.serve(config.metrics_port)
        runtime.start()

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(**_: Any) -> None:
        await runtime.stop()

    # -- indices (filled before any handler runs) --------------------------------------
    # Async on purpose: Kopf runs sync handlers in a thread pool, one hop per watch event,
    # which is most of the cost of watching 500 nodes.
    @kopf.index("nodes", id="nodes", registry=registry)
    async def nodes(body: kopf.Body, name: str, **_: Any) -> dict[str, NodeInfo]:
        return {name: node_info(body)}

    @kopf.index("pods", id="gpus", registry=registry)
    async def gpus(body: kopf.Body, **_: Any) -> dict[str, int]:
        usage = pod_gpu_request(body)
        # An empty mapping, not None: Kopf keeps an object's previous value when the index
        # function returns None, so a pod that finished would hold its GPUs forever.
        return {usage[0]: usage[1]} if usage else {}

    @kopf.index(GROUP, pool_api.PLURAL, id="pools", registry=registry)
    async def pools(body: kopf.Body, name: str, **_: Any) -> dict[str, dict[str, Any]]:
        return {name: dict(body)}

    async def kick_pools(kwargs: dict[str, Any]) -> None:
        runtime.indices.update(nodes=kwargs["nodes"], gpus=kwargs["gpus"], pools=kwargs["pools"])
        if runtime.pools is not None:
            await runtime.pools.kick()

    @kopf.on.event("nodes", id="node-changed", registry=registry)
    async def node_changed(**kwargs: Any) -> None:
        await kick_pools(kwargs)

    @kopf.on.event("pods", id="gpu-pod-changed", registry=registry, when=_holds_gpus)
    async def gpu_pod_changed(**kwargs: Any) -> None:
        await kick_pools(kwargs)

    @kopf.on.event(GROUP, pool_api.PLURAL, id="gpupool-changed", registry=registry)
    async def pool_changed(**kwargs: Any) -> None:
        await kick_pools(kwargs)

    # -- TrainingJobs ------------------------------------------------------------------
    @kopf.on.event(
        GROUP,
        job_api.PLURAL,
        id="trainingjob-changed",
        registry=registry,
        when=lambda namespace, **_: _serves(config, namespace),
    )
    async def job_changed(type: str, name: str, namespace: str | None, **_: Any) -> None:
        key = (namespace or "", name)
        if type == "DELETED":
            runtime.jobs.discard(key)
            runtime.pod_phases.pop(key, None)
            metrics.publish_pod_phases(runtime.pod_phases.values())
            return
        runtime.jobs.add(key)
        if runtime.queue is not None:
            runtime.queue.enqueue(key)

    @kopf.on.event(
        "batch",
        "jobs",
        id="profiling-job-changed",
        registry=registry,
        labels={naming.LABEL_JOB: kopf.PRESENT, naming.LABEL_ROLE: ROLE_PROFILER},
        when=lambda namespace, **_: _serves(config, namespace),
    )
    async def profiling_job_changed(labels: kopf.Labels, namespace: str | None, **_: Any) -> None:
        if runtime.queue is not None:
            runtime.queue.enqueue((namespace or "", labels[naming.LABEL_JOB]))

    @kopf.on.event(
        "pods",
        id="worker-pod-changed",
        registry=registry,
        labels={naming.LABEL_JOB: kopf.PRESENT, naming.LABEL_ROLE: naming.ROLE_WORKER},
        when=lambda namespace, **_: _serves(config, namespace),
    )
    async def worker_changed(labels: kopf.Labels, namespace: str | None, **_: Any) -> None:
        if runtime.queue is not None:
            runtime.queue.enqueue((namespace or "", labels[naming.LABEL_JOB]))

    return registry
