"""Scheduling of reconciles: a de-duplicating per-job work queue and a coalescing runner.

The runtime (sailplan.operator.controller.runtime) puts a job's key on the `WorkQueue`
whenever a watch event concerns it; its workers run at most one reconcile per key at a
time, and a key enqueued meanwhile runs once more afterwards, so a burst of pod events
costs one pass, not one per event. `Coalesced` does the same for the one GPUPool status
refresh that node, pod and pool events all ask for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sailplan.operator import metrics
from sailplan.operator.api import trainingjob as job_api

log = logging.getLogger("sailplan.operator")

JobKey = tuple[str, str]  # (namespace, name)
RETRY_SECONDS = 5.0


class WorkQueue:
    """At most one reconcile per key at a time; a key enqueued meanwhile runs once more after."""

    def __init__(self, process: Callable[[JobKey], Awaitable[None]]) -> None:
        self._process = process
        self._queue: asyncio.Queue[JobKey] = asyncio.Queue()
        self._pending: set[JobKey] = set()
        self._active: set[JobKey] = set()
        self._dirty: set[JobKey] = set()

    def enqueue(self, key: JobKey) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._pending:
            self._pending.add(key)
            self._queue.put_nowait(key)

    async def work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            key = await self._queue.get()
            self._pending.discard(key)
            self._active.add(key)
            try:
                await self._process(key)
            except Exception:
                log.exception(
                    "reconcile failed; retrying",
                    extra={"namespace": key[0], "trainingjob": key[1]},
                )
                metrics.RECONCILES.labels(kind=job_api.KIND, result="error").inc()
                loop.call_later(RETRY_SECONDS, self.enqueue, key)
            finally:
                self._active.discard(key)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.enqueue(key)


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
