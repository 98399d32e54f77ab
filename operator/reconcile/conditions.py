"""The TrainingJob's status conditions, each computed from what a reconcile pass found.

reconcile.trainingjob collects a pass's findings into `Facts` (the spec is invalid, no plan
can be made, the job waits for profiles, the plan it runs, the replan machine's state, the
workers) and `conditions(facts)` turns them into conditions through `CONDITIONS`: one rule
per condition type, each returning the condition or None to leave it as it is. What each
condition means is read in one place, and a pass never sets the same type twice.
Suspended (batch/v1 Job's type and reasons) follows spec.suspend. OverridesApplied says
whether the current workers carry every spec.podTemplateOverrides entry (False, naming the
entries the plan overruled, as their pods' annotation does).
Valid and Schedulable are the positive-polarity twins of Invalid and Unschedulable (one
rule, status flipped), and Complete (batch/v1 Job's name) is set with Succeeded, so
`kubectl wait --for=condition=Complete` and tools that expect True-is-good both work.

Two conditions come from elsewhere and are set after the table: Profiling
(profiling.step, which runs beside planning) and Planning (`planning_condition`, from the
planner's answer to the pass and the previous condition).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sailplan.operator.api import trainingjob as api
from sailplan.operator.api.common import Condition
from sailplan.operator.api.trainingjob import WorkerCounts
from sailplan.operator.replan import machine
from sailplan.operator.replan.state import (
    PHASE_DRAINING,
    PHASE_FAILED,
    PHASE_SWITCHING,
    PHASE_WAITING,
    ReplanState,
)
from sailplan.operator.search import PlannerAnswer, SearchFailed, Searching
from sailplan.planner.api import Infeasible


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str


@dataclass(frozen=True)
class CurrentPlan:
    generation: int
    summary: str
    reason: str  # why the job is on it: created, adopted, switched to


@dataclass(frozen=True)
class Facts:
    """What one pass found. Unset fields are things the pass did not look at."""

    generation: int  # the job's metadata.generation the conditions describe
    spec_checked: bool = True  # the model resolved; False for specs rejected before that
    invalid: Problem | None = None  # the spec cannot be acted on
    unschedulable: Problem | None = None  # no plan can be made for the job as it is
    awaiting_profiles: Problem | None = None  # no plan until profiles are measured
    profiles_missing: str | None = None  # what profiling still has to measure
    estimated_profiles: tuple[str, ...] | None = None  # of a plan made this pass
    plan: CurrentPlan | None = None  # the plan the job runs
    replan: ReplanState | None = None  # the replan machine's state, once a plan runs
    workers: WorkerCounts | None = None  # of the current generation and attempt
    workers_problem: str = ""  # why the workers cannot be rendered (a pool is gone)
    # spec.suspend: REASON_SUSPENDING (workers drain), REASON_JOB_SUSPENDED (none remain),
    # REASON_JOB_RESUMED (the pass after spec.suspend was unset); None: not suspended.
    suspension: str | None = None
    failed: Problem | None = None  # the job failed for a reason of its own (a deadline)
    # Overrides entries the current workers' rendering overruled; None: no worker seen.
    overrides_ignored: tuple[str, ...] | None = None
    # The job has spec.podTemplateOverrides, or said OverridesApplied before (so the
    # condition turns True once new workers no longer carry an overruled entry).
    overrides_reported: bool = False

    @property
    def suspended(self) -> bool:
        return self.suspension in (api.REASON_SUSPENDING, api.REASON_JOB_SUSPENDED)

    @property
    def all_succeeded(self) -> bool:
        w = self.workers
        return w is not None and w.desired > 0 and w.succeeded == w.desired

    @property
    def all_running(self) -> bool:
        w = self.workers
        return w is not None and w.running > 0 and w.running + w.succeeded == w.desired


def condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> Condition:
    return Condition(
        type=type_,
        status="True" if ok else "False",
        reason=reason,
        message=message,
        observed_generation=generation,
    )


Verdict = tuple[bool, str, str]  # status, reason, message
Rule = Callable[[Facts], Verdict | None]


def _invalid(f: Facts) -> Verdict | None:
    if f.invalid is not None:
        return True, f.invalid.reason, f.invalid.message
    return (False, api.REASON_VALID, "") if f.spec_checked else None


def _planned(f: Facts) -> Verdict | None:
    if f.invalid is not None:
        return False, f.invalid.reason, "the spec is invalid"
    if f.plan is not None:
        return True, f.plan.reason, f"generation {f.plan.generation}: {f.plan.summary}"
    if f.suspended:
        return False, api.REASON_SUSPENDED, "spec.suspend is true: the job plans when resumed"
    blocked = f.unschedulable or f.awaiting_profiles
    return (False, blocked.reason, blocked.message) if blocked is not None else None


def _unschedulable(f: Facts) -> Verdict | None:
    if f.invalid is not None:
        return None
    if f.unschedulable is not None:
        return True, f.unschedulable.reason, f.unschedulable.message
    if f.replan is not None and f.replan.phase == PHASE_WAITING:
        return True, api.REASON_NO_CAPACITY, f.replan.message
    if f.replan is not None or f.awaiting_profiles is not None:
        return False, api.REASON_SCHEDULABLE, ""
    return None


def _profiles_measured(f: Facts) -> Verdict | None:
    if f.profiles_missing is not None:
        return False, api.REASON_AWAITING_PROFILES, f.profiles_missing
    if f.estimated_profiles is None:
        return None
    if f.estimated_profiles:
        message = f"planned with estimated profiles: {', '.join(f.estimated_profiles)}"
        return False, api.REASON_ESTIMATED, message
    return True, api.REASON_ALL_MEASURED, ""


def _replanning(f: Facts) -> Verdict | None:
    if f.replan is None:
        return None
    if f.suspended:
        return False, api.REASON_SUSPENDED, ""
    replanning = machine.replanning_condition(f.replan, f.generation)
    return replanning.status == "True", replanning.reason, replanning.message


def _running(f: Facts) -> Verdict | None:
    if f.failed is not None:
        return False, f.failed.reason, f.failed.message
    if f.suspended:
        return False, api.REASON_SUSPENDED, "spec.suspend is true"
    state, workers = f.replan, f.workers
    if state is None or workers is None:
        return None
    if state.phase == PHASE_WAITING:
        return False, api.REASON_NO_CAPACITY, state.message
    if state.phase == PHASE_FAILED:
        return False, api.REASON_RESTARTS_EXHAUSTED, state.message
    if state.phase in (PHASE_DRAINING, PHASE_SWITCHING):
        return False, api.REASON_REPLANNING, state.message
    if f.all_succeeded:
        return False, api.REASON_COMPLETED, ""
    if f.all_running:
        # Ranks finish a moment apart; the job runs until the last one is done.
        return True, api.REASON_ALL_RUNNING, f"{workers.desired} workers running"
    if f.workers_problem:
        return False, api.REASON_POOL_MISSING, f.workers_problem
    return False, api.REASON_PODS_PENDING, f"{workers.running}/{workers.desired} workers running"


def _succeeded(f: Facts) -> Verdict | None:
    if f.replan is not None and machine.job_phase(f.replan) is None and f.all_succeeded:
        return True, api.REASON_COMPLETED, "all workers finished"
    return None


def _failed(f: Facts) -> Verdict | None:
    if f.failed is not None:
        return True, f.failed.reason, f.failed.message
    if f.replan is not None and f.replan.phase == PHASE_FAILED:
        return True, api.REASON_RESTARTS_EXHAUSTED, f.replan.message
    return None


_SUSPENSION_MESSAGES = {
    api.REASON_SUSPENDING: "spec.suspend is true: workers checkpoint and exit",
    api.REASON_JOB_SUSPENDED: "spec.suspend is true: no workers run and no GPUs are held",
    api.REASON_JOB_RESUMED: "spec.suspend is false: the job plans anew and resumes from its "
    "last checkpoint",
}


def _suspended(f: Facts) -> Verdict | None:
    if f.suspension is None:
        return None
    return f.suspended, f.suspension, _SUSPENSION_MESSAGES[f.suspension]


def _overrides_applied(f: Facts) -> Verdict | None:
    if f.overrides_ignored is None:
        return None
    if f.overrides_ignored:
        message = "the plan overruled: " + "; ".join(f.overrides_ignored)
        return False, api.REASON_OVERRIDES_IGNORED, message
    return (True, api.REASON_OVERRIDES_APPLIED, "") if f.overrides_reported else None


def _opposite(rule: Rule) -> Rule:
    """The positive-polarity twin of a negative condition: same reason, status flipped."""

    def opposite(f: Facts) -> Verdict | None:
        verdict = rule(f)
        return None if verdict is None else (not verdict[0], verdict[1], verdict[2])

    return opposite


CONDITIONS: tuple[tuple[str, Rule], ...] = (
    (api.COND_VALID, _opposite(_invalid)),
    (api.COND_INVALID, _invalid),
    (api.COND_PLANNED, _planned),
    (api.COND_SCHEDULABLE, _opposite(_unschedulable)),
    (api.COND_UNSCHEDULABLE, _unschedulable),
    (api.COND_PROFILES_MEASURED, _profiles_measured),
    (api.COND_REPLANNING, _replanning),
    (api.COND_RUNNING, _running),
    (api.COND_COMPLETE, _succeeded),
    (api.COND_SUCCEEDED, _succeeded),
    (api.COND_FAILED, _failed),
    (api.COND_SUSPENDED, _suspended),
    (api.COND_OVERRIDES_APPLIED, _overrides_applied),
)


def conditions(facts: Facts) -> list[Condition]:
    """The conditions `facts` determine; types whose rule says nothing are left out."""
    found = []
    for type_, rule in CONDITIONS:
        verdict = rule(facts)
        if verdict is not None:
            found.append(condition(type_, *verdict, facts.generation))
    return found


def phase_of(facts: Facts) -> str:
    """The job's phase for a pass whose job has a replan state (a plan runs or is rolled
    out): the replan machine's when it implies one, else the workers'."""
    assert facts.replan is not None
    if facts.suspended:
        return api.PHASE_SUSPENDED
    implied = machine.job_phase(facts.replan)
    if implied is not None:
        return implied
    if facts.all_succeeded:
        return api.PHASE_SUCCEEDED
    return api.PHASE_RUNNING if facts.all_running else api.PHASE_PENDING


def planning_condition(
    answer: PlannerAnswer | None, previous: Condition | None, generation: int, now: datetime
) -> Condition | None:
    """Planning: True with what is searched while a search runs; False with how the last
    one ended. None (leave it as it is) when the pass did not ask for a plan, unless a
    search was under way: the pass no longer needs it, and the service drops it."""

    def planning(ok: bool, reason: str, message: str) -> Condition:
        return condition(api.COND_PLANNING, ok, reason, message, generation)

    if answer is None:
        if previous is not None and previous.status == "True":
            return planning(
                False, api.REASON_SEARCH_NOT_NEEDED, "the job no longer needs a new plan"
            )
        return None
    if isinstance(answer, Searching):
        elapsed = max(0.0, (now - answer.started_at).total_seconds())
        doing = "waiting for a free planner process" if answer.queued else "searching"
        return planning(
            True,
            api.REASON_SEARCHING,
            f"{doing} for {elapsed:.0f} s (deadline {answer.deadline_seconds:g} s): {answer.what}",
        )
    if isinstance(answer, SearchFailed):
        return planning(False, api.REASON_SEARCH_FAILED, answer.message)
    if isinstance(answer, Infeasible):
        return planning(False, api.REASON_INFEASIBLE, f"{answer.code}: {answer.reason}")
    found = f"best of {answer.plans_evaluated} plans evaluated in {answer.search_seconds:.1f} s"
    if answer.exhaustive:
        return planning(False, api.REASON_PLAN_FOUND, found)
    return planning(
        False,
        api.REASON_DEADLINE_BEST_PLAN,
        f"the deadline stopped the search; {found} (the optimum is not proven)",
    )
