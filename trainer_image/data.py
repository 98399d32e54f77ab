"""Training samples addressed by global index, so any plan and any resume see the same data.

A sample is `sequence_length + 1` tokens (inputs and the shifted targets). Step `s` of a
global batch `G` consumes samples `[s*G, (s+1)*G)`; pipeline `r` takes the r-th slice of
`micro_batch_size * num_micro_batches` of them, micro-batch `m` the m-th slice of that. The
data position in a checkpoint is therefore just the step, and a resumed run under a
different plan reads exactly the samples the uninterrupted run would have read.

With pipeline_micro_batches (an uneven split) pipeline r takes
`micro_batch_size * plan.micro_batches_of(r)` samples from `plan.first_sample_of(r)`.

Two sources: a synthetic stream (a pure function of seed and index: each sample is an
arithmetic progression modulo the vocabulary with a random start and stride, plus sparse
noise, so the loss has somewhere to go) and a token file at any fsspec URL, read by byte
ranges in a seeded order (sailplan.trainer.tokenfile). StepBatches reads one step's samples
of one replica at once, on a prefetch thread (sailplan.trainer.prefetch); the engine's
micro-batch function slices it for the pipeline schedule (first stage: inputs; last stage:
targets; middle stages read nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from sailplan.planner.plan import Plan
from sailplan.planner.workerenv import DataConfig
from sailplan.trainer.prefetch import Prefetcher
from sailplan.trainer.tokenfile import FsspecTokens

_STRIDES = 7
_NOISE = 0.05


class TokenSource(Protocol):
    def sample(self, index: int) -> np.ndarray: ...

    def read(self, indices: Sequence[int]) -> np.ndarray: ...


class SyntheticTokens:
    def __init__(self, vocab_size: int, sequence_length: int, seed: int) -> None:
        self.vocab_size = vocab_size
        self.length = sequence_length + 1
        self.seed = seed

    def sample(self, index: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64([self.seed, index]))
        start = int(rng.integers(self.vocab_size))
        stride = int(rng.integers(1, _STRIDES + 1))
        tokens = (start + stride * np.arange(self.length, dtype=np.int64)) % self.vocab_size
        noisy = rng.random(self.length) < _NOISE
        tokens[noisy] = rng.integers(self.vocab_size, size=int(noisy.sum()))
        return tokens

    def read(self, indices: Sequence[int]) -> np.ndarray:
        return np.stack([self.sample(i) for i in indices]).reshape(len(indices), self.length)


def make_source(config: DataConfig, vocab_size: int, sequence_length: int) -> TokenSource:
    if config.kind == "token-file":
        return FsspecTokens(config.path, vocab_size, sequence_length, config.seed)
    return SyntheticTokens(vocab_size, sequence_length, config.seed)


def micro_batch(
    source: TokenSource,
    *,
    step: int,
    replica: int,
    micro: int,
    micro_batch_size: int,
    num_micro_batches: int,
    global_batch_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each [micro_batch_size, sequence_length] int64."""
    first = (
        step * global_batch_size
        + replica * micro_batch_size * num_micro_batches
        + micro * micro_batch_size
    )
    rows = np.stack([source.sample(first + i) for i in range(micro_batch_size)])
    batch = torch.from_numpy(rows)
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()


def replica_samples(plan: Plan, step: int, replica: int) -> range:
    """The global sample indices pipeline `replica` trains on at `step`."""
    first = step * plan.global_batch_size + plan.first_sample_of(replica)
    return range(first, first + plan.micro_batch_size * plan.micro_batches_of(replica))


class StepBatches:
    """One replica's samples per step, read `depth` steps ahead on a background thread."""

    def __init__(
        self, source: TokenSource, plan: Plan, replica: int, *, first: int, last: int, depth: int
    ) -> None:
        self.plan, self.replica = plan, replica
        self.source = source  # before the thread starts: it reads it
        self.prefetch: Prefetcher[np.ndarray] = Prefetcher(self._fetch, first, last, depth)

    def _fetch(self, step: int) -> np.ndarray:
        return self.source.read(replica_samples(self.plan, step, self.replica))

    def step(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The step's micro-batches as (inputs, targets), [micro_batch_size, seq] int64."""
        rows = torch.from_numpy(self.prefetch.get(step))
        size = self.plan.micro_batch_size
        return [
            (rows[m : m + size, :-1].contiguous(), rows[m : m + size, 1:].contiguous())
            for m in range(0, rows.shape[0], size)
        ]

    def close(self) -> None:
        self.prefetch.close()
