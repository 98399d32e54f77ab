"""The optimizer step of one stage replica, plain or ZeRO stage 1 over the stage's DP group.

ZeRO-1 partitions the optimizer state: every parameter is owned by one rank of the DP group
(whole tensors, assigned greedily by size in parameter order, so every replica computes the
same assignment), only the owner keeps its Adam moments and updates it, and the updated
values are broadcast back. Gradients are reduced to the owner rather than all-reduced, so
the traffic (reduce + broadcast) equals one all-reduce while the moments take 1/DP of the
memory. With DP 1, or zero_stage 0, every rank keeps and updates everything after the
bucketed all-reduce of sailplan.trainer.grads.

Why not DeepSpeed's ZeRO: its engine owns the model, the data-parallel group and the
pipeline topology (one TP degree for all stages); here the DP group is per stage and per TP
rank, and the state must stay addressable per logical parameter for the plan-independent
checkpoint, which this owner map gives directly (checkpoint.py asks `owns` / `moments`).
Called by the engine.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sailplan.trainer.grads import all_reduce_gradients, buckets, flatten, unflatten

ADAM_BETAS = (0.9, 0.95)


def assign_owners(sizes: list[int], world: int) -> list[int]:
    """Owner DP rank per parameter: largest first onto the least-loaded rank (ties: lowest)."""
    load = [0] * world
    owners = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owners[index] = rank
        load[rank] += sizes[index]
    return owners


def _inner(kind: str, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    # foreach=False: the per-tensor loop is the same arithmetic for any grouping of tensors,
    # so the update does not depend on which rank owns what.
    return torch.optim.Adam(params, lr=lr, betas=ADAM_BETAS, eps=1e-8, foreach=False)


class StageOptimizer:
    """Gradient averaging and the update for one rank's parameters."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        *,
        kind: str,
        lr: float,
        dp_group: Any,
        dp_ranks: tuple[int, ...],
        dp_rank: int,
        zero: bool,
    ) -> None:
        self.params = params
        self.dp_group, self.dp_ranks, self.dp_rank = dp_group, dp_ranks, dp_rank
        self.dp_size = len(dp_ranks)
        self.zero = zero and self.dp_size > 1
        world = self.dp_size if self.zero else 1
        self.owners = assign_owners([p.numel() for p in params], world)
        if not self.zero:
            self.owners = [dp_rank] * len(params)
        self._position = {id(p): i for i, p in enumerate(params)}
        self.local = [p for p, o in zip(params, self.owners, strict=True) if o == dp_rank]
        self.inner = _inner(kind, self.local, lr)

    def owns(self, param: torch.nn.Parameter) -> bool:
        """Whether this rank keeps the parameter's optimizer state and updates it."""
        return self.owners[self._position[id(param)]] == self.dp_rank

    def saves_moments(self, param: torch.nn.Parameter) -> bool:
        """Whether this rank writes the parameter's moments into a checkpoint: the owner
        under ZeRO-1, replica 0 otherwise (every replica holds the same moments then)."""
        return self.owns(param) if self.zero else self.dp_rank == 0

    def moments(self, param: torch.nn.Parameter) -> dict[str, torch.Tensor]:
        state = self.inner.state.get(param, {})
        return {k: v for k, v in state.items() if k in ("exp_avg", "exp_avg_sq")}

    def set_moments(
        self, param: torch.nn.Parameter, step: int, moments: dict[str, torch.Tensor]
    ) -> None:
        self.inner.state[param] = {"step": torch.tensor(float(step)), **moments}

    def step(self) -> None:
        if not self.zero:
            all_reduce_gradients(self.params, self.dp_group, self.dp_size)
            self.inner.step()
            self.inner.zero_grad(set_to_none=True)
            return
        by_owner: list[list[torch.nn.Parameter]] = [[] for _ in range(self.dp_size)]
        for param, owner in zip(self.params, self.owners, strict=True):
            by_owner[owner].append(param)
        for owner, owned in enumerate(by_owner):
            for bucket in buckets(owned, 25 * 2**20):
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
                flat = flatten(grads)
                dist.reduce(flat, dst=self.dp_ranks[owner], group=self.dp_group)
                if owner == self.dp_rank:
                    flat /= self.dp_size
                    for param, grad in zip(bucket, unflatten(flat, grads), strict=True):
                        param.grad = grad
        self.inner.step()
        for param in self.params:
            param.grad = None
        with torch.no_grad():
            for owner, owned in enumerate(by_owner):
                for bucket in buckets(owned, 25 * 2**20):
                    flat = flatten([p.data for p in bucket])
                    dist.broadcast(flat, src=self.dp_ranks[owner], group=self.dp_group)
                    if owner != self.dp_rank:
                        for param, value in zip(
                            bucket,
                            unflatten(flat, [p.data for p in bucket]),
                            strict=True,
                        ):
                            param.copy_(value)
