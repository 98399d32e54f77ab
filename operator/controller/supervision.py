"""The operator's own background tasks, watched: none may die silently.

The runtime (sailplan.operator.controller.runtime) spawns its queue workers and resync
loop here. These tasks are meant to run until the operator stops; one that returns,
raises or is cancelled from elsewhere is logged at once, and `dead()` names it from then
on. Registration's `@kopf.on.probe` handler reports `states()` on Kopf's liveness endpoint
and fails while anything is dead, so Kubernetes restarts the pod instead of leaving an
operator that watches events but never reconciles.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import kopf

log = logging.getLogger("sailplan.operator")

RUNNING = "running"


class Supervisor:
    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping = False

    def spawn(self, name: str, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run `coroutine` as the long-lived task `name` (names are unique)."""
        if name in self._tasks:
            coroutine.close()
            raise ValueError(f"a background task named {name!r} already exists")
        task = asyncio.create_task(coroutine, name=name)
        task.add_done_callback(self._ended)
        self._tasks[name] = task

    @property
    def started(self) -> bool:
        return bool(self._tasks)

    def states(self) -> dict[str, str]:
        """Each task's state: running, or how it ended."""
        return {name: _state(task) for name, task in sorted(self._tasks.items())}

    def dead(self) -> list[str]:
        return [name for name, state in self.states().items() if state != RUNNING]

    async def stop(self) -> None:
        """Cancel every task and wait for them (their ending is not an error then)."""
        self._stopping = True
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self._stopping:
            return
        error = None if task.cancelled() else task.exception()
        log.error(
            "background task ended unexpectedly; the liveness probe fails from now on",
            exc_info=error,
            extra={"task": task.get_name(), "state": _state(task)},
        )


def _state(task: asyncio.Task[None]) -> str:
    if not task.done():
        return RUNNING
    if task.cancelled():
        return "cancelled"
    error = task.exception()
    if error is not None:
        return f"failed: {type(error).__name__}: {error}"
    return "returned"


def register_liveness_probe(registry: kopf.OperatorRegistry, supervisor: Supervisor) -> None:
    """Report the tasks on Kopf's liveness endpoint; fail it while any of them is dead."""

    # PERMANENT: a raising probe ends Kopf's probe activity at once and /healthz answers
    # 500. With Kopf's default error mode the handler would be retried after a backoff
    # while the request waits, so a dead task would look like a slow endpoint.
    @kopf.on.probe(id="background-tasks", registry=registry, errors=kopf.ErrorsMode.PERMANENT)
    async def background_tasks(**_: Any) -> dict[str, str]:
        states = supervisor.states()
        dead = [f"{name} {state}" for name, state in states.items() if state != RUNNING]
        if dead:
            raise kopf.PermanentError("background tasks ended: " + ", ".join(dead))
        return states or {"*": "waiting for the first watch event"}
