"""Why training should stop at the next step boundary: a preemption notice or a planned switch.

A spot VM gets SIGTERM 15-30 s before it goes (GKE); the operator asks for a checkpoint
before a replan by setting CHECKPOINT_REQUEST_ANNOTATION on every worker pod, which the
trainer sees through the downward-API annotations file. Either way this rank only raises a
local flag; the engine all-reduces the flags every step so that all ranks stop after the same
step, save one checkpoint together, and exit cleanly.

Called by the engine (`requested()` each step) and the launcher (handler installation).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import FrameType

from sailplan.planner.workerenv import CHECKPOINT_REQUEST_ANNOTATION


def read_annotations(path: Path) -> dict[str, str]:
    """Parse a downward-API annotations file (`key="json-escaped value"` per line)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    annotations: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        annotations[key.strip()] = str(value)
    return annotations


def checkpoint_requested(annotations: dict[str, str], generation: int) -> bool:
    """The operator's request names the plan generation it retires; older requests are stale."""
    value = annotations.get(CHECKPOINT_REQUEST_ANNOTATION, "").strip()
    if not value:
        return False
    try:
        return int(value) >= generation
    except ValueError:
        return True  # a request that does not name a generation applies to whoever runs


class StopSignal:
    """Local stop flag: SIGTERM, or a checkpoint request in the pod's annotations."""

    def __init__(self, podinfo_dir: str | None, generation: int) -> None:
        self.generation = generation
        self.annotations_path = Path(podinfo_dir) / "annotations" if podinfo_dir else None
        self.reason: str | None = None

    def install(self) -> None:
        """Catch SIGTERM (main thread only); the launcher forwards it to every local rank."""
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.reason = self.reason or "sigterm"

    def requested(self) -> bool:
        if (
            self.reason is None
            and self.annotations_path is not None
            and checkpoint_requested(read_annotations(self.annotations_path), self.generation)
        ):
            self.reason = "checkpoint-request"
        return self.reason is not None


def podinfo_dir_from_env() -> str | None:
    from sailplan.planner.workerenv import PODINFO_DIR

    return os.environ.get(PODINFO_DIR)
