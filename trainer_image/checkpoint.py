"""Plan-independent, complete-or-absent checkpoints on torch distributed checkpoint (DCP).

What is saved is the logical model, whatever layout wrote it: every parameter as its full,
unsharded tensor under `layers.<logical layer>.<name>`, the Adam moments under
`optim.exp_avg.<same key>` / `optim.exp_avg_sq.<same key>`, and in the marker the step (which
is also the data position: see sailplan.trainer.data), seed, model and plan generation. A
run under another plan asks DCP for the keys of its own layers and slices its TP shard, so
resharding across stage splits, TP and DP degrees is a key lookup.

Why DCP and not DeepSpeed's universal checkpoint: DCP is part of torch, de-duplicates keys
written by several ranks, lets each rank read only the keys it needs, writes through a
FileSystemWriter or fsspec, and its save is safe to run on a background thread over its own
process group, which gives "snapshot to host memory, write in the background" (see
Checkpointer). DeepSpeed's universal checkpoint is a post-hoc
conversion of the layout DeepSpeed's engine writes; the trainer uses DeepSpeed's ZeRO
optimizer only, without that engine, and reads its state per parameter instead.

Completeness: DCP writes `.metadata` only after every rank's data, and rank 0 then writes
`sailplan-complete.json` (write-to-temp then rename). Resume considers only directories with
that marker, so a save cut short by SIGKILL is never picked up; pruning keeps the newest
`keep` complete checkpoints and removes incomplete ones older than the newest complete,
each checkpoint's marker before its files, so a prune cut short leaves it incomplete.

Who writes: replica 0 of each stage gathers each TP-sharded parameter and its full moments
onto its TP rank 0 (on the host), which contributes them; under ZeRO every replica first
takes part in assembling the full moments from the replicas' shares
(sailplan.trainer.optimizer); identical copies elsewhere are not written.
Called by the engine (save/poll/restore) and the checkpoint benchmark.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
import torch.distributed as dist
from fsspec.core import url_to_fs
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter

from sailplan.trainer.model import (
    StageModel,
    local_shard,
    logical_shape,
    param_splits,
    shared_weight,
)
from sailplan.trainer.optimizer import StageOptimizer
from sailplan.trainer.tp import Split, TPGroup, shard_range

MARKER = "sailplan-complete.json"
FORMAT_VERSION = 1


def step_dirname(step: int) -> str:
    return f"step-{step:09d}"


def _parse_step(name: str) -> int | None:
    if not name.startswith("step-"):
        return None
    try:
        return int(name.removeprefix("step-"))
    except ValueError:
        return None


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: str
    marker: dict[str, Any]


class CheckpointStore:
    """A checkpoint root on a filesystem (a local/PVC path or an fsspec URL)."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.fs, self.fs_root = url_to_fs(self.root)
        self.is_local = isinstance(self.fs, fsspec.implementations.local.LocalFileSystem)

    def path(self, step: int) -> str:
        return f"{self.root}/{step_dirname(step)}"

    def _fs_path(self, step: int) -> str:
        return f"{self.fs_root}/{step_dirname(step)}"

    def _steps(self) -> list[tuple[int, str]]:
        if not self.fs.exists(self.fs_root):
            return []
        found = []
        for entry in self.fs.ls(self.fs_root, detail=False):
            step = _parse_step(str(entry).rstrip("/").rsplit("/", 1)[-1])
            if step is not None:
                found.append((step, str(entry)))
        return sorted(found)

    def complete(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest first."""
        infos = []
        for step, path in self._steps():
            marker_path = f"{path}/{MARKER}"
            if self.fs.exists(marker_path):
                with self.fs.open(marker_path, "r") as handle:
                    marker = json.load(handle)
                infos.append(CheckpointInfo(step=step, path=self.path(step), marker=marker))
        return infos

    def latest(self) -> CheckpointInfo | None:
        infos = self.complete()
        return infos[-1] if infos else None

    def mark_complete(self, step: int, marker: dict[str, Any]) -> None:
        final = f"{self._fs_path(step)}/{MARKER}"
        temporary = final + ".tmp"
        with self.fs.open(temporary, "w") as handle:
            json.dump(marker, handle, indent=2, sort_keys=True)
        self.fs.mv(temporary, final)

    def prune(self, keep: int) -> list[int]:
        """Delete all but the newest `keep` complete checkpoints, and stale incomplete ones."""
        complete = {info.step for info in self.complete()}
        if not complete:
            return []
        kept = sorted(complete)[-keep:]
        removed = []
        for step, path in self._steps():
            if step in kept or (step not in complete and step > max(complete)):
                continue  # keep the newest; an incomplete newer one may still be being written
            if step in complete:
                # The marker goes first: a process killed in the middle of the deletion
                # leaves an incomplete checkpoint, which is ignored, never one still marked
                # complete whose files are partly gone.
                self.fs.rm(f"{path}/{MARKER}")
            self.fs.rm(path, recursive=True)
            removed.append(step)
        return removed

    def writer(self, step: int) -> StorageWriter:
        if self.is_local:
            return FileSystemWriter(self._fs_path(step), thread_count=2)
        writer: StorageWriter = _fsspec_class("FsspecWriter")(self.path(step), thread_count=2)
        return writer

    def reader(self, step: int) -> StorageReader:
        if self.is_local:
            return FileSystemReader(self._fs_path(step))
        reader: StorageReader = _fsspec_class("FsspecReader")(self.path(step))
        return reader


def _fsspec_class(name: str) -> Any:
    # The package exports the fsspec storage classes in every torch this image supports,
    # while the module defining them was renamed (_fsspec_filesystem -> fsspec_filesystem).
    import torch.distributed.checkpoint as dcp

    return getattr(dcp, name)


def _param_keys(
    model: StageModel, *, with_tied_copy: bool = False
) -> Iterator[tuple[str, torch.nn.Parameter, Split | None]]:
    """(logical key, local parameter, split) for the stage's layers; its copies of shared
    modules owned by another stage's layer (a tied head's token matrix, T5's position
    bias tables) are read back on restore (`with_tied_copy`) but never written."""
    for index, layer in model.named_layers():
        splits = param_splits(layer)
        for name, param in layer.named_parameters():
            yield f"layers.{index}.{name}", param, splits[name]
    if with_tied_copy:
        for shared, copy in model.copies.items():
            owner, key = model.shared_key(shared)
            weight, split = shared_weight(copy)
            yield f"layers.{owner}.{key}", weight, split


def _host_buffer(buffers: dict[str, torch.Tensor], key: str, like: torch.Tensor) -> torch.Tensor:
    """A reusable host tensor for `key`: allocating (and page-faulting) gigabytes of fresh
    memory at every checkpoint costs more than the copy itself. Pinned when a GPU is
    present, so the device-to-host copy runs at full speed."""
    buffer = buffers.get(key)
    if buffer is None or buffer.shape != like.shape or buffer.dtype != like.dtype:
        buffer = torch.empty(like.shape, dtype=like.dtype, pin_memory=torch.cuda.is_available())
        buffers[key] = buffer
    return buffer


def gather_full(
    tensor: torch.Tensor, split: Split | None, tp: TPGroup, tp_root: int
) -> torch.Tensor | None:
    """The logical tensor on TP rank 0 (on the device), None on the other TP ranks.

    Shards may differ by one row (a vocabulary that does not divide by the TP degree); gather
    needs equal sizes, so every shard is padded to the largest and trimmed after."""
    if split is None or tp.size == 1:
        return tensor.detach() if tp.rank == 0 else None
    sizes = [shard_range(split.full, TPGroup(rank=r, size=tp.size)) for r in range(tp.size)]
    widest = max(end - start for start, end in sizes)
    local = tensor.detach()
    if local.shape[split.dim] < widest:
        pad_shape = list(local.shape)
        pad_shape[split.dim] = widest - local.shape[split.dim]
        local = torch.cat([local, local.new_zeros(pad_shape)], dim=split.dim)
    parts = [torch.empty_like(local) for _ in range(tp.size)] if tp.rank == 0 else None
    dist.gather(local.contiguous(), parts, dst=tp_root, group=tp.group)
    if parts is None:
        return None
    trimmed = [
        part.narrow(split.dim, 0, end - start)
        for part, (start, end) in zip(parts, sizes, strict=True)
    ]
    return torch.cat(trimmed, dim=split.dim)


def logical_state(
    model: StageModel,
    optimizer: StageOptimizer,
    tp: TPGroup,
    tp_root: int,
    *,
    saves_parameters: bool,
    buffers: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Host copies of this rank's part of the logical state.

    Parameters and moments come from replica 0 of the stage (`saves_parameters`); every
    replica asks for the moments (a collective over the DP group under ZeRO) and every TP
    rank of a replica makes the same choices, so the collectives pair up.
    """
    state: dict[str, torch.Tensor] = {}
    for key, param, split in _param_keys(model):
        # the fp32 master value, not a 16-bit parameter's rounding of it
        master = optimizer.master(param)
        moments = optimizer.moments(param)
        if not saves_parameters:
            continue
        tensors: dict[str, torch.Tensor] = {key: master}
        for moment, value in sorted(moments.items()):
            tensors[f"optim.{moment}.{key}"] = value
        for name, tensor in tensors.items():
            full = gather_full(tensor, split, tp, tp_root)
            if full is not None:
                state[name] = _host_buffer(buffers, name, full).copy_(full, non_blocking=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # the non-blocking copies must land before the writer reads
    return state


def restore_state(
    *,
    store: CheckpointStore,
    info: CheckpointInfo,
    model: StageModel,
    optimizer: StageOptimizer,
    tp: TPGroup,
    process_group: Any,
) -> None:
    """Load this rank's shards of the logical state written at `info` by any plan.

    Every rank reads the parameters of its layers and their full moments; the optimizer
    keeps its share of the moments.
    """
    with_moments = bool(info.marker.get("optimizer_moments"))
    wanted: dict[str, torch.Tensor] = {}
    for key, param, split in _param_keys(model, with_tied_copy=True):
        shape = logical_shape(param.shape, split)
        # parameters are saved as their fp32 master values (logical_state)
        wanted[key] = torch.empty(shape, dtype=torch.float32)
        if with_moments:
            for moment in ("exp_avg", "exp_avg_sq"):
                wanted[f"optim.{moment}.{key}"] = torch.empty(shape, dtype=torch.float32)
    dcp_load(wanted, storage_reader=store.reader(info.step), process_group=process_group)
    step = int(info.marker["step"])
    with torch.no_grad():
        for key, param, split in _param_keys(model, with_tied_copy=True):
            optimizer.set_master(param, local_shard(wanted[key], split, tp).to(param.device))
            if with_moments:
                moments = {
                    moment: local_shard(wanted[f"optim.{moment}.{key}"], split, tp)
                    .to(param.device)
                    .clone()
                    for moment in ("exp_avg", "exp_avg_sq")
                }
                optimizer.set_moments(param, step, moments)
    optimizer.restored()


@dataclass
class _Pending:
    step: int
    future: Future[Any]
    marker: dict[str, Any]
    started: float


class Checkpointer:
    """Per-rank driver: snapshot, background write, completion marker, pruning.

    The write runs `dcp.save` on a thread of its own over a dedicated gloo process group.
    `dcp.async_save` would do the same but first stages (copies) the state dict again; the
    state handed over here is already a private host copy in reused buffers.
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        rank: int,
        process_group: Any,
        keep: int,
    ) -> None:
        self.store = store
        self.rank = rank
        self.process_group = process_group
        self.keep = keep
        self.pending: _Pending | None = None
        self.last_complete: int | None = None
        self.last_snapshot_seconds: float | None = None
        self.last_save_seconds: float | None = None
        self.buffers: dict[str, torch.Tensor] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")

    def save(
        self,
        step: int,
        *,
        model: StageModel,
        optimizer: StageOptimizer,
        tp: TPGroup,
        tp_root: int,
        saves_parameters: bool,
        marker: dict[str, Any],
    ) -> None:
        """Snapshot this rank's part to host memory, then write it in the background.

        Every rank must call this at the same step. Training pauses only for the snapshot
        (and for the previous save, if it is still being written: its buffers are reused).
        """
        self.wait()
        began = time.monotonic()
        state = logical_state(
            model, optimizer, tp, tp_root, saves_parameters=saves_parameters, buffers=self.buffers
        )
        self.last_snapshot_seconds = time.monotonic() - began
        future = self._executor.submit(
            dcp_save,
            state,
            storage_writer=self.store.writer(step),
            process_group=self.process_group,
        )
        self.pending = _Pending(step=step, future=future, marker=marker, started=began)

    def poll(self) -> None:
        """Finish the pending save if its write is done (non-blocking)."""
        if self.pending is not None and self.pending.future.done():
            self._finish()

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.future.result()
            self._finish()

    def _finish(self) -> None:
        assert self.pending is not None
        pending, self.pending = self.pending, None
        pending.future.result()  # re-raises a failed write
        self.last_save_seconds = time.monotonic() - pending.started
        if self.rank == 0:
            self.store.mark_complete(pending.step, pending.marker)
            self.store.prune(self.keep)
        self.last_complete = pending.step
