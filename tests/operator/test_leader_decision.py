"""The pure leader-election decision (sailplan.operator.leader) on a fake clock: who creates,
acquires, renews, waits or steps down, and when a silent leader's Lease expires; and what
needs no API server at the edges: the CLI's check of the timings, a leader cut off from the
API server (tests/operator/test_leader_election.py runs the elector against a real one)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sailplan.operator.leader import (
    Action,
    LeaseRecord,
    Observation,
    Timings,
    decide,
    held_by_other,
    observe,
    released,
    renew_overdue,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE_S = 4


def held_by(holder: str, renewed_s: float = 0, transitions: int = 3) -> LeaseRecord:
    acquired = T0 - timedelta(seconds=60)
    return LeaseRecord(holder, LEASE_S, acquired, T0 + timedelta(seconds=renewed_s), transitions)


def decide_at(observed: Observation, identity: str, now: float, leading: bool = False) -> Action:
    wall = T0 + timedelta(seconds=now)
    return decide(
        observed, identity, leading=leading, now=now, wall=wall, lease_duration_s=LEASE_S
    ).action


def test_no_lease_is_created_holding_it() -> None:
    decision = decide(
        observe(None, None, 100.0), "a", leading=False, now=100.0, wall=T0, lease_duration_s=4
    )
    assert decision.action is Action.CREATE
    assert decision.write == LeaseRecord("a", 4, T0, T0, 0)


def test_a_lease_held_by_another_expires_lease_duration_after_its_content_was_first_seen() -> None:
    # The holder's renewTime says "long ago" on the wire: irrelevant, only the local sighting
    # counts (clock skew between nodes must not make a live leader look dead).
    stale_on_the_wire = held_by("b", renewed_s=-3600)
    observed = observe(None, stale_on_the_wire, now=10.0)
    assert decide_at(observed, "a", 10.0) is Action.WAIT
    assert decide_at(observed, "a", 13.9) is Action.WAIT
    # Read again, same content: the first sighting stays, so the silent holder expires.
    observed = observe(observed, stale_on_the_wire, now=13.0)
    assert observed.seen_at == 10.0
    assert decide_at(observed, "a", 14.0) is Action.ACQUIRE


def test_a_renewing_holder_never_expires() -> None:
    observed = observe(None, held_by("b", renewed_s=0), now=10.0)
    for step in range(1, 20):
        now = 10.0 + 2.0 * step  # every retry period the holder wrote a new renewTime
        observed = observe(observed, held_by("b", renewed_s=2.0 * step), now)
        assert decide_at(observed, "a", now + 1.9) is Action.WAIT


def test_taking_over_counts_a_transition_and_restarts_the_acquire_time() -> None:
    observed = observe(None, held_by("b", transitions=3), now=0.0)
    wall = T0 + timedelta(seconds=10)
    decision = decide(observed, "a", leading=False, now=10.0, wall=wall, lease_duration_s=LEASE_S)
    assert decision.action is Action.ACQUIRE
    assert decision.write == LeaseRecord("a", LEASE_S, wall, wall, 4)


def test_a_released_lease_is_taken_at_once() -> None:
    freed = released(held_by("b"), T0)
    assert freed.holder == "" and freed.transitions == 3
    observed = observe(None, freed, now=50.0)
    assert not held_by_other(observed, "a", 50.0)
    assert decide_at(observed, "a", 50.0) is Action.ACQUIRE


def test_the_holder_renews_keeping_acquire_time_and_transitions() -> None:
    mine = held_by("a", transitions=7)
    observed = observe(None, mine, now=0.0)
    wall = T0 + timedelta(seconds=2)
    decision = decide(observed, "a", leading=True, now=2.0, wall=wall, lease_duration_s=LEASE_S)
    assert decision.action is Action.RENEW
    assert decision.write == LeaseRecord("a", LEASE_S, mine.acquired_at, wall, 7)


def test_a_restarted_replica_with_the_same_identity_resumes_its_own_lease() -> None:
    # The Deployment's identity is the pod name: a container restarted in place (the old
    # process is gone) finds the Lease still naming it and leads again without waiting.
    assert decide_at(observe(None, held_by("a"), now=0.0), "a", 0.0) is Action.RENEW


def test_a_leader_that_sees_another_valid_holder_steps_down() -> None:
    observed = observe(None, held_by("b"), now=5.0)
    assert decide_at(observed, "a", 5.0, leading=True) is Action.STEP_DOWN
    assert decide_at(observed, "a", 5.0, leading=False) is Action.WAIT


def test_the_leader_gives_up_at_the_renew_deadline_before_anyone_may_take_over() -> None:
    timings = Timings(lease_duration_s=4, renew_deadline_s=2.0, retry_period_s=0.5)
    last_renewed = 100.0
    assert not renew_overdue(last_renewed, 101.9, timings)
    assert renew_overdue(last_renewed, 102.0, timings)
    # A standby that read the last renewal no earlier than it was sent waits at least the
    # lease duration from then: strictly after the leader stopped.
    standby_view = observe(None, held_by("a"), now=last_renewed)
    assert held_by_other(standby_view, "b", last_renewed + timings.renew_deadline_s)


@pytest.mark.parametrize(
    ("lease", "renew", "retry", "message"),
    [
        (4, 4.0, 1.0, "lease duration (4s) must exceed the renew deadline (4.0s)"),
        (15, 2.0, 2.0, "renew deadline (2.0s) must exceed 1.2 x the retry period (2.0s)"),
        (15, 10.0, 0.0, "retry period must be positive"),
    ],
)
def test_inconsistent_timings_are_refused_with_the_rule(
    lease: int, renew: float, retry: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Timings(lease, renew, retry)


def test_operator_run_refuses_inconsistent_timings_with_exit_code_2(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from sailplan.operator.cli.operator_commands import register

    app = typer.Typer()
    register(app)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")
    args = ["operator", "run", "--leader-elect", f"--kubeconfig={kubeconfig}"]
    refused = CliRunner().invoke(app, [*args, "--lease-duration=4", "--renew-deadline=5"])
    assert refused.exit_code == 2
    assert "lease duration (4s) must exceed the renew deadline (5.0s)" in refused.output
    assert "Traceback" not in refused.output


def test_a_leader_cut_off_from_the_api_server_gives_up_at_the_renew_deadline() -> None:
    """The elector's I/O edge, no server needed: connection errors are not leadership."""
    import socket
    import threading
    import time

    from kubernetes import client

    from sailplan.operator.leader_election import LeaseElector

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    timings = Timings(lease_duration_s=4, renew_deadline_s=1.0, retry_period_s=0.2)
    elector = LeaseElector(
        client.ApiClient(configuration), "ns", "lease", identity="me", timings=timings
    )
    assert elector.try_acquire_or_renew() is Action.WAIT and not elector.leading
    elector.leading, elector.last_renewed = True, time.monotonic()  # as if it had renewed
    lost: list[str] = []
    renewer = threading.Thread(target=elector.hold, args=(threading.Event(), lost.append))
    renewer.start()
    renewer.join(timeout=10)
    assert lost == ["not renewed within the 1.0s deadline"]
    assert time.monotonic() - elector.last_renewed < timings.lease_duration_s
    assert not elector.leading
