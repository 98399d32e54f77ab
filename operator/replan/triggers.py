"""What changed: the events that can make a TrainingJob replan, classified from observed state.

Pure functions over what the operator already watches (worker pods as API dicts, NodeInfo
records, GPUPool statuses, the job spec). Each trigger has a constant name and a one-line
message for the status history and Events, and says whether it is involuntary (the
current plan cannot go on: switch at once, never delayed by the cooldown) and whether the
workers are still alive to write a checkpoint first (graceful).

The cluster view for replanning is `capacity_snapshot`: the GPUPools' free (and
obtainable) nodes PLUS the schedulable nodes this job's own workers hold and the GPUs its
own unbound workers reserve, because a job sees its own nodes and reservations as "in use"
and would otherwise think capacity vanished the moment it started.

Called by replan.machine; the caller builds WorkerPod records with pod_facts().
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJobSpec
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.children import controller_uid
from sailplan.operator.reconcile.nodes import NodeInfo, pod_gpu_reservation
from sailplan.operator.reconcile.overrides import ignored_notes
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.workerenv import CHECKPOINT_REQUEST_ANNOTATION, TrainerProgress

TRAINER_CONTAINER: Final = "trainer"  # the worker pod's container (reconcile.children)

# -- trigger names (status history reasons and Event reasons) ----------------------------
WORKER_PREEMPTED: Final = "WorkerPreempted"
NODE_LOST: Final = "NodeLost"
NODE_CORDONED: Final = "NodeCordoned"
CAPACITY_LOST: Final = "CapacityLost"
CAPACITY_ADDED: Final = "CapacityAdded"
PRICE_CHANGED: Final = "PriceChanged"
OBJECTIVE_CHANGED: Final = "ObjectiveChanged"
CLUSTER_CHANGED: Final = "ClusterChanged"
WORKER_FAILED: Final = "WorkerFailed"
CAPACITY_RETURNED: Final = "CapacityReturned"
PROFILES_MEASURED: Final = "ProfilesMeasured"
SUSPENDED: Final = "Suspended"  # spec.suspend set: drain, then no workers
RESUMED: Final = "Resumed"  # spec.suspend unset: plan anew from the last checkpoint

# The kubelet, scheduler, taint manager and eviction API mark a pod they kill with the
# DisruptionTarget condition (k8s >= 1.26); older paths only leave a status.reason.
DISRUPTION_CONDITION: Final = "DisruptionTarget"
DISRUPTION_REASONS: Final = frozenset(
    {"Preempted", "Evicted", "TerminationByKubelet", "Shutdown", "NodeShutdown", "Terminated"}
)
NODE_LOST_REASON: Final = "NodeLost"


@dataclass(frozen=True)
class Trigger:
    name: str
    message: str
    involuntary: bool = False
    graceful: bool = True  # the current workers are alive and can checkpoint first


# -- worker pods -------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerPod:
    """The facts about one worker pod that replanning decisions depend on."""

    name: str
    generation: int
    attempt: int
    worker_index: int
    uid: str = ""
    phase: str = "Pending"
    node: str | None = None
    gpupool: str = ""
    deleting: bool = False
    disruption: str | None = None  # why the cluster killed it, if it did
    exit_code: int | None = None  # first non-zero container exit code
    checkpoint_request: str | None = None
    # Rank 0's last reading of its metrics endpoint (controller.progress.attach), and when
    # the operator first read that step; or, once the trainer exited, its final progress
    # from the termination message (`final_progress`) and when it exited.
    progress: TrainerProgress | None = None
    progress_time: datetime | None = None
    owner_uid: str = ""  # the controlling TrainingJob's uid
    # (GPUPool, zone, GPUs) while created and not bound: capacity it reserves
    reservation: tuple[str, str, int] | None = None
    # spec.podTemplateOverrides entries its rendering overruled (reconcile.overrides)
    overrides_ignored: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """Identity for the failure budget: a recreated pod with the same name is a new pod."""
        return self.uid or self.name

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def pod_facts(body: Mapping[str, Any]) -> WorkerPod | None:
    """A worker pod from its API dict; None if it lacks the operator's labels."""
    metadata = body.get("metadata") or {}
    labels = metadata.get("labels") or {}
    try:
        generation = int(labels[naming.LABEL_GENERATION])
        attempt = int(labels[naming.LABEL_ATTEMPT])
        index = int(labels[naming.LABEL_WORKER])
    except (KeyError, ValueError):
        return None
    status = body.get("status") or {}
    annotations = metadata.get("annotations") or {}
    disruption = next(
        (
            str(c.get("reason") or DISRUPTION_CONDITION)
            for c in status.get("conditions") or ()
            if c.get("type") == DISRUPTION_CONDITION and c.get("status") == "True"
        ),
        None,
    )
    if disruption is None and status.get("reason") in DISRUPTION_REASONS:
        disruption = str(status["reason"])
    exit_code = None
    for container in status.get("containerStatuses") or ():
        terminated = (container.get("state") or {}).get("terminated") or {}
        code = terminated.get("exitCode")
        if isinstance(code, int) and code != 0:
            exit_code = code
            break
    return WorkerPod(
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
        owner_uid=controller_uid(metadata),
        generation=generation,
        attempt=attempt,
        worker_index=index,
        phase=str(status.get("phase") or "Pending"),
        node=(body.get("spec") or {}).get("nodeName"),
        gpupool=str(labels.get(naming.LABEL_GPUPOOL, "")),
        deleting=metadata.get("deletionTimestamp") is not None,
        disruption=disruption,
        exit_code=exit_code,
        checkpoint_request=annotations.get(CHECKPOINT_REQUEST_ANNOTATION),
        reservation=pod_gpu_reservation(body),
        overrides_ignored=ignored_notes(annotations),
        **final_progress(status),
    )


def with_bindings(
    pods: Iterable[WorkerPod], bound: Mapping[str, str], nodes: Mapping[str, NodeInfo]
) -> tuple[WorkerPod, ...]:
    """`pods` with the bindings a later read of them found (`bound`: pod uid -> node).

    A planning pass lists its job's workers first and every job's live workers later
    (controller.runtime); a worker that the scheduler bound in between is unbound in the
    first read and holds its node in the second, which counts that node busy and the
    worker's GPUs no longer reserved. Taken as unbound here as well, the worker would
    neither hold its node nor reserve GPUs in capacity_snapshot, and the job's plan would
    seem a node short (a CapacityLost while an autoscaler's nodes come up). Only bindings
    onto nodes the pass knows are taken: one onto a node it does not know would read as a
    node that is gone.
    """
    result = []
    for pod in pods:
        node = bound.get(pod.uid) if pod.uid else None
        if pod.node is None and node is not None and node in nodes:
            pod = replace(pod, node=node, reservation=None)
        result.append(pod)
    return tuple(result)


def final_progress(status: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer's last progress from its termination message (trainer.progress writes
    TrainerProgress JSON there on global rank 0) with the time it exited, as WorkerPod
    fields; none while it runs or from a message that is not that JSON."""
    for container in status.get("containerStatuses") or ():
        if container.get("name") != TRAINER_CONTAINER:
            continue
        terminated = (container.get("state") or {}).get("terminated") or {}
        message = terminated.get("message")
        if not message:
            return {}
        try:
            progress = TrainerProgress.model_validate_json(message)
            finished = terminated.get("finishedAt")
            time = datetime.fromisoformat(finished) if finished else None
        except ValueError:  # pydantic's ValidationError too
            return {}
        return {"progress": progress, "progress_time": time}
    return {}


class PodFate(StrEnum):
    OK = "ok"  # pending, running or finished cleanly
    PREEMPTED = "preempted"  # killed by the cluster (DisruptionTarget, eviction, ...)
    NODE_LOST = "node-lost"  # its node is gone or NotReady: it will not come back
    CORDONED = "cordoned"  # alive, but its node is being drained
    FAILED = "failed"  # non-zero exit the cluster did not cause


def pod_fate(pod: WorkerPod, nodes: Mapping[str, NodeInfo]) -> tuple[PodFate, str]:
    """What happened to one worker, with a one-line explanation."""
    node = nodes.get(pod.node) if pod.node else None
    if pod.disruption is not None:
        return PodFate.PREEMPTED, f"worker pod {pod.name} was disrupted ({pod.disruption})"
    if pod.node and pod.phase not in ("Succeeded",):
        if node is None:
            return PodFate.NODE_LOST, f"node {pod.node} of worker pod {pod.name} is gone"
        if not node.ready:
            return PodFate.NODE_LOST, f"node {pod.node} of worker pod {pod.name} is NotReady"
    if pod.phase == "Failed":
        code = pod.exit_code if pod.exit_code is not None else "unknown"
        return PodFate.FAILED, f"worker pod {pod.name} failed with exit code {code}"
    if node is not None and node.unschedulable and not pod.finished:
        return PodFate.CORDONED, f"node {pod.node} of worker pod {pod.name} is cordoned"
    return PodFate.OK, ""


@dataclass(frozen=True)
class PodReport:
    """The current attempt's workers sorted by fate (names in stable order)."""

    disrupted: tuple[tuple[WorkerPod, str], ...] = ()  # preempted or node lost
    cordoned: tuple[tuple[WorkerPod, str], ...] = ()
    failed: tuple[tuple[WorkerPod, str], ...] = ()  # real failures (see classify_pods)

    @property
    def collateral(self) -> bool:
        return bool(self.disrupted) and bool(self.failed)


def classify_pods(pods: Iterable[WorkerPod], nodes: Mapping[str, NodeInfo]) -> PodReport:
    """Sort the workers of ONE attempt by fate.

    When any worker of the attempt was disrupted, the others' failures are collateral (a
    peer vanishing makes NCCL/gloo raise on every other rank) and are not real failures:
    they are dropped from `failed`, so they never spend the failure budget.
    """
    disrupted, cordoned, failed = [], [], []
    for pod in sorted(pods, key=lambda p: (p.worker_index, p.name)):
        fate, why = pod_fate(pod, nodes)
        if fate in (PodFate.PREEMPTED, PodFate.NODE_LOST):
            disrupted.append((pod, why))
        elif fate is PodFate.CORDONED:
            cordoned.append((pod, why))
        elif fate is PodFate.FAILED:
            failed.append((pod, why))
    if disrupted:
        failed = []
    return PodReport(tuple(disrupted), tuple(cordoned), tuple(failed))


# -- cluster capacity ------------------------------------------------------------------------
def capacity_snapshot(
    pools: Sequence[GPUPool], own_pods: Iterable[WorkerPod], nodes: Mapping[str, NodeInfo]
) -> ClusterSnapshot:
    """The selected GPUPools' free and obtainable nodes plus the schedulable nodes this job's
    workers hold and the GPUs its unbound workers reserve.

    Pass the GPUPools the job selects (reconcile.snapshot.select_pools). A node holding
    several of the job's workers counts once; a node that is NotReady or cordoned does not
    count (it is exactly the capacity being lost). Every other job's unbound workers stay
    reserved (the statuses' gpusReserved).
    """
    own_reserved: dict[str, int] = {}
    held: dict[tuple[str, str], set[str]] = {}
    for pod in own_pods:
        if pod.reservation is not None:
            pool_name, zone_name, gpus = pod.reservation
            key = naming.pool_key(pool_name, zone_name)
            own_reserved[key] = own_reserved.get(key, 0) + gpus
        node = nodes.get(pod.node) if pod.node else None
        if node is None or not node.schedulable or pod.finished or not pod.gpupool:
            continue
        held.setdefault((pod.gpupool, node.zone), set()).add(node.name)
    adjusted: list[GPUPool] = []
    for pool in pools:
        zones = tuple(
            zone.model_copy(
                update={
                    "nodes_free": min(
                        zone.nodes_ready,
                        zone.nodes_free + len(held.get((pool.name, zone.zone), ())),
                    )
                }
            )
            for zone in pool.status.zones
        )
        status = pool.status.model_copy(update={"zones": zones})
        adjusted.append(pool.model_copy(update={"status": status}))
    reserved = {
        naming.pool_key(pool.name, zone.zone): max(
            0, zone.gpus_reserved - own_reserved.get(naming.pool_key(pool.name, zone.zone), 0)
        )
        for pool in pools
        for zone in pool.status.zones
    }
    return build_snapshot(adjusted, reserved=reserved)


def nodes_needed(tensor_parallel: Sequence[int], gpus_per_node: int) -> int:
    """Nodes a set of TP groups needs (first-fit decreasing; a group never spans nodes)."""
    free: list[int] = []
    for tp in sorted(tensor_parallel, reverse=True):
        if tp > gpus_per_node:
            return 1 << 30  # cannot be placed at all
        for i, room in enumerate(free):
            if room >= tp:
                free[i] -= tp
                break
        else:
            free.append(gpus_per_node - tp)
    return len(free)


def plan_shortfall(plan: Plan, cluster: ClusterSnapshot) -> list[str]:
    """Why `plan` no longer fits `cluster`, one line per pool; empty if it fits."""
    groups: dict[str, list[int]] = {}
    for worker in plan.workers():
        groups.setdefault(worker.pool, []).append(worker.tensor_parallel)
    problems = []
    by_name = {p.name: p for p in cluster.pools}
    for name, tps in sorted(groups.items()):
        pool = by_name.get(name)
        if pool is None:
            problems.append(f"pool {name} has no usable nodes")
            continue
        need = nodes_needed(tps, pool.gpus_per_node)
        if need > pool.nodes:
            problems.append(f"pool {name} has {pool.nodes} usable nodes, the plan needs {need}")
    return problems


@dataclass(frozen=True)
class ClusterChange:
    added: tuple[str, ...] = ()  # "pool: +N GPUs" or "pool: new, N GPUs"
    removed: tuple[str, ...] = ()
    repriced: tuple[str, ...] = ()


def compare_snapshots(old: ClusterSnapshot, new: ClusterSnapshot) -> ClusterChange:
    before = {p.name: p for p in old.pools}
    after = {p.name: p for p in new.pools}
    added, removed, repriced = [], [], []
    for name in sorted(before.keys() | after.keys()):
        a, b = before.get(name), after.get(name)
        gpus_a, gpus_b = (a.gpus if a else 0), (b.gpus if b else 0)
        if gpus_b > gpus_a:
            added.append(f"{name}: +{gpus_b - gpus_a} GPUs" + ("" if a else " (new)"))
        elif gpus_b < gpus_a:
            removed.append(f"{name}: -{gpus_a - gpus_b} GPUs")
        if a and b and a.usd_per_gpu_hour != b.usd_per_gpu_hour:
            repriced.append(f"{name}: {_price(a.usd_per_gpu_hour)} -> {_price(b.usd_per_gpu_hour)}")
    if old.egress_usd_per_gb != new.egress_usd_per_gb:
        repriced.append("egress prices")
    return ClusterChange(tuple(added), tuple(removed), tuple(repriced))


def _price(value: float | None) -> str:
    return "catalog price" if value is None else f"${value:.2f}/GPU-h"


def spec_fingerprint(spec: TrainingJobSpec) -> str:
    """Hash of the spec fields the plan depends on (objective, pools, batch), not the rest,
    so editing e.g. the checkpoint interval does not trigger a replan."""
    body = {
        "objective": spec.objective.to_kube(),
        "pools": spec.pools.to_kube(),
        "batch": spec.training.global_batch_size,
        "optimizer": spec.training.optimizer,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def profiles_fingerprint(measured: ProfileSet) -> str:
    """Hash of which measured profiles exist (not their values: a re-measurement of the
    same grid point is not news worth a replan)."""
    found = sorted(
        {p.key for p in measured.compute if p.provenance.source == "measured"}
        | {p.key for p in measured.network if p.provenance.source == "measured"}
    )
    return hashlib.sha256("\n".join(found).encode()).hexdigest()[:16]


def voluntary_trigger(
    *,
    spec: TrainingJobSpec,
    evaluated_spec: str,
    cluster: ClusterSnapshot,
    evaluated_hash: str,
    evaluated_cluster: ClusterSnapshot | None,
    plan: Plan | None = None,
    measured: ProfileSet | None = None,
    evaluated_profiles: str = "",
) -> Trigger | None:
    """A change that MAY make another plan better; None when nothing worth planning changed.

    Capacity that only shrank elsewhere cannot make a better plan (the best plan over fewer
    GPUs is no better), so it is not a trigger; the caller still records the new snapshot.
    New measured profiles matter only to a plan that was made with estimates (profiling
    policy Auto: plan now, replan when the measurements arrive).
    """
    if spec_fingerprint(spec) != evaluated_spec:
        return Trigger(OBJECTIVE_CHANGED, "the objective, constraints or pool selection changed")
    if (
        measured is not None
        and plan is not None
        and plan.inputs.estimated
        and profiles_fingerprint(measured) != evaluated_profiles
    ):
        return Trigger(
            PROFILES_MEASURED,
            f"new measured profiles for a plan made with {len(plan.inputs.estimated)} "
            f"estimated ones (first: {plan.inputs.estimated[0]})",
        )
    new_hash = cluster.content_hash()
    if new_hash == evaluated_hash:
        return None
    if evaluated_cluster is None:
        return Trigger(
            CLUSTER_CHANGED, f"cluster snapshot changed ({evaluated_hash or '?'} -> {new_hash})"
        )
    change = compare_snapshots(evaluated_cluster, cluster)
    if change.added:
        return Trigger(CAPACITY_ADDED, "new capacity: " + "; ".join(change.added))
    if change.repriced:
        return Trigger(PRICE_CHANGED, "price changed: " + "; ".join(change.repriced))
    return None
