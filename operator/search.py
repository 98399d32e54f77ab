"""What a reconcile pass gets back when it asks for a plan.

The planner's search can take minutes, so the reconcile never waits for it: the `Planner`
it is handed answers at once with the planner's PlanResult when the search for that exact
request has finished, with `Searching` while it still runs (the pass reports the Planning
condition and changes nothing else), or with `SearchFailed` when the search process died
or overran its hard limit. sailplan.operator.planning runs the searches and binds one
`Planner` per job; the unit tests hand the reconcile functions planners of their own.

While a search runs, `Searching.interim` may carry a finished plan for the same spec made
from other inputs (an older cluster snapshot, fewer measured profiles) that still fits the
cluster asked about (`plan_fits`): the best known plan that is valid now. A first plan may
start on it; a replan decision switches to it only when it must (capacity lost), and
otherwise waits for the answer to exactly what it asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sailplan.planner.api import Planned, PlanRequest, PlanResult
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.types import ProfileSet


@dataclass(frozen=True)
class Interim:
    """A finished plan for the job's same spec, made from `cluster` and `measured` (not
    what was asked now), that fits the cluster asked about.

    A caller that adopts it records `cluster` and `measured` as what its plan was judged
    against, so the replan machine's triggers (new capacity, new measurements) still fire
    and ask again for the plan of the current inputs.
    """

    planned: Planned
    cluster: ClusterSnapshot
    measured: ProfileSet


@dataclass(frozen=True)
class Searching:
    """A search under way (or waiting for a free worker process) for the request asked."""

    started_at: datetime
    deadline_seconds: float
    what: str  # one line: model, GPUs and pools considered, objective
    queued: bool = False  # every worker process is busy; the search starts when one frees
    interim: Interim | None = None  # the best known plan that fits now, if any


@dataclass(frozen=True)
class SearchFailed:
    """The search ended without an answer from the planner (its process crashed or was
    killed past its deadline); `message` is one line for the user."""

    message: str


PlannerAnswer = PlanResult | Searching | SearchFailed
Planner = Callable[[PlanRequest, ProfileSet], PlannerAnswer]


def describe(request: PlanRequest) -> str:
    """What a search looks at, for the Planning condition: model, GPUs by type, pools and
    objective with its constraints."""
    pools = [p for p in request.cluster.pools if p.gpus]
    gpus: dict[str, int] = {}
    for pool in pools:
        gpus[pool.gpu_type] = gpus.get(pool.gpu_type, 0) + pool.gpus
    objective = request.objective
    limits = [
        f"{name} {value:g}"
        for name, value in (
            ("minSamplesPerSecond", objective.min_samples_per_second),
            ("maxUsdPerHour", objective.max_usd_per_hour),
            ("maxUsdPerIteration", objective.max_usd_per_iteration),
        )
        if value is not None
    ]
    gpu_text = ", ".join(f"{count} {gpu}" for gpu, count in sorted(gpus.items()))
    return (
        f"{request.model.name}, global batch {request.global_batch_size}, over {gpu_text} "
        f"in pools {', '.join(p.name for p in pools)}; objective "
        f"{objective.kind}{' with ' + ', '.join(limits) if limits else ''}"
    )


def plan_fits(plan: Plan, cluster: ClusterSnapshot) -> bool:
    """Whether `plan` can be placed on `cluster` as it is now.

    Every snapshot pool (one GPUPool in one zone) the plan's workers use must still be in
    the cluster with the same zone and GPU type, have at least as many free GPUs as the
    plan uses there, and enough free nodes for its tensor-parallel groups: a group never
    spans nodes, and the snapshot counts only wholly free nodes. A plan made from another
    snapshot is served only if this holds, so a job is never started on GPUs that are gone.
    """
    groups: dict[tuple[str, str, str], list[int]] = {}
    for worker in plan.workers():
        key = (worker.pool, worker.zone, worker.gpu_type)
        groups.setdefault(key, []).append(worker.tensor_parallel)
    pools = {(p.name, p.zone, p.gpu_type): p for p in cluster.pools}
    for key, sizes in groups.items():
        pool = pools.get(key)
        if pool is None or sum(sizes) > pool.gpus:
            return False
        if _nodes_needed(sizes, pool.gpus_per_node) > pool.nodes:
            return False
    return True


def _nodes_needed(group_sizes: list[int], gpus_per_node: int) -> int:
    """Nodes the tensor-parallel groups need, packed first-fit decreasing (a group never
    spans nodes; one larger than a node cannot be placed at all)."""
    room: list[int] = []
    for size in sorted(group_sizes, reverse=True):
        if size > gpus_per_node:
            return 1 << 30
        for index, free in enumerate(room):
            if free >= size:
                room[index] -= size
                break
        else:
            room.append(gpus_per_node - size)
    return len(room)
