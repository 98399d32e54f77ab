"""The replanning state a TrainingJob carries from one reconcile pass to the next.

A planned switch takes several passes (ask for a checkpoint, wait, delete, create), and the
operator may restart between any two of them. Everything the state machine
(replan.machine.next_state) needs to pick up where it stopped lives in this one model,
kept in the operator's memory of the job (api.memory.JobMemory.replan), which lives in the
job's state ConfigMap (reconcile.memory); objects of older operators kept it in
`status.replan`, which the operator migrates.

Read by replan.machine; returned by the TrainingJob reconcile as part of Outcome.memory,
which the handler writes at most once per pass. to_annotation / from_annotation are its JSON text form (the tests'
serialize/parse round trip); STATE_ANNOTATION is the annotation key an early version used.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

from pydantic import Field

from sailplan.operator.api.common import GROUP, StatusModel
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.plan import Plan

# The annotation an early version kept the state in (then status.replan, now the state
# ConfigMap).
STATE_ANNOTATION: Final = f"{GROUP}/replan-state"

ReplanPhase = Literal["Running", "Draining", "Switching", "Waiting", "Suspended", "Failed"]
PHASE_RUNNING: Final = "Running"
PHASE_DRAINING: Final = "Draining"
PHASE_SWITCHING: Final = "Switching"
PHASE_WAITING: Final = "Waiting"
PHASE_SUSPENDED: Final = "Suspended"  # spec.suspend: no workers; resuming replans
PHASE_FAILED: Final = "Failed"

# Pod keys remembered by the failure budget; older ones belong to attempts long gone.
MAX_COUNTED_FAILURES: Final = 64


class SwitchRecord(StatusModel):
    """One plan change, as the history shows it: from what, to what, why, for what gain."""

    time: datetime
    trigger: str
    message: str
    from_generation: int
    to_generation: int
    from_summary: str = ""
    to_summary: str = ""
    predicted_gain: float | None = Field(
        default=None, description="fraction: samples/s gain (Throughput) or USD/sample saving"
    )
    restart_seconds: float | None = None
    predicted_samples_per_second: float | None = None


class FailureBudget(StatusModel):
    """Restarts spent on real failures, and which failed pods were already counted."""

    restarts: int = Field(default=0, ge=0)
    counted: tuple[str, ...] = Field(default=(), description="pod UIDs (or names) counted")
    last_failure: str = ""


class ReplanState(StatusModel):
    """Where the job is in Running -> Draining -> Switching -> Running (or Waiting,
    Suspended, Failed).

    `generation`/`attempt` name the pods that should be running now; `target_*` the ones a
    switch in progress will create. The `evaluated_*` fingerprints say which cluster
    snapshot and planning spec the current plan was last judged against, so a change is
    planned once, not on every pass.
    """

    phase: ReplanPhase = PHASE_RUNNING
    generation: int = Field(ge=0)
    attempt: int = Field(default=0, ge=0)
    target_generation: int | None = None
    target_attempt: int | None = None
    target_plan: str | None = Field(default=None, description="the target Plan as JSON")
    trigger: str = ""
    message: str = ""
    since: datetime | None = Field(default=None, description="when the phase was entered")
    not_before: datetime | None = Field(default=None, description="restart backoff")
    drain_checkpoint_step: int | None = None
    last_switch_time: datetime | None = None
    last_drain_seconds: float | None = Field(
        default=None, description="measured: checkpoint request to clean exit, last switch"
    )
    evaluated_cluster_hash: str = ""
    evaluated_cluster: ClusterSnapshot | None = None
    evaluated_spec: str = ""
    evaluated_profiles: str = ""
    failures: FailureBudget = FailureBudget()
    switch: SwitchRecord | None = Field(
        default=None,
        description="the last switch started; the reconcile writes it to status.history "
        "once, so a crash between the memory write and the status write loses no record",
    )

    def target(self) -> Plan | None:
        return Plan.from_json(self.target_plan) if self.target_plan else None


def to_annotation(state: ReplanState) -> str:
    return state.model_dump_json(by_alias=True, exclude_none=True)


def from_annotation(text: str | None) -> ReplanState | None:
    """The stored state, or None when absent or unreadable (the caller bootstraps anew)."""
    if not text:
        return None
    try:
        return ReplanState.model_validate_json(text)
    except ValueError:
        return None
