"""Megatron-style tensor parallelism: the collectives with their gradients, and the layers.

A stage's TP group splits every large matrix: column-parallel layers split the output
features (QKV, MLP up), row-parallel layers split the input features and all-reduce their
output (attention out, MLP down), the embedding and LM head split the vocabulary, and the
cross-entropy is computed on vocabulary shards without gathering the logits. The two
conjugate operators of the Megatron paper carry the gradients: `copy_to_tp` is the identity
forward and an all-reduce backward, `reduce_from_tp` the reverse.

With a TP group of size 1 every operator is the identity, so the same modules serve the
single-process reference. Called by sailplan.trainer.model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class TPGroup:
    """A tensor-parallel group as the layers see it."""

    rank: int = 0
    size: int = 1
    group: Any = None  # dist.ProcessGroup; None when size == 1

    def all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(tensor, op=op, group=self.group)
        return tensor


SINGLE = TPGroup()


@dataclass(frozen=True)
class Split:
    """How a parameter maps onto its logical tensor: split along `dim`, of logical size `full`."""

    dim: int
    full: int


def shard_range(total: int, tp: TPGroup) -> tuple[int, int]:
    """This rank's [start, end) of `total` rows; the first total % size ranks get one more
    (a vocabulary such as GPT-2's 50257 does not divide by the TP degree)."""
    base, extra = divmod(total, tp.size)
    start = tp.rank * base + min(tp.rank, extra)
    return start, start + base + (1 if tp.rank < extra else 0)


def _shard_size(total: int, tp: TPGroup) -> int:
    start, end = shard_range(total, tp)
    return end - start


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        ctx.tp = tp
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.tp.all_reduce(grad.contiguous()), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        return tp.all_reduce(x.contiguous())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    if tp.size == 1:
        return x
    out: torch.Tensor = _CopyToTP.apply(x, tp)
    return out


def reduce_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    if tp.size == 1:
        return x
    out: torch.Tensor = _ReduceFromTP.apply(x, tp)
    return out


class ColumnParallelLinear(nn.Module):
    """y_local = x W_local^T + b_local: this rank's slice of the output features.

    The caller applies `copy_to_tp` once to an input shared by several column-parallel
    layers (Q, K and V; MLP gate and up), so the backward all-reduce runs once, not per layer.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        rows = _shard_size(out_features, tp)
        self.weight = nn.Parameter(torch.empty(rows, in_features))
        self.bias = nn.Parameter(torch.empty(rows)) if bias else None
        # how each parameter maps onto its logical tensor (checkpoint resharding)
        self.splits = {"weight": Split(0, out_features), "bias": Split(0, out_features)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local W_local^T) + b: the input features are split, bias replicated."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, _shard_size(in_features, tp)))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.splits = {"weight": Split(1, in_features)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp(nn.functional.linear(x, self.weight), self.tp)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a vocabulary slice; tokens outside it contribute zeros, then all-reduce."""

    def __init__(self, vocab_size: int, dim: int, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.start, self.end = shard_range(vocab_size, tp)
        self.weight = nn.Parameter(torch.empty(self.end - self.start, dim))
        self.splits = {"weight": Split(0, vocab_size)}

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return nn.functional.embedding(tokens, self.weight)
        outside = (tokens < self.start) | (tokens >= self.end)
        local = (tokens - self.start).masked_fill(outside, 0)
        out = nn.functional.embedding(local, self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.tp)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean token cross-entropy from vocabulary-sharded logits (Megatron's formulation)."""

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, targets: torch.Tensor, start: int, tp: TPGroup
    ) -> torch.Tensor:
        logits = logits.float()
        local_max = logits.max(dim=-1).values
        tp.all_reduce(local_max, op=dist.ReduceOp.MAX)
        shifted = logits - local_max.unsqueeze(-1)
        width = shifted.shape[-1]
        outside = (targets < start) | (targets >= start + width)
        local_targets = (targets - start).masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local_targets.unsqueeze(-1)).squeeze(-1)
        target_logit = target_logit.masked_fill(outside, 0.0)
        tp.all_reduce(target_logit)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        tp.all_reduce(sum_exp)
        loss = sum_exp.log() - target_logit
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, local_targets, outside)
        ctx.count = loss.numel()
        return loss.mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, local_targets, outside = ctx.saved_tensors
        grad_logits = softmax.clone()
        one_hot = (~outside).to(grad_logits.dtype)
        grad_logits.scatter_add_(-1, local_targets.unsqueeze(-1), -one_hot.unsqueeze(-1))
        grad_logits *= grad / ctx.count
        return grad_logits, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, start: int, tp: TPGroup
) -> torch.Tensor:
    loss: torch.Tensor = _VocabParallelCrossEntropy.apply(logits, targets, start, tp)
    return loss
