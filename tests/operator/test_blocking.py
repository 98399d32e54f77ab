"""Blocking calls awaited by the controller never hold the operator's exit up."""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from sailplan.operator.controller.blocking import run_blocking

# A process whose loop is cancelled while a 60 s call runs, as SIGTERM cancels the
# operator's tasks while a reconcile waits; `{call}` is the way the call is awaited.
EXITING = textwrap.dedent(
    """
    import asyncio, time
    from sailplan.operator.controller.blocking import run_blocking

    async def main():
        waiting = asyncio.create_task({call}(time.sleep, 60))
        await asyncio.sleep(0.2)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)

    asyncio.run(main())
    """
)


def test_a_cancelled_caller_lets_the_process_exit_while_the_call_runs() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", EXITING.format(call="run_blocking")], timeout=30, check=False
    )
    assert done.returncode == 0
    assert time.monotonic() - started < 10  # not the 60 s the call would take


@pytest.mark.slow
def test_the_default_executor_is_what_held_the_exit_up() -> None:
    # The same program with asyncio.to_thread waits for the call: what run_blocking avoids.
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(
            [sys.executable, "-c", EXITING.format(call="asyncio.to_thread")], timeout=5, check=False
        )


REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request")


def test_results_exceptions_and_context_variables_cross_the_thread() -> None:
    def where(value: int) -> tuple[int, bool, str]:
        return value * 2, threading.current_thread().daemon, REQUEST.get()

    def fail() -> None:
        raise ValueError("API server said no")

    async def scenario() -> tuple[int, bool, str]:
        REQUEST.set("reconcile ns/a")
        with pytest.raises(ValueError, match="API server said no"):
            await run_blocking(fail)
        return await run_blocking(where, 21)

    assert asyncio.run(scenario()) == (42, True, "reconcile ns/a")
