"""What a reconcile pass gets back when it asks for a plan.

The planner's search can take minutes, so the reconcile never waits for it: the `Planner`
it is handed answers at once with the planner's PlanResult when the search for that exact
request has finished, with `Searching` while it still runs (the pass reports the Planning
condition and changes nothing else), or with `SearchFailed` when the search process died
or overran its hard limit. sailplan.operator.planning runs the searches and binds one
`Planner` per job; the unit tests hand the reconcile functions planners of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sailplan.planner.api import PlanRequest, PlanResult
from sailplan.planner.profiles.types import ProfileSet


@dataclass(frozen=True)
class Searching:
    """A search under way (or waiting for a free worker process) for the request asked."""

    started_at: datetime
    deadline_seconds: float
    what: str  # one line: model, GPUs and pools considered, objective
    queued: bool = False  # every worker process is busy; the search starts when one frees


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
