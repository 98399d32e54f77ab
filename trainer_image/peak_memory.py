"""Each rank's peak GPU memory per step, from torch's CUDA caching allocator.

The plan predicts each stage's peak memory; on a GPU the trainer measures what it took:
`torch.cuda.max_memory_allocated` (bytes in live tensors at the highest point) and
`max_memory_reserved` (bytes the caching allocator held from the driver, what an
out-of-memory error is about) since the previous step boundary, after which the peaks are
reset so that each step is its own window. The engine gathers a worker's ranks' peaks (its
TP group) to every rank of it after each step, each worker's local rank 0 serves them as
Prometheus gauges labelled by global rank and stage, and global rank 0 adds its own to its
JSON step line and its termination message (sailplan.trainer.progress.Reporter).

On the CPU nothing is measured and nothing is reported: the figures are absent, not zero
(a zero would read as a measurement). The allocator's counters are bookkeeping the host
does when it allocates, so reading them needs no device synchronisation. The torch.cuda
calls come in as a module-like object so the tests can stand in for them on a machine
without CUDA. Called by sailplan.trainer.engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankPeak:
    """One rank's peaks over one step window, in bytes."""

    rank: int
    stage: int
    allocated: int
    reserved: int


class PeakMemory:
    """The peaks of one device; `cuda` None: not measuring (a CPU device)."""

    def __init__(self, device: Any, cuda: Any = None) -> None:
        self.device = device
        self.cuda = cuda

    @property
    def on(self) -> bool:
        return self.cuda is not None

    def window(self) -> tuple[int, int] | None:
        """(allocated, reserved) peak bytes since the previous call (or since the process
        started), then a fresh window; None when not measuring."""
        if self.cuda is None:
            return None
        allocated = int(self.cuda.max_memory_allocated(self.device))
        reserved = int(self.cuda.max_memory_reserved(self.device))
        self.cuda.reset_peak_memory_stats(self.device)
        return allocated, reserved


def device_peaks(device: Any) -> PeakMemory:
    """Measuring on a CUDA device, off elsewhere."""
    if getattr(device, "type", None) != "cuda":
        return PeakMemory(device)
    import torch

    return PeakMemory(device, torch.cuda)
