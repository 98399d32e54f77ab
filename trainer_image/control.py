"""The one small all-reduce every rank makes after each step: stop flag, loss and energy.

One float64 host tensor per rank on the control gloo group (engine.build_groups), summed:
whether any rank was asked to stop (so all stop at the same step), the global mean loss
(each pipeline's last stage contributes its loss over the DP degree), and the GPU energy
of the step over the whole world (energy.StepEnergy's joules on every rank that measured,
and a count of those ranks: the sum is reported only when every rank measured, since a
partial sum would read as a plan that draws less than it does). One collective for all
three, so measuring energy adds no round trip. Called by engine.Trainer after every step;
the trainer tests call it across gloo processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class StepTotals:
    stop: bool  # some rank was asked to stop
    loss: float  # the global batch's mean loss
    joules: float | None  # GPU energy of the step over every rank; None unless all measured


def reduce_step(
    *, stopping: bool, loss_share: float, joules: float | None, group: Any, world_size: int
) -> StepTotals:
    """Sum this rank's part with every other rank's over `group` (`world_size` ranks)."""
    flags = torch.tensor(
        [
            1.0 if stopping else 0.0,
            loss_share,
            0.0 if joules is None else joules,
            0.0 if joules is None else 1.0,
        ],
        dtype=torch.float64,
    )
    dist.all_reduce(flags, group=group)
    measured = round(float(flags[3]))
    return StepTotals(
        stop=bool(flags[0] > 0),
        loss=float(flags[1]),
        joules=float(flags[2]) if measured == world_size else None,
    )
