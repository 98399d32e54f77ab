"""TrainingJob status conditions computed from what a reconcile pass found.

Called by reconcile.trainingjob, which collects the pass's facts and writes the conditions
these functions return into the one status write of the pass.
"""

from __future__ import annotations

from datetime import datetime

from sailplan.operator.api import trainingjob as api
from sailplan.operator.api.common import Condition
from sailplan.operator.search import PlannerAnswer, SearchFailed, Searching
from sailplan.planner.api import Infeasible


def condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> Condition:
    return Condition(
        type=type_,
        status="True" if ok else "False",
        reason=reason,
        message=message,
        observed_generation=generation,
    )


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
