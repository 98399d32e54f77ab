"""`sailplan-profile model`: per-layer compute times of a model on this GPU type.

For each (TP degree, micro-batch size) of the grid it builds the embedding, a few
transformer blocks and the head for one TP rank (all blocks of a ModelSpec have the same
shape, so the measured block times are averaged and repeated for every block instead of
instantiating the whole model), and times forward, backward and the Adam update of each
layer, median over a few iterations after a warm-up. TP > 1 runs one process per TP rank
with real collectives (gloo on the CPU, NCCL on GPUs). A grid point that runs out of memory
is recorded as `ComputeProfile(oom=True)`, not raised. Output: ComputeProfile files in the
planner's profile-directory layout (planner/profiles/store.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.types import ComputeProfile
from sailplan.trainer.model import Head, StageModel
from sailplan.trainer.profilers.common import device_for, provenance, run_local, synchronize
from sailplan.trainer.tp import TPGroup


@dataclass(frozen=True)
class LayerTimes:
    forward_s: float
    backward_s: float
    update_s: float
    peak_memory_bytes: int


def _time_layer(
    layer: torch.nn.Module,
    make_input: Callable[[], torch.Tensor],
    targets: torch.Tensor | None,
    device: torch.device,
    iterations: int,
) -> LayerTimes:
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-4)
    forwards, backwards, updates = [], [], []
    peak = 0
    for iteration in range(iterations + 1):  # the first is a warm-up
        x = make_input()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        synchronize(device)
        t0 = time.perf_counter()
        out = layer(x, targets) if isinstance(layer, Head) else layer(x)
        synchronize(device)
        t1 = time.perf_counter()
        if isinstance(layer, Head):
            out.backward()
        else:
            out.backward(torch.ones_like(out))
        synchronize(device)
        t2 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        t3 = time.perf_counter()
        if device.type == "cuda":
            peak = max(peak, torch.cuda.max_memory_allocated(device) - base)
        if iteration > 0:
            forwards.append(t1 - t0)
            backwards.append(t2 - t1)
            updates.append(t3 - t2)
    return LayerTimes(
        statistics.median(forwards),
        statistics.median(backwards),
        statistics.median(updates),
        peak,
    )


def measure_point(
    *,
    rank: int,
    tp: int,
    device: torch.device,
    spec: ModelSpec,
    micro_batch_size: int,
    blocks: int,
    iterations: int,
) -> list[LayerTimes]:
    """Times of [embedding, block x blocks, head] on TP rank `rank` (collectives included)."""
    import torch.distributed as dist

    group = TPGroup(rank=rank, size=tp, group=dist.group.WORLD if tp > 1 else None)
    blocks = min(blocks, spec.num_blocks)
    last = spec.num_layers - 1
    indices = [0, *range(1, blocks + 1), last]
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(
        spec.vocab_size, (micro_batch_size, spec.sequence_length), generator=generator
    ).to(device)
    shape = (micro_batch_size, spec.sequence_length, spec.hidden_size)

    def hidden() -> torch.Tensor:
        return torch.randn(shape, device=device).requires_grad_()

    results = []
    for index in indices:
        stage = StageModel(spec, index, index + 1, group).to(device)
        layer = stage.layers[0]
        kind = spec.layer_kind(index)
        make_input = (lambda: tokens) if kind == "embedding" else hidden
        results.append(
            _time_layer(layer, make_input, tokens if kind == "head" else None, device, iterations)
        )
        del stage, layer
    return results


def _measure_on_rank(  # noqa: PLR0917 (called through run_local's positional protocol)
    rank: int,
    world: int,
    device: torch.device,
    spec: ModelSpec,
    micro_batch_size: int,
    blocks: int,
    iterations: int,
) -> list[LayerTimes] | None:
    try:
        return measure_point(
            rank=rank,
            tp=world,
            device=device,
            spec=spec,
            micro_batch_size=micro_batch_size,
            blocks=blocks,
            iterations=iterations,
        )
    except torch.cuda.OutOfMemoryError:  # the name every torch >= 2.4 has (newer: an alias)
        return None


def extrapolate(spec: ModelSpec, measured: list[LayerTimes]) -> list[LayerTimes]:
    """[embedding, b1..bk, head] -> one entry per model layer, blocks as the measured mean."""
    blocks = measured[1:-1]
    mean = LayerTimes(
        statistics.fmean(b.forward_s for b in blocks),
        statistics.fmean(b.backward_s for b in blocks),
        statistics.fmean(b.update_s for b in blocks),
        max(b.peak_memory_bytes for b in blocks),
    )
    return [measured[0], *([mean] * spec.num_blocks), measured[-1]]


Measure = Callable[[ModelSpec, int, int, int, int], list[LayerTimes] | None]


def measure_locally(
    spec: ModelSpec, tp: int, micro_batch_size: int, blocks: int, iterations: int
) -> list[LayerTimes] | None:
    """One grid point on `tp` local processes (TP 1: here); None when it ran out of memory."""
    if tp == 1:
        return _measure_on_rank(0, 1, device_for(0), spec, micro_batch_size, blocks, iterations)
    result: list[LayerTimes] | None = run_local(
        tp, _measure_on_rank, spec, micro_batch_size, blocks, iterations
    )
    return result


def profile_grid(
    spec: ModelSpec,
    gpu_type: str,
    tensor_parallel: list[int],
    micro_batch_sizes: list[int],
    *,
    blocks: int = 2,
    iterations: int = 3,
    measure: Measure = measure_locally,
) -> list[ComputeProfile]:
    if spec.architecture != "decoder":
        # it times a few blocks and extrapolates them to all: T5's blocks are of two kinds
        # and a convnet's change shape stage by stage, so those are planned on estimates
        raise ValueError(
            f"{spec.name}: the compute profiler measures decoder-only models; "
            f"{spec.architecture} models are planned on estimated profiles"
        )
    profiles = []
    for tp in tensor_parallel:
        if not spec.supports_tensor_parallel(tp):
            raise ValueError(f"{spec.name} cannot be split over TP {tp}")
        for mbs in micro_batch_sizes:
            measured = measure(spec, tp, mbs, blocks, iterations)
            origin = provenance(
                f"{min(blocks, spec.num_blocks)} blocks measured, rest extrapolated"
            )
            if measured is None:
                profiles.append(
                    ComputeProfile(
                        model=spec.name,
                        gpu_type=gpu_type,
                        tensor_parallel=tp,
                        micro_batch_size=mbs,
                        oom=True,
                        provenance=origin,
                    )
                )
                continue
            layers = extrapolate(spec, measured)
            memory = tuple(layer.peak_memory_bytes for layer in layers)
            profiles.append(
                ComputeProfile(
                    model=spec.name,
                    gpu_type=gpu_type,
                    tensor_parallel=tp,
                    micro_batch_size=mbs,
                    forward_s=tuple(layer.forward_s for layer in layers),
                    backward_s=tuple(layer.backward_s for layer in layers),
                    update_s=tuple(layer.update_s for layer in layers),
                    peak_memory_bytes=memory if any(memory) else (),
                    provenance=origin,
                )
            )
    return profiles
