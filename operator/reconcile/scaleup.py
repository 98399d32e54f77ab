"""Zones that do not give nodes: the backoff of an autoscaled GPUPool zone whose waiting
workers got no node in time (a stockout, an exhausted quota, a scale-up that failed).

The cluster autoscaler gives up on a node after `--max-node-provision-time` (15 min by
default) and then backs the node group off for 5 min, doubling up to 30 min
(`--initial-node-group-backoff-duration`, `--max-node-group-backoff-duration`). The
operator mirrors that from what it watches itself, whichever autoscaler runs: the oldest
unbound worker pinned to the zone, and whether a node of the zone became Ready. While a
zone is backed off its possible nodes count as none, so the planner sees only the nodes
that exist and a job waiting for nodes that do not come replans onto them (its plan no
longer fits the snapshot); when the backoff ends the possible nodes count again and the job
is offered the larger plan, which has to win the replan decision like any other.

The backoff's first length and its cap are the operator's settings (`BackoffPolicy`, from
`sailplan operator run --scale-up-backoff-seconds / --max-scale-up-backoff-seconds`),
the cluster autoscaler's defaults unless changed: a cluster whose autoscaler backs off
otherwise says so, and the cluster tests use seconds instead of minutes.

Pure: reconcile.gpupool.pool_status calls `zone_backoff` once per zone of an autoscaled
pool with the zone's previous status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from sailplan.operator.api.gpupool import ZoneStatus

# cluster-autoscaler FAQ, "What are the parameters to CA?": initial-node-group-backoff-
# duration 5m, max-node-group-backoff-duration 30m.
INITIAL_BACKOFF_SECONDS: Final = 300
MAX_BACKOFF_SECONDS: Final = 1800


@dataclass(frozen=True)
class BackoffPolicy:
    """How long a zone that gave no node is backed off: `initial_seconds` the first time,
    doubling on each new failure up to `max_seconds`."""

    initial_seconds: int = INITIAL_BACKOFF_SECONDS
    max_seconds: int = MAX_BACKOFF_SECONDS

    def __post_init__(self) -> None:
        if self.initial_seconds < 1:
            raise ValueError(
                f"the scale-up backoff must be at least 1 s, not {self.initial_seconds}"
            )
        if self.max_seconds < self.initial_seconds:
            raise ValueError(
                f"the maximum scale-up backoff ({self.max_seconds} s) is below the first "
                f"backoff ({self.initial_seconds} s)"
            )

    def after(self, last_seconds: int) -> int:
        """The length of a new backoff, given the last one (0: none yet)."""
        if not last_seconds:
            return self.initial_seconds
        return min(self.max_seconds, 2 * last_seconds)


DEFAULT_BACKOFF: Final = BackoffPolicy()


@dataclass(frozen=True)
class ZoneBackoff:
    """`until`: possible nodes count as none before it (None = not backed off); `seconds`:
    the backoff the zone is on, kept after it ends so a new failure doubles it."""

    until: datetime | None
    seconds: int

    def active(self, now: datetime) -> bool:
        return self.until is not None and now < self.until


def zone_backoff(
    previous: ZoneStatus | None,
    *,
    nodes_ready: int,
    waiting_since: datetime | None,
    timeout_seconds: int,
    now: datetime,
    policy: BackoffPolicy = DEFAULT_BACKOFF,
) -> ZoneBackoff:
    """The zone's backoff now, from its previous status and what waits in it.

    A node of the zone that became Ready since the previous status ends any backoff and
    resets it (the zone gives nodes again). A backoff still running stays. Otherwise a
    worker that has waited `timeout_seconds` or longer starts a new backoff: the policy's
    initial one, or twice the last, at most its maximum.
    """
    last_until = previous.scale_up_backoff_until if previous is not None else None
    last_seconds = previous.scale_up_backoff_seconds if previous is not None else 0
    if previous is not None and nodes_ready > previous.nodes_ready:
        return ZoneBackoff(until=None, seconds=0)
    if last_until is not None and now < last_until:
        return ZoneBackoff(until=last_until, seconds=last_seconds)
    if waiting_since is not None and (now - waiting_since).total_seconds() >= timeout_seconds:
        seconds = policy.after(last_seconds)
        return ZoneBackoff(until=now + timedelta(seconds=seconds), seconds=seconds)
    return ZoneBackoff(until=None, seconds=last_seconds)


def next_change(
    status_zones: Iterable[ZoneStatus],
    waiting_since: Mapping[str, datetime],
    timeout_seconds: int,
    now: datetime,
) -> datetime | None:
    """When the pool's status changes next without any event: the first backoff that ends,
    or the first waiting worker that reaches the timeout (None when neither is pending).
    The runtime refreshes the pools then, so a backoff starts and ends on time."""
    moments = [z.scale_up_backoff_until for z in status_zones if z.scale_up_backoff_until]
    moments += [since + timedelta(seconds=timeout_seconds) for since in waiting_since.values()]
    future = [m for m in moments if m is not None and m > now]
    return min(future) if future else None
