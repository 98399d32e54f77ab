"""Each rank's peak GPU memory per step leaves the trainer; on the CPU nothing does.

There is no CUDA device here, so torch.cuda's three allocator calls are stood in for with
values the test chooses (different per rank and per step, so a value taken from the wrong
rank or the wrong step would not match). What is checked is the plumbing: the window reads
and resets the allocator's peaks, the engine gathers a TP worker's ranks' peaks, each
worker's metrics endpoint serves them labelled by rank and stage, global rank 0's step line
and termination message carry its own, and the operator's readers, which know none of
these fields, read the rest unchanged. On the CPU the gauges and fields are absent, not 0.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from rank_memory import spawn, write_report
from trainer_harness import TINY, free_port, make_plan, run_plan, trainer_config

from sailplan.planner.workerenv import TrainerProgress
from sailplan.trainer.peak_memory import PeakMemory, RankPeak, device_peaks
from sailplan.trainer.progress import (
    METRIC_PEAK_ALLOCATED,
    METRIC_PEAK_RESERVED,
    Reporter,
)

PEAK_FIELDS = ("peak_memory_allocated_bytes", "peak_memory_reserved_bytes")


class StandInCuda:
    """torch.cuda's allocator calls for one device: window k reads `peaks[k]`; the reset
    that closes a window moves to the next and records the device it was asked for."""

    def __init__(self, peaks: list[tuple[int, int]]) -> None:
        self.peaks = list(peaks)
        self.resets: list[str] = []

    def max_memory_allocated(self, device: Any) -> int:
        return self.peaks[0][0]

    def max_memory_reserved(self, device: Any) -> int:
        return self.peaks[0][1]

    def reset_peak_memory_stats(self, device: Any) -> None:
        self.resets.append(str(device))
        self.peaks.pop(0)


def scrape(port: int) -> dict[str, dict[tuple[str, str], float]]:
    """The peak gauges of a metrics page, by (rank, stage) label."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return peak_samples(response.read().decode())


def peak_samples(text: str) -> dict[str, dict[tuple[str, str], float]]:
    found: dict[str, dict[tuple[str, str], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (METRIC_PEAK_ALLOCATED, METRIC_PEAK_RESERVED):
                key = (sample.labels["rank"], sample.labels["stage"])
                found.setdefault(sample.name, {})[key] = sample.value
    return found


def test_a_cpu_device_measures_nothing() -> None:
    peaks = device_peaks(torch.device("cpu"))
    assert not peaks.on
    assert peaks.window() is None


def test_a_cuda_window_reads_torchs_peaks_and_starts_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda = StandInCuda([(1_000, 4_096), (700, 4_096)])
    for call in ("max_memory_allocated", "max_memory_reserved", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, call, getattr(cuda, call))
    peaks = device_peaks(torch.device("cuda", 1))
    assert peaks.on
    assert peaks.window() == (1_000, 4_096)
    assert peaks.window() == (700, 4_096)
    assert cuda.resets == ["cuda:1", "cuda:1"]


def _reporter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rank: int
) -> tuple[Reporter, int, Path]:
    port = free_port()
    monkeypatch.setenv("SAILPLAN_METRICS_PORT", str(port))
    termination = tmp_path / f"termination-{rank}"
    termination.write_text("")  # the kubelet's file exists in a container
    monkeypatch.setenv("SAILPLAN_TERMINATION_LOG", str(termination))
    return Reporter(rank=rank, local_rank=0, generation=2), port, termination


def test_without_a_measurement_no_gauge_and_no_field(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reporter, port, termination = _reporter(monkeypatch, tmp_path, 0)
    reporter.step(3, 2.5, 50.0, None, 0.1, memory=None)
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["step"] == 3
    assert not set(PEAK_FIELDS) & set(line)
    assert not set(PEAK_FIELDS) & set(json.loads(termination.read_text()))
    assert scrape(port) == {}


def test_a_workers_peaks_are_served_by_rank_and_rank_zeros_own_are_in_its_messages(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sailplan.operator.controller.progress import parse_progress

    reporter, port, termination = _reporter(monkeypatch, tmp_path, 0)
    worker = [RankPeak(0, 0, 1_000, 4_096), RankPeak(1, 0, 900, 2_048)]
    reporter.step(7, 2.5, 50.0, 5, 0.1, memory=worker)
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (line["peak_memory_allocated_bytes"], line["peak_memory_reserved_bytes"]) == (
        1_000,
        4_096,
    )
    message = termination.read_text()
    assert json.loads(message)["peak_memory_allocated_bytes"] == 1_000
    # the operator's model of the message ignores the fields it does not know
    assert TrainerProgress.model_validate_json(message) == TrainerProgress(
        step=7, loss=2.5, samples_per_second=50.0, last_checkpoint_step=5, plan_generation=2
    )
    assert scrape(port) == {
        METRIC_PEAK_ALLOCATED: {("0", "0"): 1_000.0, ("1", "0"): 900.0},
        METRIC_PEAK_RESERVED: {("0", "0"): 4_096.0, ("1", "0"): 2_048.0},
    }
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        progress = parse_progress(response.read().decode())
    assert progress == TrainerProgress(
        step=7, loss=2.5, samples_per_second=50.0, last_checkpoint_step=5
    )
    # a step without a measurement takes the gauges away rather than leaving stale ones
    reporter.step(8, 2.4, 50.0, 5, 0.1, memory=None)
    assert scrape(port) == {}


def test_a_rank_that_is_not_rank_zero_serves_but_writes_no_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reporter, port, termination = _reporter(monkeypatch, tmp_path, 2)
    reporter.step(1, 3.0, 50.0, None, 0.1, memory=[RankPeak(2, 1, 10, 20)])
    assert scrape(port) == {
        METRIC_PEAK_ALLOCATED: {("2", "1"): 10.0},
        METRIC_PEAK_RESERVED: {("2", "1"): 20.0},
    }
    assert termination.read_text() == ""


STEPS = 3


def stand_in_peaks(rank: int) -> list[tuple[int, int]]:
    """What rank `rank`'s allocator reports in step window k (k = 0..STEPS-1)."""
    return [(1_000 * (rank + 1) + k, 10_000 * (rank + 1) + k) for k in range(STEPS)]


def _trainer_rank(rank: int, port: int, plan_json: str, config_json: str, tmp: Path) -> None:
    """One rank of the real Trainer (a TP 2 worker: global ranks 0 and 1, local ranks 0 and
    1), its device's allocator stood in for; reports rank 0's termination message and
    metrics page after the run."""
    from prometheus_client import generate_latest

    from sailplan.planner.plan import Plan
    from sailplan.planner.workerenv import TrainerConfig
    from sailplan.trainer import engine
    from sailplan.trainer.stopping import StopSignal

    termination = tmp / f"termination-{rank}"
    termination.write_text("")
    os.environ["SAILPLAN_TERMINATION_LOG"] = str(termination)
    os.environ["SAILPLAN_METRICS_PORT"] = str(free_port())
    cuda = StandInCuda(stand_in_peaks(rank))
    engine.device_peaks = lambda device: PeakMemory(device, cuda)  # type: ignore[assignment]
    device = engine.init_world(
        rank=rank,
        local_rank=rank,
        world_size=2,
        master_addr="127.0.0.1",
        master_port=port,
        timeout_s=120,
    )
    trainer = engine.Trainer(
        Plan.from_json(plan_json),
        TrainerConfig.model_validate_json(config_json),
        rank=rank,
        local_rank=rank,
        device=device,
        generation=1,
        stop=StopSignal(None, 1),
    )
    trainer.run()
    torch.distributed.destroy_process_group()
    metrics = trainer.reporter.metrics
    write_report(
        tmp,
        rank,
        {
            "termination": termination.read_text(),
            "page": None if metrics is None else generate_latest(metrics.registry).decode(),
            "windows_left": len(cuda.peaks),
        },
    )


@pytest.mark.trainer
def test_the_trainer_gathers_its_workers_peaks_every_step(tmp_path: Path) -> None:
    plan = make_plan(TINY, [(0, TINY.num_layers, 2)], 1, 2, 8)
    config = trainer_config(tmp_path, STEPS)
    reports = spawn(_trainer_rank, tmp_path, plan.to_json(), config.model_dump_json())
    # one window per step on each rank
    assert [r["windows_left"] for r in reports] == [0, 0]
    last = STEPS - 1
    final = json.loads(reports[0]["termination"])
    assert final["step"] == STEPS
    assert (final["peak_memory_allocated_bytes"], final["peak_memory_reserved_bytes"]) == (
        stand_in_peaks(0)[last]
    )
    assert reports[1]["termination"] == ""  # only global rank 0 writes one
    assert reports[1]["page"] is None  # local rank 1 serves no endpoint
    # rank 0's endpoint serves both ranks of its worker, each its own last window
    assert peak_samples(reports[0]["page"]) == {
        METRIC_PEAK_ALLOCATED: {(str(r), "0"): float(stand_in_peaks(r)[last][0]) for r in range(2)},
        METRIC_PEAK_RESERVED: {(str(r), "0"): float(stand_in_peaks(r)[last][1]) for r in range(2)},
    }


@pytest.mark.trainer
def test_a_cpu_run_reports_no_peak_memory(tmp_path: Path) -> None:
    plan = make_plan(TINY, [(0, TINY.num_layers, 1)], 1, 2, 8)
    run = run_plan(plan, trainer_config(tmp_path, 2), tmp_path)
    steps = [e for e in run.events if e["event"] == "step"]
    assert len(steps) == 2
    assert all(not set(PEAK_FIELDS) & set(step) for step in steps)
