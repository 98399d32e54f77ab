"""Mixed precision of one rank: autocast in the plan's precision and fp16's dynamic loss scale.

Forward and backward run under torch.autocast in bf16 or fp16: matrix products in half
precision, softmax, norms and the loss in fp32 (autocast's own op lists decide). The
planner picks the precision per plan (planner/precision.py: bf16 where every GPU type has
it, else fp16). The optimizer always updates fp32 master weights, so an update never rounds
to half precision; the parameters are either those fp32 weights themselves, or, with
`Plan.half_parameters` (DeepSpeed's and Megatron's bf16/fp16 mode), 16-bit copies the
optimizer writes back after each update (sailplan.trainer.optimizer and .zero keep the
masters: a copy per parameter, or DeepSpeed's fp32 partition).

bf16 has fp32's exponent range and needs no scaling. fp16 ends at 65504 and loses
gradients below 6e-8, so its loss is multiplied by a scale S before the backward (a
forward hook on the stage model scales the loss the last stage returns) and every
parameter's gradient is divided by S as the backward delivers it (a tensor hook on the
parameter, which runs before the gradient accumulates or reaches DeepSpeed), which also
records whether any was inf or NaN. With 16-bit parameters the gradient itself is fp16, so
dividing it there would flush the small gradients the scale exists to keep: the hook only
checks, and the optimizer divides by S after converting to fp32 (`StageOptimizer.step`'s
`grad_scale`; DeepSpeed's own unscale of its fp32 partition, as its fp16 mode does). The ranks agree on that flag over the control group;
with an overflow anywhere every rank skips the step and S halves, and after
`GROWTH_INTERVAL` clean steps S doubles: DeepSpeed's dynamic loss scaler
(deepspeed/runtime/fp16/loss_scaler.py; config keys fp16.initial_scale_power 16,
fp16.loss_scale_window 1000, min_loss_scale 1). Called by the engine.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import torch
import torch.distributed as dist

Precision = Literal["fp32", "bf16", "fp16"]

INITIAL_SCALE = 2.0**16  # DeepSpeed fp16.initial_scale_power: 16
GROWTH_INTERVAL = 1000  # DeepSpeed fp16.loss_scale_window: 1000
MIN_SCALE = 1.0  # DeepSpeed fp16.min_loss_scale: 1
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parameter_dtype(precision: Precision, half_parameters: bool) -> torch.dtype:
    """The dtype of the parameters, gradients and boundary tensors (Plan.parameter_dtype)."""
    if half_parameters and precision != "fp32":
        return DTYPES[precision]
    return torch.float32


def effective_precision(
    planned: Precision, mixed_precision: bool, device: torch.device
) -> Precision:
    """The plan's precision; an fp32 plan keeps TrainerConfig.mixed_precision's older
    meaning (bf16 autocast on CUDA)."""
    if planned == "fp32" and mixed_precision and device.type == "cuda":
        return "bf16"
    return planned


class LossScale:
    """The dynamic loss scale: halve on an overflow, double after GROWTH_INTERVAL clean steps."""

    def __init__(self, initial: float = INITIAL_SCALE, growth_interval: int = GROWTH_INTERVAL):
        self.value = initial
        self.growth_interval = growth_interval
        self.clean_steps = 0

    def update(self, overflow: bool) -> None:
        if overflow:
            self.value = max(MIN_SCALE, self.value / 2)
            self.clean_steps = 0
            return
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.value *= 2
            self.clean_steps = 0


class MixedPrecision:
    """Autocast context and, for fp16, the loss scale of one rank.

    `unscale_in_hooks`: divide each gradient by the scale as it is delivered (fp32
    parameters); False leaves the gradients scaled for the optimizer to divide in fp32
    (16-bit parameters), `grad_scale` says by how much."""

    def __init__(
        self,
        precision: Precision,
        device: torch.device,
        params: list[torch.nn.Parameter],
        model: torch.nn.Module,
        *,
        unscale_in_hooks: bool = True,
    ) -> None:
        self.precision = precision
        self.device = device
        self.unscale_in_hooks = unscale_in_hooks
        self.scale = LossScale() if precision == "fp16" else None
        self._finite = torch.ones((), dtype=torch.bool, device=device)
        if self.scale is not None:
            model.register_forward_hook(self._scale_loss)
            for param in params:
                param.register_hook(self._unscale)  # type: ignore[no-untyped-call]

    @property
    def loss_scale(self) -> float:
        return self.scale.value if self.scale is not None else 1.0

    @property
    def grad_scale(self) -> float:
        """What the gradients the optimizer receives are still multiplied by."""
        return 1.0 if self.unscale_in_hooks else self.loss_scale

    def autocast(self) -> contextlib.AbstractContextManager[Any] | None:
        if self.precision == "fp32":
            return None
        return torch.autocast(device_type=self.device.type, dtype=DTYPES[self.precision])

    def _scale_loss(self, module: torch.nn.Module, args: Any, output: Any) -> Any:
        # the last stage returns the loss (a 0-d tensor); other stages their hidden states
        if isinstance(output, torch.Tensor) and output.dim() == 0:
            return output * self.loss_scale
        return None

    def _unscale(self, grad: torch.Tensor) -> torch.Tensor | None:
        # on the device, without a host sync per tensor
        self._finite = self._finite & torch.isfinite(grad).all()
        return grad * (1.0 / self.loss_scale) if self.unscale_in_hooks else None

    def step_ok(self, control_group: Any) -> bool:
        """Whether every rank's gradients are finite (fp16; always True otherwise).

        Collective over `control_group` (the world) under fp16: every rank calls it once
        per step, in the same place."""
        if self.scale is None:
            return True
        overflow = torch.tensor([0.0 if bool(self._finite) else 1.0])
        dist.all_reduce(overflow, op=dist.ReduceOp.MAX, group=control_group)
        self._finite = torch.ones((), dtype=torch.bool, device=self.device)
        skipped = bool(overflow.item() > 0)
        self.scale.update(skipped)
        return not skipped
