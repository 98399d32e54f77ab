"""Energy per training step from a GPU's cumulative energy counter and the job's step.

The agent samples nvmlDeviceGetTotalEnergyConsumption (millijoules since the driver
loaded) each pass and reads the job's step from rank 0's progress annotation. A GPU's
energy per step is the counter's growth between two passes that saw different steps,
divided by the steps done in between: the window restarts whenever the step moves, so
the number follows the current clocks. A counter or a step that goes backwards (driver
reload, a replan that resumes from an older checkpoint) restarts the window.

Pure; agent.py owns one `EnergyMeter` per process.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass


@dataclass
class _Window:
    start_mj: int  # counter when the window began
    start_step: int | None
    first_mj: int  # counter when the meter first saw this key
    joules_per_step: float | None = None


class EnergyMeter:
    """Windows per key (a GPU under one pod): total joules measured and joules per step."""

    def __init__(self) -> None:
        self._windows: dict[Hashable, _Window] = {}

    def observe(self, key: Hashable, counter_mj: int, step: int | None) -> float | None:
        """Record a sample; returns the latest joules per step (None until two steps seen)."""
        window = self._windows.get(key)
        if window is None or counter_mj < window.start_mj:
            self._windows[key] = _Window(start_mj=counter_mj, start_step=step, first_mj=counter_mj)
            return None
        if step is None:
            return window.joules_per_step
        if window.start_step is None or step < window.start_step:
            window.start_step = step
            window.start_mj = counter_mj
            return window.joules_per_step
        if step > window.start_step:
            window.joules_per_step = (
                (counter_mj - window.start_mj) / 1000.0 / (step - window.start_step)
            )
            window.start_step = step
            window.start_mj = counter_mj
        return window.joules_per_step

    def total_joules(self, key: Hashable, counter_mj: int) -> float:
        """Joules since the meter first saw `key` (0 for an unknown key)."""
        window = self._windows.get(key)
        return 0.0 if window is None else max(0, counter_mj - window.first_mj) / 1000.0

    def forget(self, keep: Iterable[Hashable]) -> None:
        """Drop every key not in `keep` (their pods are gone)."""
        kept = set(keep)
        for key in [k for k in self._windows if k not in kept]:
            del self._windows[key]
