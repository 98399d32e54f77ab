"""Fetch the next steps' data on a background thread while the current step computes.

Why: a token file in a bucket answers in milliseconds to tens of milliseconds per request;
read on the training thread that latency would add to every step. Called by
sailplan.trainer.data.StepBatches; generic over what a step's fetch returns.

The thread runs at most `depth` steps ahead (a bounded queue), is a daemon (a SIGTERM exit
never waits on it) and is also stopped and joined with a timeout by close(). A fetch that
fails ends the thread; the training thread gets the error, as DataError with the fetch's
one-line message, when it asks for that step.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from sailplan.trainer.tokenfile import DataError

T = TypeVar("T")

# How often a blocked producer looks at the stop flag: bounds close() latency, and 0.1 s is
# far below the 2 s the trainer's fast stop allows itself.
_POLL_S = 0.1
# close() waits this long for the thread: one poll plus one in-flight read of a few MB.
_JOIN_S = 2.0


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(Generic[T]):
    """Yields fetch(step) for steps first, first+1, ..., last-1, in order, `depth` ahead.

    depth 0 fetches on the caller's thread (no thread at all).
    """

    def __init__(self, fetch: Callable[[int], T], first: int, last: int, depth: int) -> None:
        self.fetch = fetch
        self.next_step = first
        self.last = last
        self.depth = depth
        self._stop = threading.Event()
        self._queue: queue.Queue[tuple[int, T | _Failed]] = queue.Queue(maxsize=max(depth, 1))
        self._thread: threading.Thread | None = None
        if depth > 0 and first < last:
            self._thread = threading.Thread(
                target=self._produce, args=(first,), name="sailplan-prefetch", daemon=True
            )
            self._thread.start()

    def _produce(self, step: int) -> None:
        while step < self.last and not self._stop.is_set():
            item: T | _Failed
            try:
                item = self.fetch(step)
            except Exception as error:  # handed to the training thread, which raises it
                item = _Failed(error)
            while not self._stop.is_set():
                try:
                    self._queue.put((step, item), timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failed):
                return
            step += 1

    def get(self, step: int) -> T:
        """The data of `step`, which must be the next one in order."""
        if step != self.next_step or step >= self.last:
            raise ValueError(f"prefetch asked for step {step}, next is {self.next_step}")
        self.next_step += 1
        if self._thread is None:
            return self.fetch(step)
        while True:
            try:
                got, item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise DataError("data prefetch thread ended without a result") from None
        if isinstance(item, _Failed):
            if isinstance(item.error, DataError):
                raise DataError(str(item.error)) from item.error
            raise DataError(f"data prefetch failed at step {got}: {item.error!r}") from item.error
        if got != step:  # the producer runs strictly in order; a gap is a bug here
            raise DataError(f"data prefetch returned step {got} for step {step}")
        return item

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread and wait for it (bounded: it is a daemon if a read hangs)."""
        self._stop.set()
        if self._thread is None:
            return
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=_JOIN_S)
