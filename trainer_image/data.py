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

Per model (make_samples, batch_fields): a decoder's sample is `sequence_length + 1` tokens
(inputs, and the same shifted by one as targets). A T5 sample is one window of
`sequence_length + target_length + 1` tokens: the encoder reads the first
`sequence_length`, the decoder continues the window (its inputs, and the same shifted by one
as targets), so the synthetic stream's progressions give the decoder something to learn
from the encoder; the stage of T5's first decoder block reads the decoder's inputs. A
convnet's sample is a synthetic labelled image (SyntheticImages), one float32 row: the label,
then the pixels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan
from sailplan.planner.workerenv import DataConfig
from sailplan.trainer.prefetch import Prefetcher
from sailplan.trainer.tokenfile import DataError, FsspecTokens

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


class SyntheticImages:
    """Labelled images, a pure function of (seed, index): each class has a fixed random
    pattern (from the seed and the label), a sample is its class's pattern plus as much
    Gaussian noise, and its label is drawn from the sample's own generator."""

    def __init__(self, spec: ModelSpec, seed: int) -> None:
        self.classes = spec.num_classes
        self.shape = (spec.image_channels, spec.image_size, spec.image_size)
        self.seed = seed

    def _pattern(self, label: int) -> np.ndarray:
        # a stream no sample index reaches (indices are below 2**62)
        rng = np.random.Generator(np.random.PCG64([self.seed, 2**62, label]))
        return rng.standard_normal(self.shape, dtype=np.float32)

    def sample(self, index: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64([self.seed, index]))
        label = int(rng.integers(self.classes))
        image = self._pattern(label) + rng.standard_normal(self.shape, dtype=np.float32)
        return np.concatenate([np.array([label], dtype=np.float32), image.ravel()])

    def read(self, indices: Sequence[int]) -> np.ndarray:
        return np.stack([self.sample(i) for i in indices])


def make_samples(config: DataConfig, spec: ModelSpec) -> TokenSource:
    """The sample source of a model (the module docstring says what a sample is)."""
    if spec.architecture == "convnet":
        if config.kind == "token-file":
            raise DataError(
                f"{spec.name} is a convnet: it trains on synthetic images, not a token file"
            )
        return SyntheticImages(spec, config.seed)
    length = spec.sequence_length
    if spec.architecture == "encoder-decoder":
        length += spec.target_length
    return make_source(config, spec.vocab_size, length)


Fields = Callable[[torch.Tensor], dict[str, torch.Tensor]]


def batch_fields(spec: ModelSpec) -> Fields:
    """Rows of samples -> the named tensors the model's layers read."""
    if spec.architecture == "convnet":
        shape = (spec.image_channels, spec.image_size, spec.image_size)
        return lambda rows: {
            "inputs": rows[:, 1:].reshape(rows.shape[0], *shape).contiguous(),
            "targets": rows[:, 0].long(),
        }
    if spec.architecture == "encoder-decoder":
        s = spec.sequence_length
        return lambda rows: {
            "inputs": rows[:, :s].contiguous(),
            "decoder_inputs": rows[:, s:-1].contiguous(),
            "targets": rows[:, s + 1 :].contiguous(),
        }
    return _token_fields


def _token_fields(rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """A decoder's sample: inputs, and the same shifted by one as targets."""
    return {"inputs": rows[:, :-1].contiguous(), "targets": rows[:, 1:].contiguous()}


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
        """A decoder's micro-batches as (inputs, targets), [micro_batch_size, seq] int64."""
        return [(m["inputs"], m["targets"]) for m in self.micro_batches(step, _token_fields)]

    def micro_batches(self, step: int, fields: Fields) -> list[dict[str, torch.Tensor]]:
        """The step's micro-batches as the named tensors `fields` makes of their rows."""
        rows = torch.from_numpy(self.prefetch.get(step))
        size = self.plan.micro_batch_size
        return [fields(rows[m : m + size]) for m in range(0, rows.shape[0], size)]

    def close(self) -> None:
        self.prefetch.close()
