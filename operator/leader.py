"""Who leads: the pure decision of Lease-based leader election, with client-go's rules.

Two operator replicas run; only the holder of a coordination.k8s.io/v1 Lease reconciles.
This module decides, from the Lease as last read, the local clock and this replica's
identity, whether to create the Lease, take it over, renew it, wait, or step down, and what
to write. It does no I/O: sailplan.operator.leader_election reads and writes the Lease and
runs the operator while this replica leads; tests/operator/test_leader_decision.py drives it
with a fake clock.

The rules are those of client-go's leaderelection package:

- A Lease held by another replica is valid until `leaseDurationSeconds` after this replica
  *first saw its current content*, on this replica's monotonic clock: the holder's
  `renewTime` is never compared with the local clock, so clock skew between nodes cannot
  make a live leader look expired.
- A Lease with no holder (released on a clean shutdown) can be taken at once.
- The leader renews every retry period and gives up leadership when it has not renewed for
  the renew deadline, which is shorter than the lease duration: it stops before any other
  replica may consider the Lease expired.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import datetime

# client-go's JitterFactor: the renew deadline must leave room for more than one retry.
RETRY_JITTER_FACTOR = 1.2


@dataclass(frozen=True)
class Timings:
    """leaseDurationSeconds, renewDeadline and retryPeriod, as client-go names them."""

    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if self.retry_period_s <= 0:
            raise ValueError(f"the retry period must be positive, not {self.retry_period_s}")
        if self.renew_deadline_s <= RETRY_JITTER_FACTOR * self.retry_period_s:
            raise ValueError(
                f"the renew deadline ({self.renew_deadline_s}s) must exceed "
                f"{RETRY_JITTER_FACTOR} x the retry period ({self.retry_period_s}s)"
            )
        if self.lease_duration_s <= self.renew_deadline_s:
            raise ValueError(
                f"the lease duration ({self.lease_duration_s}s) must exceed "
                f"the renew deadline ({self.renew_deadline_s}s)"
            )


@dataclass(frozen=True)
class LeaseRecord:
    """The election fields of a Lease's spec; `holder` is "" once released."""

    holder: str
    duration_s: int
    acquired_at: datetime | None = None
    renewed_at: datetime | None = None
    transitions: int = 0


@dataclass(frozen=True)
class Observation:
    """The Lease as last read (None: there is none) and when its content was first seen."""

    record: LeaseRecord | None
    seen_at: float


def observe(previous: Observation | None, record: LeaseRecord | None, now: float) -> Observation:
    """The new observation after reading `record` at monotonic time `now`: unchanged
    content keeps its first sighting, so a holder that stopped renewing expires."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


class Action(enum.Enum):
    CREATE = "create"  # no Lease yet: create it, holding it
    ACQUIRE = "acquire"  # free or expired: write it, holding it
    RENEW = "renew"  # held by me: write a fresh renew time
    WAIT = "wait"  # validly held by another replica
    STEP_DOWN = "step down"  # I thought I led, but another replica validly holds it


@dataclass(frozen=True)
class Decision:
    action: Action
    write: LeaseRecord | None  # the record to write for CREATE, ACQUIRE and RENEW


def held_by_other(observed: Observation, identity: str, now: float) -> bool:
    """Whether another replica holds the Lease and it has not expired in my eyes."""
    record = observed.record
    return (
        record is not None
        and record.holder not in ("", identity)
        and now < observed.seen_at + record.duration_s
    )


def decide(
    observed: Observation,
    identity: str,
    *,
    leading: bool,
    now: float,
    wall: datetime,
    lease_duration_s: int,
) -> Decision:
    """What `identity` does with the observed Lease at monotonic `now` (wall: the time to
    write into the Lease); `leading`: whether this replica currently acts as the leader."""
    record = observed.record
    if record is None:
        return Decision(Action.CREATE, LeaseRecord(identity, lease_duration_s, wall, wall, 0))
    if held_by_other(observed, identity, now):
        return Decision(Action.STEP_DOWN if leading else Action.WAIT, None)
    if record.holder == identity:
        return Decision(Action.RENEW, replace(record, duration_s=lease_duration_s, renewed_at=wall))
    taken = LeaseRecord(identity, lease_duration_s, wall, wall, record.transitions + 1)
    return Decision(Action.ACQUIRE, taken)


def renew_overdue(last_renewed: float, now: float, timings: Timings) -> bool:
    """Whether a leader that last renewed at `last_renewed` must give up at `now`."""
    return now - last_renewed >= timings.renew_deadline_s


def released(record: LeaseRecord, wall: datetime) -> LeaseRecord:
    """The Lease a leader writes on a clean shutdown: no holder, so the standby takes it at
    its next retry instead of waiting out the lease duration (client-go's ReleaseOnCancel)."""
    return replace(record, holder="", duration_s=1, renewed_at=wall, acquired_at=wall)
