"""Which GPU of this node gets which SM clock, and what to change: the agent's pure core.

agent.py gathers the facts (the node's worker pods and the GPUs each was given, whether
the pod's TrainingJob opted in, its plan's clocks, the GPUs' supported clocks, what the
agent itself locked before) and calls `assign`, which returns the clock every managed GPU
should have and the NVML actions that get it there. The rules:

- only a GPU allocated to a running, not deleting worker pod of a TrainingJob that opted
  in (`spec.energy.clocks: NoSlowdown`, or the deprecated annotation
  `sailplan.dev/energy-clocks: no-slowdown`) and whose plan has a clock
  for the pod's (stage, replica) is locked;
- a GPU the agent locked whose pod is gone (deleted, finished, deleting, opted out, or on
  another plan without a clock for it) is reset;
- every other GPU is never touched: not locked, not reset (it may be another team's, or a
  shared GPU whose settings are not ours to change);
- a clock the GPU does not support is replaced by the nearest supported one (the higher
  one on a tie: no slowdown), and a note says so.

No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# spec.energy.clocks of the TrainingJob (operator/api/trainingjob.py EnergySpec); the
# annotation is its deprecated predecessor, still honoured.
OPT_IN_CLOCKS = "NoSlowdown"
OPT_IN_ANNOTATION = "sailplan.dev/energy-clocks"
OPT_IN_VALUE = "no-slowdown"


def opt_in(job: Mapping[str, Any]) -> tuple[bool, bool]:
    """(opted in, through the deprecated annotation) of a TrainingJob body."""
    spec = job.get("spec") or {}
    energy = spec.get("energy") or {} if isinstance(spec, Mapping) else {}
    if isinstance(energy, Mapping) and energy.get("clocks") == OPT_IN_CLOCKS:
        return True, False
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    by_annotation = annotations.get(OPT_IN_ANNOTATION) == OPT_IN_VALUE
    return by_annotation, by_annotation


@dataclass(frozen=True)
class WorkerGPUs:
    """One worker pod on this node and the NVML indices of the GPUs it was allocated."""

    namespace: str
    name: str
    job: str
    stage: int
    replica: int
    gpus: tuple[int, ...]
    running: bool  # phase Running and no deletionTimestamp
    opted_in: bool  # its TrainingJob opted in (opt_in)
    mhz: int | None  # the plan's clock for (stage, replica); None = no clock known


@dataclass(frozen=True)
class Desired:
    """A GPU's clock and whose it is (the metric labels)."""

    mhz: int
    requested_mhz: int
    namespace: str
    job: str
    pod: str
    stage: int


@dataclass(frozen=True)
class Assignment:
    desired: dict[int, Desired]  # GPU index -> its clock
    lock: tuple[tuple[int, int], ...]  # (GPU index, MHz) to lock
    reset: tuple[int, ...]  # GPU indices to give back to the driver's default
    notes: tuple[str, ...] = field(default=())


def nearest_supported(mhz: int, supported: Sequence[int]) -> int:
    """The supported clock nearest to `mhz`; the higher one on a tie."""
    return min(supported, key=lambda level: (abs(level - mhz), -level))


def assign(
    workers: Sequence[WorkerGPUs],
    supported: Mapping[int, Sequence[int]],
    locked: Mapping[int, int],
) -> Assignment:
    """The clocks and the changes. `supported`: GPU index -> its supported SM clocks (a GPU
    missing here is not on this node). `locked`: GPU index -> the clock the agent locked it
    to earlier (GPUs the agent never locked are absent)."""
    desired: dict[int, Desired] = {}
    notes: list[str] = []
    for worker in sorted(workers, key=lambda w: (w.namespace, w.name)):
        if not (worker.running and worker.opted_in) or worker.mhz is None:
            continue
        where = f"{worker.namespace}/{worker.name}"
        for gpu in worker.gpus:
            levels = supported.get(gpu)
            if not levels:
                notes.append(f"{where}: GPU {gpu} is not on this node or lists no clocks")
                continue
            if gpu in desired:
                notes.append(f"{where}: GPU {gpu} is already {desired[gpu].pod}'s; left alone")
                continue
            mhz = nearest_supported(worker.mhz, levels)
            if mhz != worker.mhz:
                notes.append(
                    f"{where}: GPU {gpu} does not support {worker.mhz} MHz (stage "
                    f"{worker.stage}); locked to the nearest supported, {mhz} MHz"
                )
            desired[gpu] = Desired(
                mhz=mhz,
                requested_mhz=worker.mhz,
                namespace=worker.namespace,
                job=worker.job,
                pod=worker.name,
                stage=worker.stage,
            )
    lock = tuple((gpu, d.mhz) for gpu, d in sorted(desired.items()) if locked.get(gpu) != d.mhz)
    reset = tuple(sorted(gpu for gpu in locked if gpu not in desired))
    return Assignment(desired=desired, lock=lock, reset=reset, notes=tuple(notes))
