"""The controller's scheduling helpers: one reconcile per job at a time, bursts coalesced,
failures retried after a per-key exponential backoff, keys and capacity turns in rank order
(priority, creation time, name)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sailplan.operator.controller.queue import (
    Backoff,
    CapacityTurns,
    Coalesced,
    JobKey,
    Rank,
    WorkQueue,
    held_back_by,
)


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


# Ranks as the runtime makes them: (-priority, creation time, namespace, name).
RANKS: dict[JobKey, Rank] = {
    ("ns", "a-low"): (-100, "2026-01-01T10:00:00Z", "ns", "a-low"),
    ("ns", "b-high"): (-100_000, "2026-01-01T10:05:00Z", "ns", "b-high"),
    ("ns", "c-high-older"): (-100_000, "2026-01-01T10:01:00Z", "ns", "c-high-older"),
    ("ns", "d-low-same-time"): (-100, "2026-01-01T10:00:00Z", "ns", "d-low-same-time"),
}


def test_keys_enqueued_together_are_processed_by_rank_not_by_arrival() -> None:
    seen: list[JobKey] = []

    async def scenario() -> None:
        async def process(key: JobKey) -> None:
            seen.append(key)

        queue = WorkQueue(process, rank=RANKS.__getitem__)
        for key in sorted(RANKS):  # what wake_all_jobs does: by name
            queue.enqueue(key)
        worker = asyncio.create_task(queue.work())
        await asyncio.sleep(0.02)
        worker.cancel()

    asyncio.run(scenario())
    assert [name for _, name in seen] == ["c-high-older", "b-high", "a-low", "d-low-same-time"]


def test_capacity_turns_go_by_rank_among_the_passes_under_way() -> None:
    order: list[str] = []

    async def scenario() -> None:
        turns = CapacityTurns()

        async def one_pass(key: JobKey, reads: float) -> None:
            # Announced at the start, like Runtime.reconcile_job; its reads take `reads` s.
            turns.announce(key, RANKS[key])
            try:
                await asyncio.sleep(reads)
                async with turns.turn(key, RANKS[key]):
                    order.append(key[1])
                    await asyncio.sleep(0.001)  # creating its pods
            finally:
                turns.withdraw(key)

        # The low-priority passes read fastest; the high-priority ones still go first.
        await asyncio.gather(
            one_pass(("ns", "a-low"), 0.0),
            one_pass(("ns", "d-low-same-time"), 0.001),
            one_pass(("ns", "b-high"), 0.02),
            one_pass(("ns", "c-high-older"), 0.01),
        )

    asyncio.run(scenario())
    assert order == ["c-high-older", "b-high", "a-low", "d-low-same-time"]


def test_a_pass_that_ends_before_its_turn_does_not_hold_the_others() -> None:
    order: list[str] = []

    async def scenario() -> None:
        turns = CapacityTurns()
        high, low = ("ns", "b-high"), ("ns", "a-low")
        turns.announce(high, RANKS[high])
        turns.announce(low, RANKS[low])

        async def low_pass() -> None:
            async with turns.turn(low, RANKS[low]):
                order.append("a-low")

        waiting = asyncio.create_task(low_pass())
        await asyncio.sleep(0.01)
        assert order == []  # the high-priority pass is under way: the low one waits
        turns.withdraw(high)  # e.g. its job was deleted: it never takes its turn
        await asyncio.wait_for(waiting, 1.0)

    asyncio.run(scenario())
    assert order == ["a-low"]


def test_a_job_without_pods_holds_back_only_for_better_ranked_searches() -> None:
    low, high, older = ("ns", "a-low"), ("ns", "b-high"), ("ns", "c-high-older")
    # Two higher-priority jobs search: the low one waits for the best-ranked of them.
    assert held_back_by(low, RANKS[low], {high: RANKS[high], older: RANKS[older]}) == older
    # A job never waits for itself or for worse-ranked searches.
    assert held_back_by(high, RANKS[high], {high: RANKS[high], low: RANKS[low]}) is None
    assert held_back_by(older, RANKS[older], {high: RANKS[high]}) is None
    assert held_back_by(low, RANKS[low], {}) is None
