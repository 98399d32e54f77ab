"""Blocking calls (the kubernetes client, the planner search) awaited without holding up exit.

Observation, apply and the runtime await every blocking call through `run_blocking`.
`asyncio.to_thread` would use the loop's default executor, whose threads are joined when
the loop closes and again at interpreter exit: one search still running in it kept the
operator alive after SIGTERM until Kopf's last-resort SIGKILL ten minutes later. Here each
call gets its own daemon thread; a caller cancelled on shutdown stops waiting at once, and
the thread, whose result nobody wants any more, dies with the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def run_blocking(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` in a daemon thread, in the caller's context variables."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def deliver(result: T | None, error: BaseException | None) -> None:
        if future.done():  # the caller was cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def call() -> None:
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as error:  # handed to the awaiting task
            outcome: tuple[T | None, BaseException | None] = (None, error)
        else:
            outcome = (result, None)
        # A closed loop (RuntimeError): the operator is exiting and nobody waits.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, *outcome)

    threading.Thread(
        target=call, name=f"blocking {getattr(fn, '__name__', fn)!s}", daemon=True
    ).start()
    return await future
