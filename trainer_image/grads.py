"""Data-parallel gradient averaging among the replicas of one stage, in buckets.

Every rank of a stage replica holds the same parameter shards as the same TP rank of the
other replicas (possibly on another GPU type), so gradients are averaged over that DP group
after the pipeline's backwards are done. Gradients are flattened into buckets of about
`bucket_bytes` (one collective per bucket instead of one per tensor, bounded extra memory)
in a fixed parameter order, so every replica issues the same collectives in the same order.

torch's DistributedDataParallel is not used: whether it reduces is decided at forward time
(`no_sync`), while a 1F1B stage runs several forwards before their backwards, so its
reduction would fire during the wrong backward; a post-backward bucketed all-reduce is
simple and exact. Called by sailplan.trainer.optimizer once per step (zero_stage 0).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 25 * 2**20


def buckets(params: list[torch.nn.Parameter], bucket_bytes: int) -> list[list[torch.nn.Parameter]]:
    """Consecutive groups of same-dtype parameters of at most bucket_bytes (at least one each)."""
    groups: list[list[torch.nn.Parameter]] = []
    current: list[torch.nn.Parameter] = []
    size = 0
    for param in params:
        nbytes = param.numel() * param.element_size()
        if current and (size + nbytes > bucket_bytes or param.dtype != current[0].dtype):
            groups.append(current)
            current, size = [], 0
        current.append(param)
        size += nbytes
    if current:
        groups.append(current)
    return groups


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of `flat` shaped like `like`, in order."""
    out, offset = [], 0
    for tensor in like:
        n = tensor.numel()
        out.append(flat[offset : offset + n].view_as(tensor))
        offset += n
    return out


def all_reduce_gradients(
    params: list[torch.nn.Parameter],
    group: Any,
    group_size: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> None:
    """Average .grad over the DP group (parameters without a gradient count as zeros)."""
    if group_size == 1:
        return
    for bucket in buckets(params, bucket_bytes):
        grads = [
            p.grad
            if p.grad is not None
            else torch.zeros_like(p, memory_format=torch.contiguous_format)
            for p in bucket
        ]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        flat /= group_size
        offset = 0
        for param, grad in zip(bucket, grads, strict=True):
            n = grad.numel()
            param.grad = flat[offset : offset + n].view_as(param).clone()
            offset += n
