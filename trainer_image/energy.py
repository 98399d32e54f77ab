"""Each rank's GPU energy per training step, from NVML's total energy counter.

Every rank reads nvmlDeviceGetTotalEnergyConsumption (millijoules since the driver loaded)
of its own GPU at each step boundary; the counter's growth since the previous boundary is
the rank's energy for that step. The engine sums it over the world in the per-step control
all-reduce it already makes (sailplan.trainer.control), and rank 0 reports the sum through
progress.Reporter (workerenv.METRIC_STEP_ENERGY), which the operator copies into the
TrainingJob's status.progress.joulesPerStep beside the plan's predicted joules per
iteration.

Measuring is best effort and never stops training: no CUDA device, no pynvml (package
nvidia-ml-py, in the `trainer` extra), no driver library, a GPU NVML cannot find or whose
counter it does not support (NVML_ERROR_NOT_SUPPORTED before Volta, MIG slices) leave the
meter off, and a read that fails later turns it off; a rank whose meter is off reports no
energy, and then neither does the job. The counter is a plain function, so the tests drive
the meter with the node agent's FakeNVML (the trainer does not import the operator: the
one pynvml call it needs is here).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sailplan.trainer")


class StepEnergy:
    """The joules one GPU drew between two step boundaries; `read_mj` None: not measuring."""

    def __init__(
        self, read_mj: Callable[[], int] | None, sync: Callable[[], None] | None = None
    ) -> None:
        self.read_mj = read_mj
        # waits for the GPU work queued so far, so a step's kernels count in its own step
        self.sync = sync
        self._last_mj: int | None = None

    @property
    def on(self) -> bool:
        return self.read_mj is not None

    def _read(self) -> int | None:
        if self.read_mj is None:
            return None
        try:
            if self.sync is not None:
                self.sync()
            return self.read_mj()
        except Exception as error:  # NVML's error, or a driver gone wrong: never stop training
            log.warning("GPU energy counter unreadable; no energy reported: %s", error)
            self.read_mj = None
            return None

    def start(self) -> None:
        """Read the counter at the first boundary (before the first step of this run)."""
        self._last_mj = self._read()

    def step(self) -> float | None:
        """Joules since the previous boundary, or None (meter off, no previous reading, or a
        counter that went backwards: a driver reload restarts it)."""
        counter = self._read()
        previous, self._last_mj = self._last_mj, counter
        if counter is None or previous is None or counter < previous:
            return None
        return (counter - previous) / 1000.0


def nvml_uuid(cuda_uuid: str) -> str:
    """NVML's name of a GPU from torch's UUID: torch prints the bare 8-4-4-4-12 form, NVML
    prefixes it with "GPU-" (MIG slices: "MIG-")."""
    return cuda_uuid if cuda_uuid.startswith(("GPU-", "MIG-")) else f"GPU-{cuda_uuid}"


def gpu_meter(device: Any) -> StepEnergy:
    """The meter of a torch CUDA device, found in NVML by the GPU's UUID (CUDA's and NVML's
    device orders can differ); off for a CPU device or where NVML is not there."""
    if getattr(device, "type", None) != "cuda":
        return StepEnergy(None)
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        uuid = nvml_uuid(str(torch.cuda.get_device_properties(device).uuid))
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # NOT_SUPPORTED: off from here

        def read_mj() -> int:
            return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))

        return StepEnergy(read_mj, sync=lambda: torch.cuda.synchronize(device))
    except Exception as error:
        # ImportError, NVMLError (no driver library, GPU not found, not supported): training
        # goes on without the measurement.
        log.warning("GPU energy not measured on %s: %s", device, error)
        return StepEnergy(None)
