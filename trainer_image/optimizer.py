"""The optimizer step of one stage replica: what the engine and the checkpoint code call.

Two implementations behind one interface (`StageOptimizer`):

- `ReplicatedOptimizer` (zero_stage 0, or a stage with one replica): the bucketed DP
  all-reduce of sailplan.trainer.grads, then a torch optimizer on every replica, each
  holding all of the stage's optimizer state.
- `sailplan.trainer.zero.ZeroOptimizer` (zero_stage 1 or 2 with two or more replicas):
  DeepSpeed's ZeRO optimizer over the stage's DP group, each replica holding an even share
  of the state.

The interface is the engine's step (`after_backward` per micro-batch, `gradient` /
`set_gradient` for the tied-embedding sum, `step`) and the plan-independent checkpoint's
view of the state per logical parameter (`master`, `set_master`, `moments`, `set_moments`,
`restored`): whatever the sharding, a checkpoint holds each parameter's fp32 master value
and full moments, so a run under another plan, another ZeRO stage or other parameter
dtype resumes from it. `make_optimizer` picks the implementation.

16-bit parameters (Plan.half_parameters): the optimizer updates fp32 master weights and
writes them back rounded. The replicated optimizer keeps an fp32 copy of each parameter
and its Adam state on the copy; at the step it converts one gradient at a time to fp32,
frees the 16-bit one and updates that tensor, so no second full set of gradients exists
(simulator/memory.py's ZeRO-0 terms: 2P weights, 4P master, 8P Adam, 2P gradients).
DeepSpeed's ZeRO optimizer does the same on its own with its fp32 partition.
Called by the engine, the checkpoint code and the checkpoint benchmark.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from sailplan.trainer.grads import all_reduce_gradients

ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
MOMENT_KEYS = ("exp_avg", "exp_avg_sq")


def torch_optimizer(kind: str, params: list[Any], lr: float) -> torch.optim.Optimizer:
    """The update rule, shared by both implementations so they compute the same arithmetic."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    # foreach=False: the per-tensor loop is the same elementwise arithmetic whether it runs
    # over the model's tensors or over ZeRO's flat partition of them.
    return torch.optim.Adam(params, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, foreach=False)


class StageOptimizer(ABC):
    """Gradient averaging over the stage's DP group and the update of one rank's parameters."""

    @abstractmethod
    def after_backward(self, micro_batch: int) -> None:
        """Called after each micro-batch's backward (ZeRO-2 reduces gradients there)."""

    @abstractmethod
    def gradient(self, param: torch.nn.Parameter) -> torch.Tensor:
        """The parameter's accumulated gradient as it stands before `step`."""

    @abstractmethod
    def set_gradient(self, param: torch.nn.Parameter, grad: torch.Tensor) -> None:
        """Replace it (the tied-embedding sum); the same transformation on every replica."""

    @abstractmethod
    def step(self, grad_scale: float = 1.0) -> None:
        """Average the gradients over the DP group and update the parameters; the
        gradients are still multiplied by `grad_scale` (fp16's loss scale over 16-bit
        parameters), which the update divides out in fp32."""

    @abstractmethod
    def skip(self) -> None:
        """Drop this step's gradients without updating (an fp16 overflow on some rank)."""

    @abstractmethod
    def moments(self, param: torch.nn.Parameter) -> dict[str, torch.Tensor]:
        """The parameter's full Adam moments ({} before the first step, or for SGD).

        Collective over the DP group under ZeRO: every replica calls it for the same
        parameters in the same order."""

    @abstractmethod
    def set_moments(
        self, param: torch.nn.Parameter, step: int, moments: dict[str, torch.Tensor]
    ) -> None:
        """Restore the parameter's full moments (this rank keeps its share)."""

    @abstractmethod
    def master(self, param: torch.nn.Parameter) -> torch.Tensor:
        """The parameter's fp32 master value (the parameter itself when it is fp32).

        Collective over the DP group under ZeRO with 16-bit parameters, like `moments`."""

    @abstractmethod
    def set_master(self, param: torch.nn.Parameter, value: torch.Tensor) -> None:
        """Restore the parameter's fp32 master value (the parameter holds it rounded)."""

    @abstractmethod
    def restored(self) -> None:
        """Called after a checkpoint was copied into the parameters and moments."""

    @abstractmethod
    def state_bytes(self) -> int:
        """Bytes of optimizer state (moments) this rank holds."""


class ReplicatedOptimizer(StageOptimizer):
    """Every replica keeps all the state and applies the same update after an all-reduce."""

    def __init__(
        self, params: list[torch.nn.Parameter], *, kind: str, lr: float, dp_group: Any, dp_size: int
    ) -> None:
        self.params = params
        self.dp_group, self.dp_size = dp_group, dp_size
        # 16-bit parameters: the optimizer's own fp32 copies are what it updates
        self.half = any(p.dtype != torch.float32 for p in params)
        self.masters: dict[torch.nn.Parameter, torch.nn.Parameter] = {
            p: torch.nn.Parameter(p.detach().float()) if self.half else p for p in params
        }
        self.inner = torch_optimizer(kind, list(self.masters.values()), lr)

    def after_backward(self, micro_batch: int) -> None:
        pass  # gradients accumulate in .grad until the step's all-reduce

    def gradient(self, param: torch.nn.Parameter) -> torch.Tensor:
        return param.grad if param.grad is not None else torch.zeros_like(param)

    def set_gradient(self, param: torch.nn.Parameter, grad: torch.Tensor) -> None:
        param.grad = grad.to(param.dtype)

    def step(self, grad_scale: float = 1.0) -> None:
        all_reduce_gradients(self.params, self.dp_group, self.dp_size)
        if not self.half:
            if grad_scale != 1.0:
                for param in self.params:
                    if param.grad is not None:
                        param.grad.mul_(1.0 / grad_scale)
            self.inner.step()
            self.inner.zero_grad(set_to_none=True)
            return
        # one tensor at a time: its fp32 gradient, its update, the rounded write-back
        with torch.no_grad():
            for param, master in self.masters.items():
                if param.grad is None:
                    continue
                master.grad = param.grad.float().mul_(1.0 / grad_scale)
                param.grad = None
                self.inner.step()
                master.grad = None
                param.copy_(master)

    def skip(self) -> None:
        for param in self.params:
            param.grad = None
        self.inner.zero_grad(set_to_none=True)

    def master(self, param: torch.nn.Parameter) -> torch.Tensor:
        return self.masters[param].detach()

    def set_master(self, param: torch.nn.Parameter, value: torch.Tensor) -> None:
        with torch.no_grad():
            self.masters[param].copy_(value)
            param.copy_(value)

    def moments(self, param: torch.nn.Parameter) -> dict[str, torch.Tensor]:
        state = self.inner.state.get(self.masters[param], {})
        return {k: v for k, v in state.items() if k in MOMENT_KEYS}

    def set_moments(
        self, param: torch.nn.Parameter, step: int, moments: dict[str, torch.Tensor]
    ) -> None:
        self.inner.state[self.masters[param]] = {"step": torch.tensor(float(step)), **moments}

    def restored(self) -> None:
        pass  # the parameters, masters and the state were restored in place

    def state_bytes(self) -> int:
        return sum(
            value.numel() * value.element_size()
            for state in self.inner.state.values()
            for key, value in state.items()
            if key in MOMENT_KEYS
        )


def make_optimizer(
    params: list[torch.nn.Parameter],
    *,
    kind: str,
    lr: float,
    zero_stage: int,
    dp_group: Any,
    dp_size: int,
    tp_group: Any,
    num_micro_batches: int,
    offload: bool = False,
) -> StageOptimizer:
    """ZeRO (DeepSpeed) for zero_stage 1 or 2 when the stage has replicas to share the
    state with; the replicated optimizer otherwise (one replica has nothing to partition).
    `offload` (Stage.optimizer_offload): DeepSpeed's ZeRO with the optimizer state in host
    memory and CPU Adam, whatever the replicas (ZeRO-1 when zero_stage is 0: offload is
    part of DeepSpeed's ZeRO optimizer); dp_group is then a group even of one rank."""
    if not offload and (zero_stage == 0 or dp_size == 1):
        return ReplicatedOptimizer(params, kind=kind, lr=lr, dp_group=dp_group, dp_size=dp_size)
    from sailplan.trainer.zero import ZeroOptimizer

    return ZeroOptimizer(
        params,
        kind=kind,
        lr=lr,
        stage=max(zero_stage, 1),
        dp_group=dp_group,
        tp_group=tp_group,
        num_micro_batches=num_micro_batches,
        offload=offload,
    )
