"""Polling for a condition with a deadline: the one wait loop of the tests and benchmarks that
watch a real API server, trainer processes or an operator subprocess.

Things those tests wait for (a pod Running, a checkpoint written, a status phase) happen
asynchronously in other processes, so the tests poll. `wait_for` fails the test with what it
was waiting for and, through `explain`, the state that tells why (the harness passes the
job status and every worker's log tail); `poll` returns None instead, for the benchmarks that
report a timeout as a row rather than stop.

Importable as `waiting` from every test (pyproject's pytest `pythonpath` holds tests/);
benchmarks put tests/ on sys.path themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")

# Short enough that a test spends no noticeable time after the condition holds; each check is
# one or two API reads or one log-file read, negligible for the API server at this rate.
INTERVAL_S = 0.1


def poll(
    check: Callable[[], T | Literal[False] | None], timeout_s: float, interval_s: float = INTERVAL_S
) -> T | None:
    """The first truthy value of `check()`, or None once `timeout_s` has passed.

    The check runs before the deadline is looked at, so a condition that came true during the
    last sleep past the deadline is found instead of reported as a timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval_s)


def wait_for(
    what: str,
    check: Callable[[], T | Literal[False] | None],
    timeout_s: float,
    explain: Callable[[], str] | None = None,
    interval_s: float = INTERVAL_S,
) -> T:
    """The first truthy value of `check()`; after `timeout_s`, an AssertionError naming `what`,
    followed by `explain()` (the state a reader needs to see why it never happened)."""
    value = poll(check, timeout_s, interval_s)
    if value is not None:
        return value
    message = f"timed out after {timeout_s:.0f}s waiting for {what}"
    if explain is not None:
        try:
            message += f"\n{explain()}"
        except Exception as error:  # the timeout, not a failing diagnosis, is the finding
            message += f"\n(explaining failed: {error!r})"
    raise AssertionError(message)
