"""What the Kopf handlers share: the reconcile pass, the GPUPool refresh, background tasks.

Registration (sailplan.operator.controller.registration) builds one `Runtime` per operator
and its handlers call into it. A TrainingJob pass reads the job fresh (observation), calls
the pure `reconcile` with the catalog-bound planner, and writes what it returns (apply).
The GPUPool refresh recomputes every pool's status from the Kopf indices and wakes every
job when capacity changed. Nothing the operator needs to survive a restart lives here: the
queue and the indices are rebuilt from the cluster on start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sailplan.operator import metrics
from sailplan.operator.api import gpupool as pool_api
from sailplan.operator.api import trainingjob as job_api
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.controller.apply import JobRef, apply_outcome, collect_results, record
from sailplan.operator.controller.blocking import run_blocking
from sailplan.operator.controller.config import OperatorConfig
from sailplan.operator.controller.observation import (
    observe,
    parse_job,
    parse_pool,
    read_memory,
    read_profiles,
)
from sailplan.operator.controller.progress import ProgressReader, attach
from sailplan.operator.controller.queue import (
    CapacityTurns,
    Coalesced,
    JobKey,
    Rank,
    WorkQueue,
    held_back_by,
)
from sailplan.operator.controller.supervision import Supervisor
from sailplan.operator.kube import Kube
from sailplan.operator.planning import PlanningService
from sailplan.operator.profilestore import ProfileStore
from sailplan.operator.reconcile.contention import competes, contends
from sailplan.operator.reconcile.gpupool import pool_status
from sailplan.operator.reconcile.naming import LABEL_JOB, LABEL_ROLE
from sailplan.operator.reconcile.nodes import (
    NodeInfo,
    bound_nodes,
    busiest,
    gpu_use,
    held_priorities,
)
from sailplan.operator.reconcile.provisioning import (
    REASON_CLASS_NOT_SERVED,
    ROLE_CAPACITY,
    Unanswered,
    not_served_message,
    request_key,
    request_reservations,
    requester,
    stale_requests,
    verdicts,
    waiting_requests,
)
from sailplan.operator.reconcile.scaleup import next_change
from sailplan.operator.reconcile.snapshot import (
    with_in_use,
    with_preemptible,
    with_reservations,
)
from sailplan.operator.reconcile.summary import KubeEvent
from sailplan.operator.reconcile.trainingjob import (
    Outcome,
    invalid_status,
    manages,
    merge_patch,
    reconcile,
)
from sailplan.operator.replan.triggers import with_bindings

log = logging.getLogger("sailplan.operator")


# How soon a job held back behind a higher-ranked job's search looks again.
HOLD_BACK_SECONDS = 2.0
# The operator's ProvisioningRequests (reconcile.provisioning), in every namespace.
CAPACITY_REQUEST_SELECTOR = f"{LABEL_ROLE}={ROLE_CAPACITY}"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def acceptance_seconds(pools: Iterable[GPUPool]) -> dict[str, int]:
    """GPUPool -> how long its ProvisioningRequests may go unanswered (pools with them)."""
    return {
        pool.name: pool.spec.autoscaling.provisioning_request.acceptance_timeout_seconds
        for pool in pools
        if pool.spec.autoscaling is not None
        and pool.spec.autoscaling.provisioning_request is not None
    }


@dataclass
class Runtime:
    """What the handlers share: the client, the queue, and the catalog-bound planner."""

    config: OperatorConfig
    kube: Kube
    jobs: set[JobKey] = field(default_factory=set)
    pod_phases: dict[JobKey, dict[str, int]] = field(default_factory=dict)
    indices: dict[str, Any] = field(default_factory=dict)
    supervisor: Supervisor = field(default_factory=Supervisor)
    profile_store: ProfileStore = field(default_factory=ProfileStore)
    queue: WorkQueue = field(init=False)
    pools: Coalesced = field(init=False)
    progress: ProgressReader = field(init=False)
    _stopping: bool = field(default=False, init=False)
    # One pass at a time reads capacity and creates pods, best rank first.
    turns: CapacityTurns = field(default_factory=CapacityTurns, init=False)
    # Each job's rank from its last pass: (-priority, creation time, namespace, name).
    ranks: dict[JobKey, Rank] = field(default_factory=dict, init=False)
    # Jobs that need capacity and have not created their new workers yet (a search under
    # way, or a switch after lost capacity): a worse-ranked job that needs capacity holds
    # back meanwhile (reconcile.contention).
    contenders: dict[JobKey, Rank] = field(default_factory=dict, init=False)
    _pool_timer: asyncio.TimerHandle | None = field(default=None, init=False)
    # ProvisioningRequests come from the "capacity" index where their CRD was installed at
    # start; else from a list per pass (a CRD installed later, or none: an empty list).
    capacity_indexed: bool = field(default=False, init=False)
    # Kueue's Workloads likewise, from the "workloads" index where Kueue was installed at
    # start; else listed by each pass of a queued job.
    workloads_indexed: bool = field(default=False, init=False)
    _timed_refreshes: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    # Requests of a class no autoscaler serves whose job was told (one Warning each).
    _told_unanswered: set[str] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        self.queue = WorkQueue(self.reconcile_job, self.config.retry, self.rank)
        self.pools = Coalesced(self.refresh_pools)
        self.progress = ProgressReader(
            list_pods=self.kube.list_running_pods,
            managed=lambda: set(self.jobs),
            changed=self.queue.enqueue,
            interval=self.config.progress_seconds,
        )

    # -- planning ------------------------------------------------------------------------
    @functools.cached_property
    def planning(self) -> PlanningService:
        """Plan searches in worker processes. Created on first use, which is on the event
        loop: a search that ends (in a supervisor thread) puts its job back on the queue."""
        loop = asyncio.get_running_loop()

        def search_ended(namespace: str, name: str) -> None:
            loop.call_soon_threadsafe(self._requeue_later((namespace, name)), 0.0)

        return PlanningService(self.config.catalog, search_ended)

    # -- GPUPools ------------------------------------------------------------------------
    async def refresh_pools(self) -> None:
        nodes_index = self.indices.get("nodes")
        gpu_index = self.indices.get("gpus")
        pools_index = self.indices.get("pools")
        if nodes_index is None or gpu_index is None or pools_index is None:
            return
        nodes: list[NodeInfo] = [info for store in nodes_index.values() for info in store]
        in_use: dict[str, int] = {}
        reserved: dict[str, dict[str, int]] = {}  # GPUPool -> zone -> GPUs
        waiting: dict[str, dict[str, datetime]] = {}  # GPUPool -> zone -> oldest worker
        for key, store in gpu_index.items():
            if isinstance(key, str):
                in_use[key] = int(sum(store))
            elif len(key) == 2:
                pool_name, zone = key
                reserved.setdefault(pool_name, {})[zone] = int(sum(store))
            elif store:
                _, pool_name, zone = key
                waiting.setdefault(pool_name, {})[zone] = datetime.fromtimestamp(min(store), tz=UTC)
        pools: list[tuple[str, GPUPool]] = []
        for name, store in sorted(pools_index.items()):
            for body in store:
                try:
                    pools.append((name, parse_pool(body)))
                except ValidationError as error:
                    log.warning(
                        "GPUPool does not parse", extra={"gpupool": name, "error": str(error)}
                    )
        # A request that waits (or failed) keeps its zone waiting like an unbound worker.
        requests = await self.capacity_requests()
        timeouts = {
            name: pool.spec.autoscaling.provisioning_timeout_seconds
            for name, pool in pools
            if pool.spec.autoscaling is not None
        }
        now = _now()
        # A request no autoscaler answers backs its zone off like a Failed one.
        found = verdicts(requests, acceptance_seconds([pool for _, pool in pools]), now)
        for pool_name, zones in waiting_requests(requests, timeouts, found.unanswered).items():
            for zone, since in zones.items():
                known = waiting.setdefault(pool_name, {}).get(zone)
                waiting[pool_name][zone] = min(since, known) if known else since
        self._tell_unanswered(requests, found.unanswered)
        changed = False
        wake_at: list[datetime] = [found.next_due] if found.next_due is not None else []
        for name, pool in pools:
            status = pool_status(
                pool,
                nodes,
                in_use,
                self.config.catalog,
                now,
                reserved=reserved.get(name),
                waiting_since=waiting.get(name),
                verdicts=found,
                backoff_policy=self.config.scale_up_backoff,
            )
            if pool.spec.autoscaling is not None:
                moment = next_change(
                    status.zones,
                    waiting.get(name, {}),
                    pool.spec.autoscaling.provisioning_timeout_seconds,
                    now,
                )
                if moment is not None:
                    wake_at.append(moment)
            if status == pool.status:
                continue
            patch = merge_patch(
                pool.status.model_dump(mode="json", by_alias=True, exclude_none=True),
                status.model_dump(mode="json", by_alias=True, exclude_none=True),
            )
            try:
                await run_blocking(self.kube.patch_pool_status, name, patch)
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
        self._refresh_pools_at(min(wake_at) if wake_at else None, now)
        if changed:
            # Capacity changed: jobs waiting for GPUs may now plan.
            self.wake_all_jobs()

    def _tell_unanswered(
        self, requests: list[dict[str, Any]], unanswered: Mapping[str, Unanswered]
    ) -> None:
        """A Warning on the job of each request newly found unanswered: the job replans at
        once, so its Running condition would show the reason only for a moment."""
        for body in requests:
            key = request_key(body)
            job = requester(body)
            if key not in unanswered or key in self._told_unanswered or job is None:
                continue
            message = f"ProvisioningRequest {key}: {not_served_message(unanswered[key])}"
            record(JobRef(*job), KubeEvent("Warning", REASON_CLASS_NOT_SERVED, message))
        self._told_unanswered = set(unanswered)

    def _refresh_pools_at(self, moment: datetime | None, now: datetime) -> None:
        """One timer for the next status change no event announces (a scale-up backoff
        starting or ending); a later refresh replaces it."""
        if self._pool_timer is not None:
            self._pool_timer.cancel()
            self._pool_timer = None
        if moment is None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, (moment - now).total_seconds()) + 1.0  # past the second it turns

        def refresh() -> None:
            self._pool_timer = None
            task = loop.create_task(self._timed_pool_refresh())
            self._timed_refreshes.add(task)  # a strong reference until it ends
            task.add_done_callback(self._timed_refreshes.discard)

        self._pool_timer = loop.call_later(delay, refresh)

    async def _timed_pool_refresh(self) -> None:
        try:
            await self.pools.kick()
        except Exception:
            # The resync refreshes the pools again within a minute.
            log.exception("GPUPool refresh failed at a scale-up deadline")

    def wake_all_jobs(self) -> None:
        for key in sorted(self.jobs):
            self.queue.enqueue(key)

    # -- TrainingJobs --------------------------------------------------------------------
    def forget_job(self, key: JobKey) -> None:
        self.planning.cancel(*key)  # a deleted job's search only burns a core
        self.jobs.discard(key)
        self.ranks.pop(key, None)
        self.contenders.pop(key, None)
        self.pod_phases.pop(key, None)
        metrics.publish_pod_phases(self.pod_phases.values())
        metrics.forget_job_energy(key)

    def _requeue_later(self, key: JobKey) -> Callable[[float], None]:
        def requeue_after(seconds: float) -> None:
            asyncio.get_running_loop().call_later(seconds, self.queue.enqueue, key)

        return requeue_after

    def rank(self, key: JobKey) -> Rank:
        """Who goes first when jobs compete for capacity: higher priority, then the older,
        then by namespace and name (a job not seen yet: after its equals)."""
        return self.ranks.get(key, (0, "~", key[0], key[1]))

    async def reconcile_job(self, key: JobKey) -> None:
        # Announced before the first await: passes dequeued together (in rank order) take
        # their capacity turns in rank order, however quick each one's reads are.
        self.turns.announce(key, self.rank(key))
        try:
            await self._reconcile_job(key)
        finally:
            self.turns.withdraw(key)

    async def _reconcile_job(self, key: JobKey) -> None:
        namespace, name = key
        body = await run_blocking(self.kube.get_job, namespace, name)
        if body is None:
            self.forget_job(key)
            return
        if not manages(body.get("spec") or {}):
            # spec.managedBy names another controller (immutable, so for good): no status,
            # no children, no Events from this operator.
            self.forget_job(key)
            return
        now = _now()
        # The operator's memory of the job (its state ConfigMap): part of what the pure
        # reconcile reads, written back by apply_outcome when the pass changed it.
        metadata = body.get("metadata") or {}
        stored = await read_memory(
            self.kube, namespace, name, str(metadata.get("uid", "")), body.get("status") or {}
        )
        parsed = parse_job(namespace, name, body, stored.memory)
        ref = JobRef(namespace, name, parsed.uid)
        if parsed.job is None:
            status = invalid_status(
                parsed.old_status,
                parsed.generation,
                job_api.REASON_INVALID_SPEC,
                parsed.invalid,
                now,
            )
            await apply_outcome(
                self.kube,
                ref,
                raw_status=parsed.raw_status,
                outcome=Outcome(status=status),
                requeue_after=self._requeue_later(key),
            )
            return
        # Read every pass: newly measured profiles are a reason to replan (policy Auto).
        measured = await read_profiles(
            self.kube,
            self.profile_store,
            self.indices.get("profiles"),
            self.config.profile_namespace,
        )
        priority = await self._job_priority(parsed.job)
        created = str((body.get("metadata") or {}).get("creationTimestamp") or "~")
        rank = self.ranks[key] = (-priority, created, namespace, name)
        # One job at a time from reading capacity to creating its pods: the next job's
        # pass then reads those pods as reserved, so two jobs never plan onto the same GPUs.
        async with self.turns.turn(key, rank):
            observed = await observe(
                self.kube,
                parsed.job,
                measured,
                self.indices.get("nodes"),
                self.indices.get("workloads") if self.workloads_indexed else None,
            )
            nodes = observed.nodes
            # Rank 0's progress comes from its metrics endpoint (controller.progress).
            observed = dataclasses.replace(
                observed, pods=attach(observed.pods, self.progress.readings)
            )
            # A job that needs capacity it does not hold (no workers, or its plan lost
            # some) waits while a better-ranked one that needs it too is still planning.
            competing = competes(observed.job.status, observed.pods, observed.nodes)
            ahead = held_back_by(key, rank, self.contenders) if competing else None
            if ahead is not None:
                log.info(
                    "waiting for a higher-ranked job's plan search",
                    extra={"namespace": namespace, "trainingjob": name, "behind": "/".join(ahead)},
                )
                self._requeue_later(key)(HOLD_BACK_SECONDS)
                return
            # Every job's live workers, read now: the unbound ones reserve GPUs in their
            # pool and zone, the bound ones hold their nodes even before the GPUPool status
            # (written on the pod's event, later) counts them, and a node whose workers
            # are gone is free even before it says so. Other GPU pods come from the index.
            bodies = await run_blocking(self.kube.list_live_workers)
            live = gpu_use(bodies)
            # The job's own workers as that read found them: one bound since its children
            # were listed holds its node (live.in_use) and reserves nothing here too.
            observed = dataclasses.replace(
                observed, pods=with_bindings(observed.pods, bound_nodes(bodies), observed.nodes)
            )
            reservations = list(live.reservations)
            # Workers withheld until their ProvisioningRequest is Provisioned reserve too.
            requests = await self.capacity_requests()
            found = verdicts(requests, acceptance_seconds(observed.pools), now)
            reservations += request_reservations(requests, found.unanswered, besides=key)
            pools = with_reservations(observed.pools, reservations)
            in_use = busiest(self._nodes_in_use(), live.in_use)
            pools = with_in_use(pools, nodes, in_use)
            if priority > 0:
                # Nodes only lower-priority pods hold count as free: the scheduler preempts
                # them for this job's workers.
                held_by = held_priorities(busiest(self._node_priorities(), live.priorities), in_use)
                pools = with_preemptible(pools, nodes, held_by, priority)
            observed = dataclasses.replace(observed, pools=pools)
            outcome = await run_blocking(
                reconcile,
                observed,
                self.planning.planner((namespace, name, parsed.job.uid)),
                self.config.catalog,
                now,
                self.config.replan,
            )
            await apply_outcome(
                self.kube,
                ref,
                raw_status=parsed.raw_status,
                outcome=outcome,
                requeue_after=self._requeue_later(key),
                stored=stored,
                provisioning={
                    pool.name: pool.spec.autoscaling.provisioning_request
                    for pool in observed.pools
                    if pool.spec.autoscaling is not None
                    and pool.spec.autoscaling.provisioning_request is not None
                },
                unanswered=found.unanswered,
            )
            await self._drop_stale_requests(key, requests, outcome)
            new_pods = any(o["kind"] == "Pod" for o in outcome.create)
            if contends(outcome.status, competing=competing, created_workers=new_pods):
                self.contenders[key] = rank
            else:
                self.contenders.pop(key, None)
        if outcome.collect and await collect_results(
            self.kube, ref, outcome.collect, self.config.profile_namespace
        ):
            self.wake_all_jobs()
        workers = outcome.status.workers
        self.pod_phases[key] = {
            "Pending": workers.pending,
            "Running": workers.running,
            "Succeeded": workers.succeeded,
            "Failed": workers.failed,
        }
        metrics.publish_pod_phases(self.pod_phases.values())
        metrics.publish_job_energy(key, outcome.status)

    async def discover_capacity_requests(self) -> None:
        """Whether ProvisioningRequests are served, asked once at start as Kopf does."""
        try:
            self.capacity_indexed = await run_blocking(self.kube.provisioning_requests_served)
        except ApiException as error:
            log.warning("ProvisioningRequests not readable", extra={"status_code": error.status})
            self.capacity_indexed = False

    async def discover_workloads(self) -> None:
        """Whether Kueue's Workloads are served, asked once at start as Kopf does."""
        try:
            self.workloads_indexed = await run_blocking(self.kube.workloads_served)
        except ApiException as error:
            log.warning("Kueue Workloads not readable", extra={"status_code": error.status})
            self.workloads_indexed = False

    async def capacity_requests(self) -> list[dict[str, Any]]:
        """The operator's ProvisioningRequests in every namespace."""
        index = self.indices.get("capacity")
        if self.capacity_indexed and index is not None:
            return [dict(body) for store in index.values() for body in store]
        return await run_blocking(self.kube.list_provisioning_requests, CAPACITY_REQUEST_SELECTOR)

    async def _drop_stale_requests(
        self, key: JobKey, requests: list[dict[str, Any]], outcome: Outcome
    ) -> None:
        """Delete the job's requests that its current plan does not consume (an earlier
        generation's, or all once it ended), so nothing it no longer needs stays booked."""
        if not outcome.managed or outcome.delete_job:
            return
        namespace, name = key
        mine = [
            r
            for r in requests
            if (r.get("metadata") or {}).get("namespace") == namespace
            and ((r.get("metadata") or {}).get("labels") or {}).get(LABEL_JOB) == name
        ]
        status = outcome.status
        active = status.phase not in (
            job_api.PHASE_SUCCEEDED,
            job_api.PHASE_FAILED,
            job_api.PHASE_SUSPENDED,
            job_api.PHASE_INVALID,
        )
        generation = status.plan.generation if status.plan is not None else None
        for body in stale_requests(
            mine, generation=generation, attempt=status.attempt, active=active
        ):
            log.info(
                "deleting a ProvisioningRequest no current plan consumes",
                extra={
                    "namespace": namespace,
                    "trainingjob": name,
                    "provisioningrequest": body["metadata"]["name"],
                },
            )
            await run_blocking(self.kube.delete_provisioning_request, body)

    async def _job_priority(self, job: job_api.TrainingJob) -> int:
        """The value of the PriorityClass the job's workers get (0 without one or when it
        does not exist: the API server then refuses the pods, which the job reports)."""
        overrides = job.spec.pod_template_overrides
        spec = overrides.spec if overrides is not None else None
        name = spec.priority_class_name if spec is not None else None
        if not name:
            return 0
        value = await run_blocking(self.kube.priority_class_value, name)
        return value or 0

    def _nodes_in_use(self) -> dict[str, int]:
        """node -> GPUs the bound GPU pods that are no Sailplan workers hold (the "others"
        index, filled before any handler runs, so before any pass)."""
        index = self.indices.get("others")
        if index is None:
            return {}
        return {str(node): int(sum(store)) for node, store in index.items() if store}

    def _node_priorities(self) -> dict[str, int]:
        """node -> the highest priority among the pods holding its GPUs."""
        index = self.indices.get("priorities")
        if index is None:
            return {}
        return {str(node): max(store) for node, store in index.items() if store}

    # -- lifecycle -----------------------------------------------------------------------
    def ensure_started(self) -> None:
        """Start the queue workers and the resync loop, once, from inside a Kopf handler.

        Inside a handler, because Kopf binds its Event posting queue to the tasks that
        process watch events (context variables, not set in startup handlers): tasks
        created here inherit it, so `kopf.event` from a reconcile posts through Kopf.
        """
        if self.supervisor.started or self._stopping:
            return
        for number in range(self.config.workers):
            self.supervisor.spawn(f"queue-worker-{number}", self.queue.work())
        self.supervisor.spawn("resync", self._resync())
        self.supervisor.spawn("progress", self.progress.run())

    async def _resync(self) -> None:
        # Level-triggered safety net: whatever a missed event left behind is fixed here.
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            self.wake_all_jobs()
            try:
                await self.pools.kick()
            except Exception:
                # One failed refresh must not end the loop; the next round tries again.
                log.exception("GPUPool refresh failed during resync")

    async def stop(self) -> None:
        self._stopping = True  # no handler starts the tasks again
        await asyncio.to_thread(self.planning.shutdown)  # SIGTERM must not wait for searches
        await self.supervisor.stop()
