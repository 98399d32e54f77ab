"""The controller's scheduling helpers: one reconcile per job at a time, bursts coalesced,
failures retried after a per-key exponential backoff."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sailplan.operator.controller.queue import Backoff, Coalesced, WorkQueue


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


def test_backoff_doubles_per_consecutive_failure_up_to_the_cap() -> None:
    backoff = Backoff(base_seconds=1.0, cap_seconds=300.0, jitter=0.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 9, 10, 1000)] == [1, 2, 4, 8, 256, 300, 300]


def test_backoff_jitter_stretches_by_at_most_its_fraction() -> None:
    assert Backoff(base_seconds=4.0, jitter=0.25, uniform=lambda: 1.0).delay(1) == 5.0
    assert Backoff(base_seconds=4.0, jitter=0.25, uniform=lambda: 0.0).delay(1) == 4.0


@dataclass(frozen=True)
class RecordingBackoff(Backoff):
    """A tiny real delay; records which failure count each retry was scheduled for."""

    asked: list[int] = field(default_factory=list, compare=False)

    def delay(self, failures: int) -> float:
        self.asked.append(failures)
        return 0.001


def test_a_failing_key_backs_off_per_consecutive_failure_and_resets_on_success() -> None:
    attempts: dict[str, int] = {"a": 0, "b": 0}
    backoff = RecordingBackoff()
    failures_after: list[int] = []

    async def scenario() -> None:
        async def process(key: tuple[str, str]) -> None:
            attempts[key[1]] += 1
            if key[1] == "a" and attempts["a"] <= 3:
                raise RuntimeError("API server hiccup")

        queue = WorkQueue(process, backoff)
        worker = asyncio.create_task(queue.work())
        queue.enqueue(("ns", "a"))
        queue.enqueue(("ns", "b"))
        for _ in range(100):
            await asyncio.sleep(0.005)
            if attempts["a"] == 4:
                break
        failures_after.append(queue.failures(("ns", "a")))
        # A later failure of the same key starts from the base again.
        attempts["a"] = 0
        queue.enqueue(("ns", "a"))
        await asyncio.sleep(0.02)
        worker.cancel()

    asyncio.run(scenario())
    assert attempts["b"] == 1  # the other key was not held back
    assert failures_after == [0]  # reset by the fourth, successful pass
    assert backoff.asked[:3] == [1, 2, 3]
    assert backoff.asked[3] == 1


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
