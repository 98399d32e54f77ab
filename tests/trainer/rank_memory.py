"""One trainer stage per gloo process, and the bytes of the tensors it holds.

The memory and ZeRO tests (test_memory_model.py, test_memory_options_accounting.py,
test_zero_optimizer.py) each start two processes that build the trainer's stage
(StageModel + make_optimizer: DeepSpeed's ZeRO optimizer with the trainer's arguments),
train it a few micro-batches and write a JSON report per rank; this module is what they
share: the probe model, the process start, the stage and its training loop, and the
byte counts (storages deduplicated, so views and flat buffers count once).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from forked_workers import forkserver_context
from torch.utils._pytree import tree_flatten

from sailplan.planner.modelspec import ModelSpec

# the stage whose model states the memory tests measure: 660k parameters, so with the
# 2**16-element bucket below the model states, not the buckets, dominate
SPEC = ModelSpec(
    name="memory-probe",
    family="opt",
    hidden_size=128,
    num_blocks=2,
    num_heads=4,
    vocab_size=1024,
    sequence_length=16,
)
REPLICAS = 2
MICRO_BATCHES = 2
MICRO_BATCH_SIZE = 2
# the trainer's 2**24 would be 64 MiB, larger than the whole probe model
BUCKET_ELEMENTS = 2**16
# DeepSpeed pads each flat buffer to a multiple of nccl_start_alignment_factor (2) x DP
PADDING_ELEMENTS = 2 * REPLICAS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def spawn(
    replica: Callable[..., None], tmp: Path, *args: Any, nprocs: int = REPLICAS
) -> list[dict[str, Any]]:
    """Run `replica(rank, port, *args, tmp)` in `nprocs` processes, forked from the server
    that has imported torch and DeepSpeed once (forked_workers.py); their reports."""
    forkserver_context()  # sets what the (shared) forkserver preloads before its first start
    mp.start_processes(
        replica, args=(free_port(), *args, tmp), nprocs=nprocs, start_method="forkserver"
    )
    return [json.loads((tmp / f"rank-{r}.json").read_text()) for r in range(nprocs)]


def write_report(tmp: Path, rank: int, values: dict[str, Any]) -> None:
    (tmp / f"rank-{rank}.json").write_text(json.dumps(values))


def join(rank: int, port: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=REPLICAS
    )


def leave() -> None:
    """Leave the process group once every rank is done with it: a rank that tore its gloo
    connections down while its peer was still in a collective made that peer's process
    abort ("terminate called without an active exception") about one run in three of the
    offload tests under load. Bounded, so a rank that failed does not leave the other
    waiting for it."""
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=60))
    finally:
        dist.destroy_process_group()


def stage(
    spec: ModelSpec,
    layers: tuple[int, int],
    *,
    zero_stage: int,
    dtype: torch.dtype = torch.float32,
    offload: bool = False,
    micro_batches: int = MICRO_BATCHES,
    bucket_elements: int | None = BUCKET_ELEMENTS,
    seed: int = 1,
    lr: float = 1e-3,
) -> tuple[Any, list[torch.nn.Parameter], Any]:
    """The trainer's stage of `layers` on this rank (parameters in `dtype`) and its optimizer
    over a DP group of every rank; the process group must be joined."""
    from sailplan.trainer import zero
    from sailplan.trainer.model import StageModel
    from sailplan.trainer.optimizer import make_optimizer
    from sailplan.trainer.tp import TPGroup

    if bucket_elements is not None:
        zero.BUCKET_ELEMENTS = bucket_elements
    model = StageModel(spec, layers[0], layers[1], TPGroup(rank=0, size=1, group=None))
    model.initialise(seed=seed)
    model.to(dtype=dtype)
    params = list(model.parameters())
    optimizer = make_optimizer(
        params,
        kind="adam",
        lr=lr,
        zero_stage=zero_stage,
        dp_group=dist.new_group(list(range(REPLICAS))),
        dp_size=REPLICAS,
        tp_group=None,
        num_micro_batches=micro_batches,
        offload=offload,
    )
    return model, params, optimizer


def train(
    model: Any,
    optimizer: Any,
    rank: int,
    *,
    steps: int = 2,
    after_micro: Callable[[], None] = lambda: None,
    before_step: Callable[[], None] = lambda: None,
    after_step: Callable[[], None] = lambda: None,
) -> None:
    """`steps` steps of MICRO_BATCHES micro-batches of seeded tokens (whole model, inputs
    as targets), the callbacks where the tests measure."""
    for step in range(steps):
        for micro in range(MICRO_BATCHES):
            generator = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
            tokens = torch.randint(
                0,
                model.spec.vocab_size,
                (MICRO_BATCH_SIZE, model.spec.sequence_length),
                generator=generator,
            )
            model(None, {"inputs": tokens, "targets": tokens}).backward()
            optimizer.after_backward(micro)
            after_micro()
        before_step()
        optimizer.step()
        after_step()


def tensor_bytes(tensors: Any) -> int:
    """Bytes of the storages of the tensors in a (nested) container, each storage once."""
    seen: dict[int, int] = {}
    for t in tree_flatten(tensors)[0]:
        if isinstance(t, torch.Tensor) and not t.is_meta:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _storages(obj: Any, out: dict[int, int], visited: set[int]) -> None:
    """Bytes of every storage reachable from obj, keyed by storage address."""
    if id(obj) in visited:
        return
    visited.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.is_meta:  # DeepSpeed's shape records hold no memory
            return
        storage = obj.untyped_storage()
        if storage.nbytes():
            out[storage.data_ptr()] = storage.nbytes()
        if obj.grad is not None:
            _storages(obj.grad, out, visited)
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            _storages(key, out, visited)
            _storages(value, out, visited)
        return
    if isinstance(obj, list | tuple | set):
        for value in obj:
            _storages(value, out, visited)
        return
    if type(obj).__module__.startswith(("deepspeed", "torch.optim", "sailplan")):
        for value in getattr(obj, "__dict__", {}).values():
            _storages(value, out, visited)


def held_bytes(*objs: Any) -> int:
    """Bytes of every storage reachable from `objs`: tensors, their .grad, containers and
    the attributes of DeepSpeed's, torch.optim's and the trainer's objects."""
    out: dict[int, int] = {}
    _storages(list(objs), out, set())
    return sum(out.values())
