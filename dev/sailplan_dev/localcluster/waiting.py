"""Polling helpers shared by the local cluster and the controllers it starts beside it.

cluster.py, karpenter.py and kueue.py wait for conditions on the API server and delete
objects that may already be gone; each raises its own error type so callers can tell
which component timed out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes import client


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout_s: float,
    error: type[Exception],
    interval_s: float = 0.2,
) -> None:
    """Poll `check` until it is true; `error` naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def ignore_404(call: Callable[..., Any], *args: Any) -> None:
    """`call(*args)`, where a 404 (already gone) is success."""
    try:
        call(*args)
    except client.ApiException as failure:
        if failure.status != 404:
            raise
