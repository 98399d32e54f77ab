"""The controller's scheduling helpers: one reconcile per job at a time, bursts coalesced."""

from __future__ import annotations

import asyncio

import pytest

from sailplan.operator.controller import queue
from sailplan.operator.controller.queue import Coalesced, WorkQueue


def test_a_key_is_processed_once_per_burst_and_again_if_enqueued_meanwhile() -> None:
    seen: list[tuple[str, str]] = []
    release = asyncio.Event()

    async def scenario() -> None:
        async def process(key: tuple[str, str]) -> None:
            seen.append(key)
            if len(seen) == 1:
                await release.wait()  # hold the first pass open

        queue = WorkQueue(process)
        worker = asyncio.create_task(queue.work())
        queue.enqueue(("ns", "a"))
        queue.enqueue(("ns", "a"))  # duplicate while pending: dropped
        await asyncio.sleep(0.01)
        assert seen == [("ns", "a")]
        queue.enqueue(("ns", "a"))  # while active: one more pass afterwards
        queue.enqueue(("ns", "a"))
        queue.enqueue(("ns", "b"))
        release.set()
        await asyncio.sleep(0.05)
        worker.cancel()

    asyncio.run(scenario())
    assert seen == [("ns", "a"), ("ns", "b"), ("ns", "a")]


def test_failed_reconciles_are_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue, "RETRY_SECONDS", 0.01)
    attempts: list[int] = []

    async def scenario() -> None:
        async def process(key: tuple[str, str]) -> None:
            attempts.append(1)
            if len(attempts) == 1:
                raise RuntimeError("API server hiccup")

        queue = WorkQueue(process)
        worker = asyncio.create_task(queue.work())
        queue.enqueue(("ns", "a"))
        await asyncio.sleep(0.1)
        worker.cancel()

    asyncio.run(scenario())
    assert len(attempts) == 2


def test_coalesced_runs_once_more_for_any_number_of_kicks_during_a_run() -> None:
    runs: list[int] = []

    async def scenario() -> None:
        gate = asyncio.Event()

        async def refresh() -> None:
            runs.append(1)
            if len(runs) == 1:
                await gate.wait()

        coalesced = Coalesced(refresh)
        first = asyncio.create_task(coalesced.kick())
        await asyncio.sleep(0.01)
        for _ in range(10):
            await coalesced.kick()  # returns at once: a run is in progress
        gate.set()
        await first

    asyncio.run(scenario())
    assert len(runs) == 2
