"""spec.suspend in the replan state machine, from every state it can meet: a planned
switch under way, a switch between generations, a wait for capacity; and unsuspending
during the drain. Builders are test_replan_machine's (real planner, rendered pods)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from test_replan_machine import (
    MODEL,
    NOW,
    gpupool,
    kinds,
    make_job,
    names,
    nodes,
    observe,
    pods,
    replay,
    running_state,
)

from sailplan.operator.replan import machine as m
from sailplan.operator.replan import triggers as t
from sailplan.operator.replan.decision import plan_request
from sailplan.planner.api import Planned, make_plan
from sailplan.planner.plan import Plan


@pytest.fixture(scope="module")
def plan1() -> Plan:
    """The real planner's plan on one free 4-GPU node (as in test_replan_machine)."""
    snapshot = t.capacity_snapshot([gpupool(1, 1)], [], {})
    result = make_plan(plan_request(make_job(), MODEL, snapshot))
    assert isinstance(result, Planned)
    return result.best


def test_suspending_a_planned_switch_keeps_its_drain_and_drops_the_target(plan1: Plan) -> None:
    job = make_job(suspend=True)
    since = NOW - timedelta(seconds=30)
    state = running_state(
        job,
        plan1,
        phase="Draining",
        trigger=t.CAPACITY_ADDED,
        since=since,
        drain_checkpoint_step=20,
        target_generation=2,
        target_attempt=0,
        target_plan=plan1.to_json(),
    )
    live = pods(job, plan1, 1)
    new, actions = replay(state, observe(job, plan1, live, nodes(1), [gpupool(1, 0)]), NOW)
    assert (new.phase, new.trigger) == ("Draining", t.SUSPENDED)
    # The checkpoint asked for the switch is the one the suspension waits for.
    assert (new.since, new.drain_checkpoint_step) == (since, 20)
    assert new.target_generation is None and new.target_plan is None
    assert kinds(actions) == ["RequestCheckpoint"]
    assert m.job_phase(new) == "Pending"  # the reconcile says Suspended while spec.suspend
    assert m.replanning_condition(new, 1).status == "False"


def test_suspending_during_a_switch_or_a_wait_suspends_at_once(plan1: Plan) -> None:
    job = make_job(suspend=True)
    old = pods(job, plan1, 1)
    switching = running_state(
        job, plan1, phase="Switching", target_generation=2, target_attempt=0,
        target_plan=plan1.to_json(),
    )  # fmt: skip
    new, actions = replay(switching, observe(job, plan1, old, nodes(1), [gpupool(1, 0)]), NOW)
    assert new.phase == "Suspended" and new.target_generation is None
    assert actions == (m.DeletePods(names(old)),)
    waiting = running_state(job, plan1, phase="Waiting", trigger=t.CAPACITY_LOST)
    new, actions = replay(waiting, observe(job, plan1, [], nodes(0), [gpupool(0, 0)]), NOW)
    assert new.phase == "Suspended" and actions == ()


def test_unsuspending_during_the_drain_replans_and_replaces_the_draining_workers(
    plan1: Plan,
) -> None:
    job = make_job()  # suspend back to false
    draining = running_state(
        job, plan1, phase="Draining", trigger=t.SUSPENDED, since=NOW, drain_checkpoint_step=20
    )
    old = pods(job, plan1, 1)
    inputs = observe(job, plan1, old, nodes(1), [gpupool(1, 0)])
    new, actions = replay(draining, inputs, NOW + timedelta(seconds=5))
    # A new generation on today's capacity; its pods wait until the old ones are gone.
    assert (new.phase, new.trigger, new.target_generation) == ("Switching", t.RESUMED, 2)
    assert m.DeletePods(names(old)) in actions
    assert "CreateChildren" not in kinds(actions)
    record = new.switch
    assert record is not None
    assert (record.trigger, record.from_generation, record.to_generation) == (t.RESUMED, 1, 2)


def test_workers_that_never_ran_are_deleted_without_a_drain(plan1: Plan) -> None:
    job = make_job(suspend=True)
    pending = pods(job, plan1, 1, phase="Pending")
    state = running_state(job, plan1)
    inputs = observe(job, plan1, pending, nodes(1), [gpupool(1, 0)])
    new, actions = replay(state, inputs, NOW)
    assert new.phase == "Suspended"
    assert actions == (m.DeletePods(names(pending)),)
