"""The operator's memory of a TrainingJob between reconcile passes (not user-visible).

What the operator must remember that the cluster does not show: where a planned switch
stands (replan.state.ReplanState, with its target plan and the cluster snapshot the current
plan was judged against) and which inputs an infeasible planning had, so the planner is not
asked again until they change. It lives in a ConfigMap the job owns (reconcile.memory),
read at the start of every pass and written at most once per pass, so the status holds only
what users read. Up to v1alpha1 the same fields were `status.replan` and
`status.unschedulableInputs`; LEGACY_STATUS_FIELDS names them for the migration.
"""

from __future__ import annotations

from typing import Final

from pydantic import Field

from sailplan.operator.api.common import StatusModel
from sailplan.operator.replan.state import ReplanState

# The status fields (camelCase) that held this memory before it moved to the ConfigMap.
LEGACY_STATUS_FIELDS: Final = ("replan", "unschedulableInputs")


class JobMemory(StatusModel):
    replan: ReplanState | None = Field(
        default=None,
        description="where replanning stands (replan.machine), so a restarted operator "
        "resumes a switch where it stopped",
    )
    unschedulable_inputs: str | None = Field(
        default=None,
        description="job generation and cluster hash of the last infeasible planning; the "
        "planner is not asked again until one of them changes",
    )

    @classmethod
    def from_legacy_status(cls, status: object) -> JobMemory:
        """The memory an object of an older operator kept in its status; empty if none or
        unreadable (the reconcile then adopts the newest plan ConfigMap)."""
        if not isinstance(status, dict):
            return cls()
        try:
            return cls.model_validate({k: status[k] for k in LEGACY_STATUS_FIELDS if k in status})
        except ValueError:
            return cls()

    def is_empty(self) -> bool:
        return self == JobMemory()
