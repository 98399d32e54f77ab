"""What one TrainingJob reconcile pass does about profiling, as a pure function.

Called by the TrainingJob reconcile (reconcile.trainingjob) on every pass of a job that is
neither invalid nor finished. From the job, its selected GPUPools, the measured profiles in
the store and the profiling Jobs it already owns, `profiling_step` returns:

- the Jobs (and rendezvous Services) still to create, for needs the policy lets it launch;
- the needs whose Jobs all succeeded, for the handler to collect: read the result pod's
  log, write a store ConfigMap (results.collect), or mark the Job unreadable;
- the Profiling condition and the Events worth a person's attention;
- the decision (needs.profiling_decision): may the job plan now;
- how many nodes per snapshot pool unfinished profiling pods occupy, so a job
  that plans with estimates meanwhile (policy Auto) leaves them room instead of racing
  them for the same GPUs (reserve()).

A failed need is never relaunched by itself: its Job keeps its deterministic name, so
deleting that Job is how a person asks for another try (the condition says so).

An autoscaled GPUPool zone with no ready node has nothing to measure on yet. Required counts
one node there: its profiling pods, pinned to the pool and zone, are what makes the
autoscaler add it. Auto and Skip plan with estimates for it (the condition names what is
estimated until a node is ready), and Auto profiles it on the first pass that sees a ready
node; the measured profiles then trigger a replan like any others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sailplan.operator.api.common import Condition
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.profiling.jobs import render_profiling_objects
from sailplan.operator.profiling.needs import (
    ComputeNeed,
    Need,
    ProfilingDecision,
    Site,
    missing_profiles,
    need_id,
    profiling_decision,
)
from sailplan.operator.profiling.results import result_pod_labels
from sailplan.operator.profiling.status import (
    COND_PROFILING,
    REASON_PROFILES_COLLECTED,
    REASON_PROFILING_FAILED,
    REASON_PROFILING_SKIPPED,
    ObservedJob,
    profiling_status,
)
from sailplan.operator.reconcile.naming import pool_key
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.operator.reconcile.summary import KubeEvent
from sailplan.operator.replan.triggers import nodes_needed
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.types import ProfileSet


@dataclass(frozen=True)
class Collect:
    """A need whose Jobs succeeded: where its result is, and which Jobs to blame if not."""

    need: Need
    pod_labels: Mapping[str, str]  # selects the pod whose `report` log holds the result
    jobs: tuple[str, ...]


@dataclass(frozen=True)
class ProfilingStep:
    decision: ProfilingDecision
    create: tuple[dict[str, Any], ...] = ()
    collect: tuple[Collect, ...] = ()
    condition: Condition | None = None
    events: tuple[KubeEvent, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()  # (need key, why)
    # Nodes per snapshot pool (gpupool/zone) that profiling pods created in this pass or
    # still running take.
    reserved_nodes: Mapping[str, int] = field(default_factory=dict)

    @property
    def waiting_message(self) -> str:
        """Why a job that may not plan yet waits, and what a person can do about it."""
        if self.failed:
            key, why = self.failed[0]
            return (
                f"profiling {key} failed ({why}); delete that Job to retry, import measured "
                "profiles with `sailplan profiles import`, or set spec.profiling.mode to Auto"
            )
        return self.decision.message


def _gpus(need: Need, site: Site) -> int:
    """GPUs one profiling pod at `site` asks for (as jobs.py renders it)."""
    if isinstance(need, ComputeNeed):
        return max(need.tensor_parallel)
    return need.flows


def _sites(need: Need) -> tuple[Site, ...]:
    if isinstance(need, ComputeNeed):
        return (need.site,)
    return (need.site,) if need.link == "intra-node" else (need.site, need.peer)


def nodes_taken(needs: Iterable[Need]) -> dict[str, int]:
    """Nodes the profiling pods of `needs` occupy per snapshot pool (first-fit packing)."""
    gpus: dict[str, list[int]] = {}
    per_node: dict[str, int] = {}
    for need in needs:
        for site in _sites(need):
            key = pool_key(site.gpupool, site.zone)
            gpus.setdefault(key, []).append(_gpus(need, site))
            per_node[key] = site.gpus_per_node
    return {key: nodes_needed(found, per_node[key]) for key, found in sorted(gpus.items())}


def reserve(cluster: ClusterSnapshot, nodes: Mapping[str, int]) -> ClusterSnapshot:
    """`cluster` without the nodes profiling pods are about to take."""
    if not nodes:
        return cluster
    pools = tuple(
        pool.model_copy(update={"nodes": max(0, pool.nodes - nodes.get(pool.name, 0))})
        for pool in cluster.pools
    )
    return cluster.model_copy(update={"pools": pools})


def profiling_step(
    job: TrainingJob,
    model: ModelSpec,
    selected: Sequence[GPUPool],
    measured: ProfileSet,
    *,
    jobs: Sequence[ObservedJob],
    previous: Condition | None,
) -> ProfilingStep:
    mode = job.spec.profiling.mode
    batch = job.spec.training.global_batch_size
    # Every ready node: pools busy right now (with this job's profiling pods, say) are
    # still pools the job may run on.
    ready = missing_profiles(model, batch, build_snapshot(selected, "ready"), measured)
    possible = missing_profiles(model, batch, build_snapshot(selected, "possible"), measured)
    needs = possible if mode == "Required" else ready
    decision = profiling_decision(mode, needs)
    measurable = {need.key for need in ready}
    later = [need for need in possible if need.key not in measurable]
    if later and mode != "Required":
        decision = replace(
            decision,
            message=f"{decision.message}; {len(later)} more for pools with no ready node "
            f"(first: {later[0].key}): estimated until a node is ready",
        )
    if not decision.launch and not jobs and previous is None:
        return ProfilingStep(decision)
    progress = profiling_status(needs, jobs)
    existing = {j.name for j in jobs}
    finished = set(progress.done) | {key for key, _ in progress.failed}
    pools = {p.name: p for p in selected}
    create: list[dict[str, Any]] = []
    launched: list[Need] = []
    for need in decision.launch:
        if need.key in finished:
            continue
        objects = render_profiling_objects(job, (need,), pools)
        missing = [
            o for o in objects if o["kind"] == "Job" and o["metadata"]["name"] not in existing
        ]
        if missing:
            create += [o for o in objects if o["kind"] != "Job"] + missing
            launched.append(need)

    by_key = {need.key: need for need in needs}
    # Launched now or still running: their pods may not be bound yet, so the GPUPool status
    # need not show those GPUs as taken (over-reserving only delays using them a little).
    busy = [n for n in needs if n.key in progress.running or n in launched]
    collect = tuple(
        Collect(
            need=by_key[key],
            pod_labels=result_pod_labels(job, by_key[key]),
            jobs=tuple(sorted(j.name for j in jobs if j.need == need_id(by_key[key]))),
        )
        for key in progress.done
    )

    condition = progress.condition(job.generation)
    if not needs or (not decision.launch and not progress.running and not progress.failed):
        # Nothing missing, or nothing this policy will measure (Skip after a mode edit).
        condition = Condition(
            type=COND_PROFILING,
            status="False",
            reason=REASON_PROFILES_COLLECTED if not needs else REASON_PROFILING_SKIPPED,
            message=decision.message,
            observed_generation=job.generation,
        )
    events: list[KubeEvent] = []
    if launched:
        events.append(
            KubeEvent(
                "Normal",
                "ProfilingStarted",
                f"created profiling Jobs for {len(launched)} missing profiles "
                f"(first: {launched[0].key})",
            )
        )
    if condition.reason == REASON_PROFILING_FAILED and (
        previous is None
        or (previous.reason, previous.message) != (condition.reason, condition.message)
    ):
        events.append(KubeEvent("Warning", REASON_PROFILING_FAILED, condition.message))
    return ProfilingStep(
        decision=decision,
        create=tuple(create),
        collect=collect,
        condition=condition,
        events=tuple(events),
        failed=progress.failed,
        reserved_nodes=nodes_taken(busy),
    )
