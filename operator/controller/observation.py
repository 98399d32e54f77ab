"""Reading a TrainingJob and what surrounds it from the API server into `Observed`.

The runtime (sailplan.operator.controller.runtime) calls these at the start of every
reconcile pass. The job and its children are read fresh from the API server, not from a
cache: the plan ConfigMaps and the job's state ConfigMap (read_memory) there are the truth
about which plan is being rolled out. Nodes come from the Kopf index once it is filled.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sailplan.operator.api.common import LEGACY_VERSION
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.memory import JobMemory
from sailplan.operator.api.trainingjob import PHASE_UNSCHEDULABLE, TrainingJob, TrainingJobStatus
from sailplan.operator.controller.blocking import run_blocking
from sailplan.operator.kube import Kube
from sailplan.operator.nodeagent.assignment import OPT_IN_CLOCKS, opt_in
from sailplan.operator.profilestore import ProfileStore, parse_profile_configmaps
from sailplan.operator.profiling.status import observed_job
from sailplan.operator.reconcile import kueue, memory
from sailplan.operator.reconcile.nodes import NodeInfo, node_info
from sailplan.operator.reconcile.trainingjob import Observed, observed_plan, observed_pod
from sailplan.planner.profiles.types import ProfileSet

log = logging.getLogger("sailplan.operator")


def parse_pool(body: Mapping[str, Any]) -> GPUPool:
    metadata = body.get("metadata") or {}
    return GPUPool(
        name=metadata.get("name", ""),
        generation=metadata.get("generation", 0),
        labels=metadata.get("labels") or {},
        spec=body.get("spec") or {},
        status=body.get("status") or {},
    )


@dataclass(frozen=True)
class ParsedJob:
    """A TrainingJob body as read: the model, or why its spec is invalid."""

    namespace: str
    name: str
    uid: str
    generation: int
    raw_status: dict[str, Any]
    old_status: TrainingJobStatus
    job: TrainingJob | None
    invalid: str = ""  # one line naming the field, when `job` is None


def spec_with_opt_in(body: Mapping[str, Any]) -> dict[str, Any]:
    """The job's spec, with the deprecated `sailplan.dev/energy-clocks: no-slowdown`
    annotation read as `energy.clocks: NoSlowdown`: the node agent honours either
    (nodeagent.assignment.opt_in), so the planner must see either as the same opt-in, or a
    job opted in by the annotation gets plans without the clocks the agent locks."""
    spec = dict(body.get("spec") or {})
    opted, by_annotation = opt_in(body)
    if opted and by_annotation:
        energy = spec.get("energy")
        spec["energy"] = {
            **(energy if isinstance(energy, Mapping) else {}),
            "clocks": OPT_IN_CLOCKS,
        }
    return spec


def parse_job(
    namespace: str, name: str, body: Mapping[str, Any], memory: JobMemory | None = None
) -> ParsedJob:
    """The job in `body`, with the operator's `memory` of it (read_memory)."""
    metadata = body["metadata"]
    raw_status = body.get("status") or {}
    try:
        old_status = TrainingJobStatus.model_validate(raw_status)
    except ValidationError:
        old_status = TrainingJobStatus()
    uid = metadata.get("uid", "")
    generation = metadata.get("generation", 0)
    try:
        job = TrainingJob(
            name=name,
            namespace=namespace,
            uid=uid,
            generation=generation,
            labels=metadata.get("labels") or {},
            spec=spec_with_opt_in(body),
            status=old_status,
            memory=memory or JobMemory(),
        )
    except ValidationError as error:
        # What the schema could not catch (e.g. a custom shape whose heads do not divide
        # the hidden size) still gets a clear condition.
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return ParsedJob(
            namespace,
            name,
            uid,
            generation,
            raw_status,
            old_status,
            None,
            invalid=f"spec.{where}: {first['msg']}",
        )
    return ParsedJob(namespace, name, uid, generation, raw_status, old_status, job)


async def read_memory(
    kube: Kube, namespace: str, name: str, uid: str, raw_status: Mapping[str, Any]
) -> memory.Stored:
    """The operator's memory of a job: its state ConfigMap; for a job an older operator ran
    (a plan or an infeasible planning in its status, no ConfigMap yet), the v1alpha1 status
    fields that held it, which v1beta1 does not show (reconcile.memory)."""
    body = await run_blocking(kube.get_configmap, namespace, memory.state_configmap_name(name))
    stored = memory.read(body, uid)
    if stored is not None:
        return stored
    if raw_status.get("plan") or raw_status.get("phase") == PHASE_UNSCHEDULABLE:
        old = await run_blocking(kube.get_job, namespace, name, LEGACY_VERSION)
        if old is not None and (old.get("metadata") or {}).get("uid") == uid:
            legacy = memory.legacy(old.get("status") or {})
            if not legacy.memory.is_empty():
                log.info(
                    "moving the job's memory from its status to its state ConfigMap",
                    extra={"namespace": namespace, "trainingjob": name},
                )
                return legacy
    return memory.Stored(JobMemory())


async def read_pools(kube: Kube) -> tuple[GPUPool, ...]:
    pools: list[GPUPool] = []
    for pool_body in await run_blocking(kube.list_pools):
        try:
            pools.append(parse_pool(pool_body))
        except ValidationError as error:
            log.warning("GPUPool does not parse", extra={"error": str(error)})
    return tuple(pools)


async def read_nodes(kube: Kube, index: Mapping[str, Any] | None) -> dict[str, NodeInfo]:
    """Every node by name: from the index once Kopf has filled it, else listed (a job
    reconciled before the first node event must not take every node for gone)."""
    if index is not None:
        return {info.name: info for store in index.values() for info in store}
    bodies = await run_blocking(kube.list_nodes)
    return {info.name: info for info in map(node_info, bodies)}


async def read_profiles(
    kube: Kube, store: ProfileStore, index: Mapping[str, Any] | None, namespace: str
) -> ProfileSet:
    """The profile store: from the Kopf index once it is filled (parsed once per ConfigMap
    change), else listed and parsed now."""
    if index is not None:
        return store.profiles(parsed for entries in index.values() for parsed in entries)
    configmaps = await run_blocking(kube.list_profile_configmaps, namespace)
    measured, problems = parse_profile_configmaps(configmaps)
    for problem in problems:
        log.warning("profile store: document skipped", extra={"problem": problem})
    return measured


async def observe(
    kube: Kube,
    job: TrainingJob,
    measured: ProfileSet,
    nodes_index: Mapping[str, Any] | None,
    workload_index: Mapping[Any, Any] | None = None,
) -> Observed:
    """What the reconcile of `job` looks at, read from the API server now (`measured`
    profiles from the index; the nodes from `nodes_index`, the Kopf index of NodeInfo
    records, else listed; the job's Kueue Workloads from `workload_index`, the Kopf index
    by (namespace, job), where Kueue was installed when the operator started, else listed).

    The nodes are read after the GPUPools. A GPUPool status is written from the node
    index, so the index read afterwards knows every node the statuses count as ready.
    Read before, a node that turned Ready in between is missing from both the free nodes
    the pass counts from the index (snapshot.with_in_use, at most the status's ready
    nodes) and the status's possible nodes (it exists now): an autoscaled pool seems to
    lose a node while its nodes come up, and a job planned on them replans away."""
    namespace, name = job.namespace, job.name
    pods, plans, service = await run_blocking(kube.list_job_children, namespace, name)
    profiling_jobs = await run_blocking(kube.list_profiling_jobs, namespace, name)
    workloads: tuple[kueue.ObservedWorkload, ...] | None = ()
    priority = 0
    if kueue.queue_of(job):
        overrides = job.spec.pod_template_overrides
        priority_class = (
            overrides.spec.priority_class_name if overrides and overrides.spec else None
        )
        if priority_class:
            value = await run_blocking(kube.priority_class_value, priority_class)
            priority = value or 0  # none of that name: the API server refuses the workers
        bodies: list[dict[str, Any]] | None
        if workload_index is not None:
            bodies = [dict(b) for b in workload_index.get((namespace, name)) or ()]
        else:
            bodies = await run_blocking(kube.list_workloads, namespace, name)
        workloads = (
            None
            if bodies is None
            else tuple(w for w in map(kueue.observed_workload, bodies) if w is not None)
        )
    pools = await read_pools(kube)
    nodes = await read_nodes(kube, nodes_index)
    return Observed(
        job=job,
        pools=pools,
        plans=tuple(p for p in (observed_plan(cm) for cm in plans) if p is not None),
        pods=tuple(p for p in (observed_pod(b) for b in pods) if p is not None),
        service_exists=service,
        measured=measured,
        nodes=nodes,
        profiling_jobs=tuple(j for j in (observed_job(b) for b in profiling_jobs) if j is not None),
        workloads=workloads,
        workload_priority=priority,
        workloads_watched=workload_index is not None,
    )
