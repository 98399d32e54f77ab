"""The operator reads rank 0's progress from the trainer's real metrics endpoint.

The trainer side is the trainer's own Reporter (prometheus-client's HTTP server); the pods
are the operator's rendered worker pods. The reader's list of pods is a stand-in for the
API server (the cluster test covers the real one).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sailplan.operator import metrics
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.controller.progress import (
    RANK0_SELECTOR,
    ProgressReader,
    fetch,
    metrics_address,
    parse_progress,
)
from sailplan.operator.reconcile.children import desired_children
from sailplan.planner.plan import Plan
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
