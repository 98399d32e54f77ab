"""The Kopf registry of the operator: which watch events trigger what.

`sailplan operator run` calls `build_registry` and hands the result to `kopf.run`. Handlers
stay thin. Node, GPU-pod and GPUPool events refresh every GPUPool's status from Kopf
indices (which Kopf fills completely before any handler runs, so a restarted operator
never computes a status from a half-listed cluster). TrainingJob, profiling-Job and
worker-pod events put the job on the runtime's work queue, so a failed or preempted worker
is replanned for within a second. The profile store's ConfigMaps (labelled, in the profile
namespace, filtered by the API server) are indexed parsed, and a change wakes every job.
The operator's ProvisioningRequests are indexed where their CRD is installed at start (Kopf
serves no resource it did not discover then, and logs so): a change of one, Provisioned or
Failed, refreshes the pools and wakes its job at once. Its Kueue Workloads likewise: where
Kueue is installed at start, admission, eviction or preemption runs the job's pass at once
and each pass reads them from the index (else a pass lists them and polls).
The liveness probe reports the runtime's background tasks (supervision).

No finalizers: children are owned through ownerReferences and the garbage collector
removes them, so deleting a job never waits on the operator being up.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import kopf
from kubernetes import client

from sailplan.operator import metrics
from sailplan.operator.api import gpupool as pool_api
from sailplan.operator.api import trainingjob as job_api
from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.controller import storage
from sailplan.operator.controller.config import OperatorConfig
from sailplan.operator.controller.runtime import Runtime
from sailplan.operator.controller.supervision import register_liveness_probe
from sailplan.operator.kube import Kube
from sailplan.operator.profilestore import ParsedConfigMap
from sailplan.operator.profiling.jobs import ROLE_PROFILER
from sailplan.operator.reconcile import kueue, naming, provisioning
from sailplan.operator.reconcile.nodes import (
    WAITING,
    GpuIndexKey,
    NodeInfo,
    created_at,
    node_info,
    other_pod_gpu_request,
    pod_gpu_request,
    pod_gpu_reservation,
    pod_priority,
    requested_gpus,
)

log = logging.getLogger("sailplan.operator")

EVENT_SOURCE = "sailplan-operator"  # the Events' source (`kubectl describe`'s From column)
# The Kopf indices the runtime reads (ids of the @kopf.index handlers below).
INDICES = ("nodes", "gpus", "others", "priorities", "pools", "profiles", "capacity", "workloads")


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
        # Kopf's own log lines become Events only from WARNING up; the operator's decisions
        # are posted with kopf.event, which this level does not filter.
        settings.posting.level = logging.WARNING
        settings.posting.reporting_component = EVENT_SOURCE
        settings.posting.reporting_instance = socket.gethostname()  # the pod, with replicas
        settings.posting.event_name_prefix = f"{EVENT_SOURCE}-"
        settings.watching.server_timeout = 300
        # Only the profile store's ConfigMaps, filtered by the API server: the watch never
        # carries the cluster's other ConfigMaps.
        settings.watching.label_selectors["configmaps"] = naming.LABEL_PROFILE
        settings.watching.field_selectors["configmaps"] = (
            f"metadata.namespace={config.profile_namespace}"
        )
        if config.metrics_port:
            metrics.serve(config.metrics_port)
        # Before Kopf discovers resources (it does after startup): the same answer.
        await runtime.discover_capacity_requests()
        await runtime.discover_workloads()
        # Objects stored at v1alpha1 rewritten at v1beta1 (their memory moved first), before
        # any pass writes them (controller.storage); quick when there is nothing to do.
        await storage.migrate(runtime.kube)

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(**_: Any) -> None:
        await runtime.stop()

    register_liveness_probe(registry, runtime.supervisor)

    # -- indices (filled before any handler runs) --------------------------------------
    # Async on purpose: Kopf runs sync handlers in a thread pool, one hop per watch event,
    # which is most of the cost of watching 500 nodes.
    @kopf.index("nodes", id="nodes", registry=registry)
    async def nodes(body: kopf.Body, name: str, **_: Any) -> dict[str, NodeInfo]:
        return {name: node_info(body)}

    @kopf.index("pods", id="gpus", registry=registry)
    async def gpus(body: kopf.Body, **_: Any) -> dict[GpuIndexKey, float]:
        # Keyed by node name for a bound pod's GPUs, by (GPUPool, zone) for the GPUs an
        # unbound worker reserves, and by (WAITING, GPUPool, zone) for when it was created
        # (the zone's oldest waiting worker decides whether the zone is backed off).
        usage = pod_gpu_request(body)
        if usage:
            return {usage[0]: usage[1]}
        reservation = pod_gpu_reservation(body)
        # An empty mapping, not None: Kopf keeps an object's previous value when the index
        # function returns None, so a pod that finished would hold its GPUs forever.
        if not reservation:
            return {}
        pool_name, zone, gpus = reservation
        entry: dict[GpuIndexKey, float] = {(pool_name, zone): gpus}
        created = created_at(body)
        if created is not None:
            entry[(WAITING, pool_name, zone)] = created.timestamp()
        return entry

    @kopf.index("pods", id="others", registry=registry)
    async def others(body: kopf.Body, **_: Any) -> dict[str, float]:
        # node -> GPUs of the bound GPU pods that are no Sailplan workers: a planning pass
        # lists the workers fresh and takes the rest from here (controller.runtime).
        usage = other_pod_gpu_request(body)
        return {usage[0]: usage[1]} if usage else {}

    @kopf.index("pods", id="priorities", registry=registry)
    async def priorities(body: kopf.Body, **_: Any) -> dict[str, int]:
        # node -> priority of each bound pod holding its GPUs: what a job of higher
        # priority may preempt (reconcile.snapshot.with_preemptible).
        usage = pod_gpu_request(body)
        return {usage[0]: pod_priority(body)} if usage else {}

    @kopf.index(group=GROUP, version=VERSION, plural=pool_api.PLURAL, id="pools", registry=registry)
    async def pools(body: kopf.Body, name: str, **_: Any) -> dict[str, dict[str, Any]]:
        return {name: dict(body)}

    @kopf.index(
        "configmaps",
        id="profiles",
        registry=registry,
        labels={naming.LABEL_PROFILE: kopf.PRESENT},
        when=lambda namespace, **_: namespace == config.profile_namespace,
    )
    async def profiles(body: kopf.Body, name: str, **_: Any) -> dict[str, ParsedConfigMap]:
        parsed, fresh = runtime.profile_store.parsed(body)
        for problem in parsed.problems if fresh else ():
            log.warning("profile store: document skipped", extra={"problem": problem})
        return {name: parsed}

    @kopf.index(
        provisioning.GROUP,
        provisioning.PLURAL,
        id="capacity",
        registry=registry,
        labels={naming.LABEL_ROLE: provisioning.ROLE_CAPACITY, naming.LABEL_JOB: kopf.PRESENT},
    )
    async def capacity(
        body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any
    ) -> dict[tuple[str, str], dict[str, Any]]:
        # (namespace, job) -> the operator's ProvisioningRequests for that job.
        return {(namespace or "", labels[naming.LABEL_JOB]): dict(body)}

    @kopf.index(
        group=kueue.GROUP,
        version=kueue.VERSION,
        plural=kueue.PLURAL,
        id="workloads",
        registry=registry,
        labels={naming.LABEL_ROLE: kueue.ROLE_WORKLOAD, naming.LABEL_JOB: kopf.PRESENT},
    )
    async def workloads(
        body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any
    ) -> dict[tuple[str, str], dict[str, Any]]:
        # (namespace, job) -> the job's Kueue Workloads.
        return {(namespace or "", labels[naming.LABEL_JOB]): dict(body)}

    def handling(kwargs: dict[str, Any]) -> None:
        """Every handler's first step: indices to the runtime (Kopf passes the same live
        objects each time; every index is filled before the first handler runs), and the
        background tasks started in this handler's context."""
        runtime.indices.update({index: kwargs[index] for index in INDICES})
        runtime.ensure_started()

    async def kick_pools(kwargs: dict[str, Any]) -> None:
        handling(kwargs)
        await runtime.pools.kick()

    @kopf.on.event("nodes", id="node-changed", registry=registry)
    async def node_changed(**kwargs: Any) -> None:
        await kick_pools(kwargs)

    @kopf.on.event("pods", id="gpu-pod-changed", registry=registry, when=_holds_gpus)
    async def gpu_pod_changed(**kwargs: Any) -> None:
        await kick_pools(kwargs)

    @kopf.on.event(
        group=GROUP,
        version=VERSION,
        plural=pool_api.PLURAL,
        id="gpupool-changed",
        registry=registry,
    )
    async def pool_changed(**kwargs: Any) -> None:
        await kick_pools(kwargs)

    @kopf.on.event(
        "configmaps",
        id="profiles-changed",
        registry=registry,
        labels={naming.LABEL_PROFILE: kopf.PRESENT},
        when=lambda namespace, **_: namespace == config.profile_namespace,
    )
    async def profiles_changed(type: str, name: str, **kwargs: Any) -> None:
        handling(kwargs)
        if type == "DELETED":
            runtime.profile_store.forget(name)
        # Any job may be waiting for these profiles (or plan better with them).
        runtime.wake_all_jobs()

    # -- TrainingJobs ------------------------------------------------------------------
    @kopf.on.event(
        group=GROUP,
        version=VERSION,
        plural=job_api.PLURAL,
        id="trainingjob-changed",
        registry=registry,
        when=lambda namespace, **_: _serves(config, namespace),
    )
    async def job_changed(type: str, name: str, namespace: str | None, **kwargs: Any) -> None:
        handling(kwargs)
        key = (namespace or "", name)
        if type == "DELETED":
            runtime.forget_job(key)
            return
        runtime.jobs.add(key)
        runtime.queue.enqueue(key)

    @kopf.on.event(
        "batch",
        "jobs",
        id="profiling-job-changed",
        registry=registry,
        labels={naming.LABEL_JOB: kopf.PRESENT, naming.LABEL_ROLE: ROLE_PROFILER},
        when=lambda namespace, **_: _serves(config, namespace),
    )
    async def profiling_job_changed(
        labels: kopf.Labels, namespace: str | None, **kwargs: Any
    ) -> None:
        handling(kwargs)
        runtime.queue.enqueue((namespace or "", labels[naming.LABEL_JOB]))

    @kopf.on.event(
        "pods",
        id="worker-pod-changed",
        registry=registry,
        labels={naming.LABEL_JOB: kopf.PRESENT, naming.LABEL_ROLE: naming.ROLE_WORKER},
        when=lambda namespace, **_: _serves(config, namespace),
    )
    async def worker_changed(labels: kopf.Labels, namespace: str | None, **kwargs: Any) -> None:
        handling(kwargs)
        runtime.queue.enqueue((namespace or "", labels[naming.LABEL_JOB]))

    @kopf.on.event(
        provisioning.GROUP,
        provisioning.PLURAL,
        id="capacity-request-changed",
        registry=registry,
        labels={naming.LABEL_ROLE: provisioning.ROLE_CAPACITY, naming.LABEL_JOB: kopf.PRESENT},
        when=lambda namespace, **_: _serves(config, namespace),
    )
    async def capacity_request_changed(
        labels: kopf.Labels, namespace: str | None, **kwargs: Any
    ) -> None:
        # Failed backs its zone off (the pool refresh) and the job replans; Provisioned
        # lets the job create its workers: both now, not at the next poll.
        await kick_pools(kwargs)
        runtime.queue.enqueue((namespace or "", labels[naming.LABEL_JOB]))

    @kopf.on.event(
        group=kueue.GROUP,
        version=kueue.VERSION,
        plural=kueue.PLURAL,
        id="workload-changed",
        registry=registry,
        labels={naming.LABEL_ROLE: kueue.ROLE_WORKLOAD, naming.LABEL_JOB: kopf.PRESENT},
        when=lambda namespace, **_: _serves(config, namespace),
    )
    async def workload_changed(labels: kopf.Labels, namespace: str | None, **kwargs: Any) -> None:
        # Admitted, evicted, preempted, or deleted: the job's pass now, not at a poll.
        handling(kwargs)
        runtime.queue.enqueue((namespace or "", labels[naming.LABEL_JOB]))

    return registry
