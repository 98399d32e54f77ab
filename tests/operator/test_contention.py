"""Who competes for capacity and who waits for whom when capacity shrinks: a job that lost
workers (preempted, node gone, pod deleted) competes like a job without workers, so it waits
while a better-ranked job that lost workers too is still planning or switching to the plan
that replaces them; a job whose workers all run waits for nobody, and a voluntary search or
switch holds nobody back."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sailplan.operator.api import trainingjob as api
from sailplan.operator.api.common import Condition
from sailplan.operator.api.trainingjob import PlanSummary, TrainingJobStatus, WorkerCounts
from sailplan.operator.controller.queue import JobKey, Rank, held_back_by
from sailplan.operator.reconcile.contention import competes, contends
from sailplan.operator.reconcile.nodes import NodeInfo
from sailplan.operator.replan import triggers
from sailplan.operator.replan.triggers import WorkerPod

NODES = {
    name: NodeInfo(name=name, labels={}, ready=True, gpus_allocatable=4)
    for name in ("n-0", "n-1", "n-2")
}


def status(phase: str = api.PHASE_RUNNING, *conditions: Condition, workers: int = 2) -> Any:
    return TrainingJobStatus(
        phase=phase,
        plan=PlanSummary(generation=3, config_map="job-plan-3", summary="2 stages", workers=2),
        attempt=1,
        workers=WorkerCounts(desired=workers, running=workers),
        conditions=conditions,
    )


def worker(index: int, node: str | None, **facts: Any) -> WorkerPod:
    return WorkerPod(
        name=f"job-g3-a1-w{index}",
        generation=3,
        attempt=1,
        worker_index=index,
        phase="Running",
        node=node,
        gpupool="a100",
        **facts,
    )


def test_a_job_whose_workers_all_run_does_not_compete() -> None:
    assert not competes(status(), [worker(0, "n-0"), worker(1, "n-1")], NODES)


def test_a_job_without_workers_competes() -> None:
    assert competes(status(api.PHASE_UNSCHEDULABLE), [], NODES)
    assert competes(TrainingJobStatus(), [], NODES)


def test_a_job_that_lost_workers_competes() -> None:
    # Its node is gone, or NotReady.
    assert competes(status(), [worker(0, "n-0"), worker(1, "n-9")], NODES)
    not_ready = {**NODES, "n-1": replace(NODES["n-1"], ready=False)}
    assert competes(status(), [worker(0, "n-0"), worker(1, "n-1")], not_ready)
    # Preempted (the kubelet's DisruptionTarget), or the pod itself is gone.
    assert competes(
        status(), [worker(0, "n-0"), worker(1, "n-1", disruption="PreemptionByScheduler")], NODES
    )
    assert competes(status(), [worker(0, "n-0")], NODES)
    # A worker being deleted counts as gone.
    assert competes(status(), [worker(0, "n-0"), worker(1, "n-1", deleting=True)], NODES)


def test_a_job_switching_or_suspended_does_not_compete_again() -> None:
    # Its decision is made: it holds others back (contends) but waits for nobody.
    lost = [worker(0, "n-0"), worker(1, "n-9")]
    for phase in (api.PHASE_REPLANNING, api.PHASE_SUSPENDED, api.PHASE_SUCCEEDED):
        assert not competes(status(phase), lost, NODES)
    # Workers of an older generation are not the plan's.
    older = [replace(w, generation=2) for w in (worker(0, "n-0"), worker(1, "n-1"))]
    assert competes(status(), older, NODES)


def planning(state: str) -> Condition:
    return Condition(type=api.COND_PLANNING, status=state, reason="Searching")


def replanning(reason: str) -> Condition:
    return Condition(type=api.COND_REPLANNING, status="True", reason=reason)


def test_who_others_wait_for() -> None:
    searching = status(api.PHASE_RUNNING, planning("True"))
    # Searching for the plan it competes for, until it creates its workers.
    assert contends(searching, competing=True, created_workers=False)
    assert not contends(searching, competing=True, created_workers=True)
    # A running job searching for a better plan holds nobody back.
    assert not contends(searching, competing=False, created_workers=False)
    # Switching to the plan that replaces lost capacity, until its workers exist.
    for trigger in (triggers.WORKER_PREEMPTED, triggers.NODE_LOST, triggers.CAPACITY_LOST):
        switching = status(api.PHASE_REPLANNING, replanning(trigger))
        assert contends(switching, competing=False, created_workers=False)
        assert not contends(switching, competing=False, created_workers=True)
    # A voluntary switch (more capacity, a better price) holds nobody back.
    voluntary = status(api.PHASE_REPLANNING, replanning(triggers.CAPACITY_ADDED))
    assert not contends(voluntary, competing=False, created_workers=False)
    assert not contends(status(), competing=True, created_workers=False)


def test_when_capacity_shrinks_the_higher_priority_job_replans_first() -> None:
    """Nodes n-1 and n-2 are preempted: the high-priority job (on n-0, n-1) and the low one
    (on n-2) both lost workers; a third job on n-0 alone lost nothing."""
    high, low, intact = ("ns", "b-high"), ("ns", "a-low"), ("ns", "c-intact")
    ranks: dict[JobKey, Rank] = {
        high: (-100_000, "2026-01-01T12:00:00Z", *high),
        low: (-100, "2026-01-01T11:00:00Z", *low),  # older, first by name: only priority
        intact: (0, "2026-01-01T10:00:00Z", *intact),
    }
    nodes = {"n-0": NODES["n-0"]}
    lost = {
        high: competes(status(), [worker(0, "n-0"), worker(1, "n-1")], nodes),
        low: competes(status(), [worker(0, "n-2"), worker(1, "n-2")], nodes),
        intact: competes(status(), [worker(0, "n-0"), worker(1, "n-0")], nodes),
    }
    assert lost == {high: True, low: True, intact: False}
    contenders: dict[JobKey, Rank] = {}
    # The high job's pass starts a search for what remains: it becomes a contender ...
    if contends(status(api.PHASE_RUNNING, planning("True")), competing=True, created_workers=False):
        contenders[high] = ranks[high]
    # ... and the low job, which competes too, waits for it; the intact job does not.
    assert held_back_by(low, ranks[low], contenders) == high
    assert held_back_by(intact, ranks[intact], contenders) == high  # were it to compete
    assert not lost[intact]  # it does not: its pass goes on
    # The high job switches (its old workers deleting): the low one still waits ...
    switching = status(api.PHASE_REPLANNING, replanning(triggers.NODE_LOST))
    assert contends(switching, competing=False, created_workers=False)
    # ... until the high job created its new workers (then reserved against the low one).
    if not contends(switching, competing=False, created_workers=True):
        contenders.pop(high)
    assert held_back_by(low, ranks[low], contenders) is None
