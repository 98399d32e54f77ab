"""The operator reads rank 0's progress from the trainer's real metrics endpoint, and its
final steps from the termination message the trainer leaves in the exited pod's status.

The trainer side is the trainer's own Reporter (prometheus-client's HTTP server); the pods
are the operator's rendered worker pods. The reader's list of pods is a stand-in for the
API server (the cluster test covers the real one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from operator_builders import RecordingPlanner
from test_reconcile_trainingjob import observe, refuse, with_status

from sailplan.operator import metrics
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.controller.progress import (
    RANK0_SELECTOR,
    ProgressReader,
    Reading,
    attach,
    fetch,
    metrics_address,
    parse_progress,
)
from sailplan.operator.reconcile.children import desired_children
from sailplan.operator.reconcile.trainingjob import Observed, reconcile
from sailplan.operator.replan.triggers import pod_facts
from sailplan.planner.api import Planned
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import EnergyPrediction, Plan
from sailplan.planner.workerenv import TrainerProgress
from sailplan.trainer.progress import Reporter

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def rank0(make_job: Callable[..., TrainingJob], plan: Plan, pools: tuple[GPUPool, ...]) -> Any:
    """Worker 0 as the operator renders it, running at 127.0.0.1."""
    children = desired_children(make_job(), plan, 1, 0, {p.name: p for p in pools})
    pod: dict[str, Any] = json.loads(json.dumps(children.pods[0]))
    pod["metadata"] |= {"uid": "uid-0", "namespace": "team-a"}
    pod["status"] = {"phase": "Running", "podIP": "127.0.0.1"}
    return pod


def with_port(pod: dict[str, Any], port: int) -> dict[str, Any]:
    """The pod with its metrics port moved (the trainer listens on a free port here)."""
    pod = json.loads(json.dumps(pod))
    trainer = pod["spec"]["containers"][0]
    for entry in trainer["ports"]:
        if entry["name"] == "metrics":
            entry["containerPort"] = port
    return pod


def test_the_address_is_the_pods_ip_and_its_metrics_port(rank0: dict[str, Any]) -> None:
    assert metrics_address(rank0) == ("127.0.0.1", 9400)  # the trainer's default
    assert metrics_address(rank0 | {"status": {"phase": "Pending"}}) is None  # no IP yet
    off = json.loads(json.dumps(rank0))
    for var in off["spec"]["containers"][0]["env"]:
        if var["name"] == "SAILPLAN_METRICS_PORT":
            var["value"] = "0"  # an override turned the endpoint off
    assert metrics_address(off) is None


def test_the_trainers_page_parses_into_its_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("SAILPLAN_METRICS_PORT", str(port))
    reporter = Reporter(rank=0, local_rank=0, generation=1)
    page = fetch(("127.0.0.1", port), 5.0)
    assert parse_progress(page) is None  # no step completed yet: nothing to report
    reporter.step(3, 4.5, 80.0, None, 0.1)
    assert parse_progress(fetch(("127.0.0.1", port), 5.0)) == TrainerProgress(
        step=3, loss=4.5, samples_per_second=80.0, last_checkpoint_step=None
    )
    reporter.step(12, 3.25, 100.0, 10, 0.1)
    assert parse_progress(fetch(("127.0.0.1", port), 5.0)) == TrainerProgress(
        step=12, loss=3.25, samples_per_second=100.0, last_checkpoint_step=10
    )
    with pytest.raises(ValueError):
        parse_progress("this is { not prometheus text")


def test_reader_keeps_the_newest_reading_and_its_age_when_rank_zero_stops_answering(
    rank0: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv("SAILPLAN_METRICS_PORT", str(port))
    reporter = Reporter(rank=0, local_rank=0, generation=1)
    listed: list[dict[str, Any]] = [with_port(rank0, port)]
    selectors: list[str] = []
    woken: list[tuple[str, str]] = []
    clock = [T0]
    job = ("team-a", rank0["metadata"]["labels"]["sailplan.dev/job"])

    def list_pods(selector: str) -> list[dict[str, Any]]:
        selectors.append(selector)
        return listed

    reader = ProgressReader(
        list_pods=list_pods,
        managed=lambda: {job},
        changed=woken.append,
        timeout=2.0,
        now=lambda: clock[0],
    )
    asyncio.run(reader.read_once())
    assert selectors == [RANK0_SELECTOR]
    assert reader.readings == {} and woken == []  # before the first step

    reporter.step(5, 3.0, 90.0, None, 0.1)
    asyncio.run(reader.read_once())
    assert reader.readings["uid-0"].progress.step == 5
    assert reader.readings["uid-0"].time == T0
    assert woken == [job]

    clock[0] = T0 + timedelta(seconds=10)
    asyncio.run(reader.read_once())  # same numbers: no pass, the time stays
    assert woken == [job] and reader.readings["uid-0"].time == T0

    reporter.step(6, 2.9, 91.0, 5, 0.1)
    asyncio.run(reader.read_once())
    assert reader.readings["uid-0"].progress.last_checkpoint_step == 5
    assert reader.readings["uid-0"].time == T0 + timedelta(seconds=10)
    assert woken == [job, job]

    # Rank 0 stops answering (nothing listens there): the last reading stays, no pass.
    def unreachable() -> float:
        labels = {"result": "unreachable"}
        return metrics.REGISTRY.get_sample_value("sailplan_progress_reads_total", labels) or 0.0

    before = unreachable()
    listed[:] = [with_port(rank0, free_port())]
    asyncio.run(reader.read_once())
    assert reader.readings["uid-0"].progress.step == 6
    assert "uid-0" in reader.failures and woken == [job, job]
    assert unreachable() == before + 1  # counted for the operator's metrics

    # A job this operator does not manage is not read.
    reader.managed = set
    listed[:] = [with_port(rank0, port)]
    reporter.step(7, 2.8, 92.0, 5, 0.1)
    asyncio.run(reader.read_once())
    assert reader.readings["uid-0"].progress.step == 6

    # The pod is gone: so is its reading.
    listed[:] = []
    asyncio.run(reader.read_once())
    assert reader.readings == {} and reader.failures == {}


# -- the final steps, from the exited trainer's termination message ----------------------------
def exited(pod: dict[str, Any], message: str, finished_at: str) -> dict[str, Any]:
    """The pod once its trainer exited 0 with this termination message."""
    terminated = {"exitCode": 0, "reason": "Completed", "finishedAt": finished_at}
    if message:
        terminated["message"] = message
    return pod | {
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}],
        }
    }


def test_rank_zero_keeps_its_progress_in_the_termination_message_the_pod_status_returns(
    rank0: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The trainer's Reporter writes what the kubelet copies into the exited pod's status;
    pod_facts reads it back with the exit time; only global rank 0 writes, and only into
    the kubelet's file (never created where it does not exist)."""
    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setenv("SAILPLAN_METRICS_PORT", "0")
    monkeypatch.setenv("SAILPLAN_TERMINATION_LOG", str(log))
    reporter = Reporter(rank=0, local_rank=0, generation=3)
    reporter.step(9, 2.5, 95.0, 5, 0.1)
    reporter.step(10, 2.25, 96.0, 10, 0.1)
    other = tmp_path / "other-rank"
    other.write_text("")
    monkeypatch.setenv("SAILPLAN_TERMINATION_LOG", str(other))
    Reporter(rank=1, local_rank=0, generation=3).step(10, 2.25, 96.0, 10, 0.1)
    assert other.read_text() == ""
    missing = tmp_path / "not-there"
    monkeypatch.setenv("SAILPLAN_TERMINATION_LOG", str(missing))
    Reporter(rank=0, local_rank=0, generation=3).step(10, 2.25, 96.0, 10, 0.1)
    assert not missing.exists()

    pod = pod_facts(exited(rank0, log.read_text(), "2026-01-01T00:05:00Z"))
    assert pod is not None
    assert pod.progress == TrainerProgress(
        step=10, loss=2.25, samples_per_second=96.0, last_checkpoint_step=10, plan_generation=3
    )
    assert pod.progress_time == T0 + timedelta(minutes=5)
    # Running, or exited without a message or with one that is not the trainer's: none.
    assert pod_facts(rank0 | {"status": {"phase": "Running"}}).progress is None  # type: ignore[union-attr]
    for message in ("", "Traceback (most recent call last): ...", '{"step": "x"}'):
        facts = pod_facts(exited(rank0, message, "2026-01-01T00:05:00Z"))
        assert facts is not None and facts.progress is None
    # A newer trainer's message with a field this operator does not know keeps its step.
    newer = '{"step": 12, "loss": 2.0, "tokens_per_second": 5.0}'
    facts = pod_facts(exited(rank0, newer, "2026-01-01T00:05:00Z"))
    assert facts is not None and facts.progress == TrainerProgress(step=12, loss=2.0)


def test_a_finished_job_shows_rank_zeros_final_step_not_the_last_scrape(
    make_job: Callable[..., TrainingJob],
    pools: tuple[GPUPool, ...],
    plan: Plan,
    catalog: Catalog,
) -> None:
    """The reader last scraped step 7; rank 0 then ran to step 10 and exited. The pass that
    sees every worker Succeeded writes step 10 (from the termination message, which wins
    over the older reading still held), with the exit time."""
    job = make_job()
    first = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, T0
    )
    created = list(first.create)
    pods = [o for o in created if o["kind"] == "Pod"]
    job = with_status(job, first)
    scraped = Reading(TrainerProgress(step=7, loss=3.0, samples_per_second=90.0), T0)
    running = observe(job, pools, created, dict.fromkeys(range(len(pods)), "Running"))
    rank0_uid = next(p.uid for p in running.pods if p.worker_index == 0)
    running = dataclasses.replace(running, pods=attach(running.pods, {rank0_uid: scraped}))
    steady = reconcile(running, refuse, catalog, T0 + timedelta(seconds=30))
    assert steady.status.progress is not None and steady.status.progress.step == 7
    job = with_status(job, steady)

    final = TrainerProgress(step=10, loss=2.5, samples_per_second=91.0, last_checkpoint_step=10)
    bodies = [
        exited(
            p | {"metadata": p["metadata"] | {"uid": f"uid-{i}"}},
            final.model_dump_json()
            if p["metadata"]["labels"]["sailplan.dev/worker-index"] == "0"
            else "",
            "2026-01-01T00:01:00Z",
        )
        for i, p in enumerate(pods)
    ]
    facts = [f for f in map(pod_facts, bodies) if f is not None]
    uid0 = next(f.uid for f in facts if f.worker_index == 0)
    done = dataclasses.replace(running, job=job, pods=attach(tuple(facts), {uid0: scraped}))
    outcome = reconcile(done, refuse, catalog, T0 + timedelta(minutes=2))
    assert outcome.status.phase == "Succeeded"
    progress = outcome.status.progress
    assert progress is not None
    assert (progress.step, progress.loss, progress.last_checkpoint_step) == (10, 2.5, 10)
    assert progress.time == T0 + timedelta(minutes=1)


# -- measured energy per step, beside the prediction -------------------------------------------
def test_the_trainers_energy_gauge_parses_only_when_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 serves the job's joules of the last step once every rank measured it; a step
    without a measurement takes the gauge away again (no stale number)."""
    port = free_port()
    monkeypatch.setenv("SAILPLAN_METRICS_PORT", str(port))
    reporter = Reporter(rank=0, local_rank=0, generation=1)
    reporter.step(4, 3.0, 90.0, None, 0.1, joules=2750.25)
    page = fetch(("127.0.0.1", port), 5.0)
    assert "sailplan_trainer_step_energy_joules 2750.25" in page
    assert parse_progress(page) == TrainerProgress(
        step=4, loss=3.0, samples_per_second=90.0, joules_per_step=2750.25
    )
    reporter.step(5, 2.9, 91.0, None, 0.1)  # a rank could not read its counter
    page = fetch(("127.0.0.1", port), 5.0)
    assert "sailplan_trainer_step_energy_joules" not in page
    assert parse_progress(page) == TrainerProgress(step=5, loss=2.9, samples_per_second=91.0)
    negative = "sailplan_trainer_step 6\nsailplan_trainer_step_energy_joules -1\n"
    assert parse_progress(negative) == TrainerProgress(step=6)


def with_energy(plan: Plan, measured: float, default: float) -> Plan:
    """The plan as the planner returns it for a job that asks for energy."""
    assert plan.predictions is not None
    energy = EnergyPrediction(
        joules_per_iteration_default=default,
        joules_per_iteration=measured,
        iteration_seconds=plan.predictions.iteration_seconds,
    )
    return plan.model_copy(
        update={"predictions": plan.predictions.model_copy(update={"energy": energy})}
    )


def test_measured_joules_per_step_reach_the_status_and_metrics_beside_the_prediction(
    make_job: Callable[..., TrainingJob],
    pools: tuple[GPUPool, ...],
    plan: Plan,
    catalog: Catalog,
) -> None:
    job = make_job()
    planned = with_energy(plan, 1800.0, 2000.0)
    first = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=planned)), catalog, T0
    )
    created = list(first.create)
    pods = [o for o in created if o["kind"] == "Pod"]
    job = with_status(job, first)
    running = observe(job, pools, created, dict.fromkeys(range(len(pods)), "Running"))
    rank0_uid = next(p.uid for p in running.pods if p.worker_index == 0)

    def status_with(reported: TrainerProgress) -> Any:
        scraped = {rank0_uid: Reading(reported, T0)}
        observed = dataclasses.replace(running, pods=attach(running.pods, scraped))
        return reconcile(observed, refuse, catalog, T0 + timedelta(seconds=30)).status

    status = status_with(TrainerProgress(step=7, loss=3.0, joules_per_step=1912.345))
    assert status.progress is not None and status.plan is not None
    assert status.progress.joules_per_step == 1910.0  # 3 significant digits, as displayed
    assert status.plan.predicted_joules_per_iteration == 1800.0
    written = status.model_dump(by_alias=True, mode="json")
    assert written["progress"]["joulesPerStep"] == 1910.0

    key = (job.namespace, job.name)

    def sample(name: str, **labels: str) -> float | None:
        value: float | None = metrics.REGISTRY.get_sample_value(
            name, {"namespace": key[0], "trainingjob": key[1], **labels}
        )
        return value

    measured = "sailplan_trainingjob_measured_energy_per_step_joules"
    predicted = "sailplan_trainingjob_predicted_energy_per_step_joules"
    metrics.publish_job_energy(key, status)
    assert sample(measured) == 1910.0
    assert sample(predicted, clocks="no-slowdown") == 1800.0
    assert sample(predicted, clocks="default") == 2000.0

    # A step without a measurement: the status keeps no number, the series goes.
    status = status_with(TrainerProgress(step=8, loss=2.9))
    assert status.progress is not None and status.progress.joules_per_step is None
    metrics.publish_job_energy(key, status)
    assert sample(measured) is None
    assert sample(predicted, clocks="no-slowdown") == 1800.0

    metrics.forget_job_energy(key)  # the job was deleted
    assert sample(predicted, clocks="no-slowdown") is None
    assert sample(predicted, clocks="default") is None
