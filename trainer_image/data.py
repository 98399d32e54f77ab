"""Training samples addressed by global index, so any plan and any resume see the same data.

A sample is `sequence_length + 1` tokens (inputs and the shifted targets). Step `s` of a
global batch `G` consumes samples `[s*G, (s+1)*G)`; pipeline `r` takes the r-th slice of
`micro_batch_size * num_micro_batches` of them, micro-batch `m` the m-th slice of that. The
data position in a checkpoint is therefore just the step, and a resumed run under a
different plan reads exactly the samples the uninterrupted run would have read.

Two sources: a synthetic stream (a pure function of seed and index: each sample is an
arithmetic progression modulo the vocabulary with a random start and stride, plus sparse
noise, so the loss has somewhere to go) and a memory-mapped token file (numpy memmap of
uint16/uint32 tokens; sample i is the window starting at i * sequence_length, wrapping).
Called by the pipeline schedule (first stage: inputs; last stage: targets).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from sailplan.planner.workerenv import DataConfig

_STRIDES = 7
_NOISE = 0.05


class TokenSource(Protocol):
    def sample(self, index: int) -> np.ndarray: ...


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


class TokenFile:
    """A flat binary file of tokens, memory-mapped (uint16 if the vocabulary fits, else uint32)."""

    def __init__(self, path: str | Path, vocab_size: int, sequence_length: int) -> None:
        dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
        self.tokens = np.memmap(path, dtype=dtype, mode="r")
        self.length = sequence_length + 1
        self.stride = sequence_length
        if len(self.tokens) < self.length:
            raise ValueError(f"{path}: {len(self.tokens)} tokens, fewer than one sample")
        self.windows = (len(self.tokens) - self.length) // self.stride + 1

    def sample(self, index: int) -> np.ndarray:
        start = (index % self.windows) * self.stride
        return np.asarray(self.tokens[start : start + self.length], dtype=np.int64)


def make_source(config: DataConfig, vocab_size: int, sequence_length: int) -> TokenSource:
    if config.kind == "token-file":
        return TokenFile(config.path, vocab_size, sequence_length)
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
