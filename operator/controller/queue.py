"""Scheduling of reconciles: a de-duplicating per-job work queue, capacity turns by rank,
and a coalescing runner.

The runtime (sailplan.operator.controller.runtime) puts a job's key on the `WorkQueue`
whenever a watch event concerns it; its workers run at most one reconcile per key at a
time, and a key enqueued meanwhile runs once more afterwards, so a burst of pod events
costs one pass, not one per event. Keys wait in rank order (the runtime's: priority, then
creation time, then name), and `CapacityTurns` lets the passes under way read capacity and
create pods one at a time in that order; a job that needs capacity (no pods, or its plan
lost some) also holds back while a better-ranked one that needs capacity has not created
its new workers yet (`held_back_by`, reconcile.contention). So when capacity frees up
and every waiting job is woken, the higher-priority job plans first, whichever pass or
search happens to be quicker.
`Coalesced` does the same for the one GPUPool status refresh that node, pod and pool
events all ask for.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from sailplan.operator import metrics
from sailplan.operator.api import trainingjob as job_api

log = logging.getLogger("sailplan.operator")

JobKey = tuple[str, str]  # (namespace, name)
# Smaller goes first: (-priority, creation time, namespace, name) in the runtime.
Rank = tuple[int, str, str, str]


@dataclass(frozen=True)
class Backoff:
    """Delay before retrying a key after its n-th consecutive failure: `base_seconds`
    doubling per failure up to `cap_seconds`, stretched by up to `jitter` (a fraction) so
    that keys failing together do not retry in lockstep."""

    base_seconds: float = 1.0
    cap_seconds: float = 300.0
    jitter: float = 0.1
    uniform: Callable[[], float] = field(default=random.random, compare=False)

    def delay(self, failures: int) -> float:
        exponential = self.base_seconds * 2.0 ** min(max(failures - 1, 0), 62)
        return min(self.cap_seconds, exponential) * (1.0 + self.jitter * self.uniform())


class WorkQueue:
    """At most one reconcile per key at a time; a key enqueued meanwhile runs once more after."""

    def __init__(
        self,
        process: Callable[[JobKey], Awaitable[None]],
        backoff: Backoff | None = None,
        rank: Callable[[JobKey], Rank] | None = None,
    ) -> None:
        self._process = process
        self._backoff = backoff or Backoff()
        # Without a rank, first in first out (the sequence number decides).
        self._rank = rank or (lambda key: (0, "", "", ""))
        self._sequence = itertools.count()
        self._failures: dict[JobKey, int] = {}
        self._retries: dict[JobKey, asyncio.TimerHandle] = {}
        self._queue: asyncio.PriorityQueue[tuple[Rank, int, JobKey]] = asyncio.PriorityQueue()
        self._pending: set[JobKey] = set()
        self._active: set[JobKey] = set()
        self._dirty: set[JobKey] = set()

    def enqueue(self, key: JobKey) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._pending:
            self._pending.add(key)
            self._queue.put_nowait((self._rank(key), next(self._sequence), key))

    async def work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            _, _, key = await self._queue.get()
            self._pending.discard(key)
            self._active.add(key)
            try:
                await self._process(key)
            except Exception:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = self._backoff.delay(failures)
                log.exception(
                    "reconcile failed; retrying",
                    extra={
                        "namespace": key[0],
                        "trainingjob": key[1],
                        "failures": failures,
                        "retry_in_seconds": round(delay, 3),
                    },
                )
                metrics.RECONCILES.labels(kind=job_api.KIND, result="error").inc()
                metrics.RECONCILE_RETRY_SECONDS.observe(delay)
                self._schedule_retry(loop, key, delay)
            else:
                self._failures.pop(key, None)
            finally:
                self._active.discard(key)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.enqueue(key)

    def failures(self, key: JobKey) -> int:
        """Consecutive failed passes of `key` (0 after a success)."""
        return self._failures.get(key, 0)

    def _schedule_retry(self, loop: asyncio.AbstractEventLoop, key: JobKey, delay: float) -> None:
        # One pending retry per key: an earlier timer would only add a pass.
        previous = self._retries.pop(key, None)
        if previous is not None:
            previous.cancel()
        self._retries[key] = loop.call_later(delay, self._retry, key)

    def _retry(self, key: JobKey) -> None:
        self._retries.pop(key, None)
        self.enqueue(key)


class CapacityTurns:
    """One pass at a time between reading capacity and creating its pods; among the passes
    under way (announced when they start), the best-ranked goes first, waiting for it if it
    has not reached its turn yet. A pass that ends without taking its turn withdraws."""

    def __init__(self) -> None:
        self._ranks: dict[JobKey, Rank] = {}
        self._waiting: dict[JobKey, asyncio.Future[None]] = {}
        self._holder: JobKey | None = None

    def announce(self, key: JobKey, rank: Rank) -> None:
        self._ranks[key] = rank

    def withdraw(self, key: JobKey) -> None:
        self._ranks.pop(key, None)
        waiter = self._waiting.pop(key, None)
        if waiter is not None:
            waiter.cancel()
        self._grant()

    @asynccontextmanager
    async def turn(self, key: JobKey, rank: Rank) -> AsyncIterator[None]:
        self._ranks[key] = rank  # what the pass learnt since it announced itself
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[key] = waiter
        self._grant()
        try:
            await waiter
        except asyncio.CancelledError:
            if self._holder == key:
                self._holder = None
            self.withdraw(key)
            raise
        try:
            yield
        finally:
            self._holder = None
            self.withdraw(key)

    def _grant(self) -> None:
        if self._holder is not None or not self._ranks:
            return
        best = min(self._ranks, key=lambda k: (self._ranks[k], k))
        waiter = self._waiting.pop(best, None)
        if waiter is None:
            return  # the best-ranked pass has not reached its turn yet: it goes first
        self._holder = best
        waiter.set_result(None)


def held_back_by(key: JobKey, rank: Rank, contenders: Mapping[JobKey, Rank]) -> JobKey | None:
    """The best-ranked other job among `contenders` (jobs that need capacity and have not
    created their new workers yet, reconcile.contention.contends) that ranks before `rank`:
    a job that needs capacity waits for it, since its plan may take the capacity; None when
    none does."""
    ahead = sorted((r, other) for other, r in contenders.items() if other != key and r < rank)
    return ahead[0][1] if ahead else None


class Coalesced:
    """Run an async function on demand; requests during a run collapse into one more run."""

    def __init__(self, fn: Callable[[], Awaitable[None]]) -> None:
        self._fn = fn
        self._running = False
        self._again = False

    async def kick(self) -> None:
        if self._running:
            self._again = True
            return
        self._running = True
        try:
            while True:
                self._again = False
                await self._fn()
                if not self._again:
                    break
        finally:
            self._running = False
