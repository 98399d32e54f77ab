"""Profiling progress of a TrainingJob, computed from the profiling Jobs the operator sees.

Each missing profile (needs.Need) is pending (no Job yet), running, done (its Jobs
succeeded; the results are ready to collect into the store) or failed (a Job gave up:
backoff limit or deadline, with the Job's own reason). The summary becomes a condition
(type Profiling) on the TrainingJob; a failure is named with its Job and reason so a
person can act on it. Pure: Jobs come in as API dicts (observed_job).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sailplan.operator.api.common import GROUP, Condition
from sailplan.operator.profiling.jobs import LABEL_NEED, LABEL_RANK
from sailplan.operator.profiling.needs import ComputeNeed, Need, need_id
from sailplan.operator.reconcile.children import controller_uid

COND_PROFILING: Final = "Profiling"
REASON_PROFILING: Final = "ProfilingRunning"
REASON_PROFILING_FAILED: Final = "ProfilingFailed"
REASON_PROFILES_COLLECTED: Final = "ProfilesReady"
REASON_PROFILING_PENDING: Final = "ProfilingPending"
REASON_PROFILING_SKIPPED: Final = "ProfilingSkipped"
REASON_RESULT_UNREADABLE: Final = "ResultUnreadable"
# Set by the operator on a succeeded profiling Job whose log held no usable result: the
# Job counts as failed from then on (level-triggered: survives an operator restart).
RESULT_ERROR_ANNOTATION: Final = f"{GROUP}/profile-result-error"


@dataclass(frozen=True)
class ObservedJob:
    name: str
    need: str  # need id label
    rank: int | None
    complete: bool = False
    failed: bool = False
    reason: str = ""
    message: str = ""
    owner_uid: str = ""  # the controlling TrainingJob's uid


def observed_job(body: Mapping[str, Any]) -> ObservedJob | None:
    """A profiling Job from its API dict; None if it is not one of ours."""
    metadata = body.get("metadata") or {}
    found = metadata.get("labels") or {}
    if LABEL_NEED not in found:
        return None
    rank = found.get(LABEL_RANK)
    conditions = {
        c.get("type"): c
        for c in (body.get("status") or {}).get("conditions") or ()
        if c.get("status") == "True"
    }
    failed = conditions.get("Failed")
    unreadable = (metadata.get("annotations") or {}).get(RESULT_ERROR_ANNOTATION)
    if failed is None and unreadable:
        failed = {"reason": REASON_RESULT_UNREADABLE, "message": unreadable}
    return ObservedJob(
        name=str(metadata.get("name", "")),
        need=str(found[LABEL_NEED]),
        rank=int(rank) if rank is not None and str(rank).isdigit() else None,
        complete="Complete" in conditions and failed is None,
        failed=failed is not None,
        reason=str((failed or {}).get("reason") or ""),
        message=str((failed or {}).get("message") or ""),
        owner_uid=controller_uid(metadata),
    )


@dataclass(frozen=True)
class ProfilingStatus:
    pending: tuple[str, ...] = ()
    running: tuple[str, ...] = ()
    done: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()  # (need key, why)

    def condition(self, generation: int) -> Condition:
        if self.failed:
            key, why = self.failed[0]
            more = f" (+{len(self.failed) - 1} more)" if len(self.failed) > 1 else ""
            return Condition(
                type=COND_PROFILING,
                status="False",
                reason=REASON_PROFILING_FAILED,
                message=f"{key}: {why}{more}",
                observed_generation=generation,
            )
        if self.running or self.pending:
            counts = (
                f"{len(self.running)} running, {len(self.pending)} pending, {len(self.done)} done"
            )
            return Condition(
                type=COND_PROFILING,
                status="True",
                reason=REASON_PROFILING if self.running else REASON_PROFILING_PENDING,
                message=counts,
                observed_generation=generation,
            )
        return Condition(
            type=COND_PROFILING,
            status="False",
            reason=REASON_PROFILES_COLLECTED,
            message=f"{len(self.done)} profiling runs finished",
            observed_generation=generation,
        )


def _expected_jobs(need: Need) -> int:
    if isinstance(need, ComputeNeed) or need.link == "intra-node":
        return 1
    return 2


def profiling_status(needs: Iterable[Need], jobs: Iterable[ObservedJob]) -> ProfilingStatus:
    by_need: dict[str, list[ObservedJob]] = {}
    for job in jobs:
        by_need.setdefault(job.need, []).append(job)
    pending, running, done, failed = [], [], [], []
    for need in needs:
        mine = sorted(by_need.get(need_id(need), []), key=lambda j: j.name)
        broken = [j for j in mine if j.failed]
        if broken:
            job = broken[0]
            failed.append(
                (need.key, f"Job {job.name} failed: {job.reason}: {job.message}".rstrip(": "))
            )
        elif not mine:
            pending.append(need.key)
        elif len(mine) >= _expected_jobs(need) and all(j.complete for j in mine):
            done.append(need.key)
        else:
            running.append(need.key)
    return ProfilingStatus(tuple(pending), tuple(running), tuple(done), tuple(failed))
