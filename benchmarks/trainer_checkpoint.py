"""Checkpoint save and restore time and size for an OPT-350M-sized state on the CPU.

One rank (gloo, world of 1) holds the whole OPT-350M shape (26 layers, ~331M parameters)
with Adam moments, as the first rank of a one-stage plan would. Measured: the snapshot to
host memory (the only part that pauses training), the background write until the
checkpoint is complete (marker written), the restore (DCP read of every logical key and the
copy into the shards), and the bytes on disk. Restore is also timed at TP 2 rank 0 (reads
full tensors, keeps half) to show what resharding costs.

    python benchmarks/trainer_checkpoint.py [--dir /tmp/sailplan-ckpt-bench] [--blocks 24]
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

from sailplan.planner.modelspec import ModelSpec
from sailplan.trainer.checkpoint import Checkpointer, CheckpointStore, restore_state
from sailplan.trainer.model import StageModel
from sailplan.trainer.optimizer import ReplicatedOptimizer
from sailplan.trainer.tp import TPGroup


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _optimizer(model: StageModel) -> ReplicatedOptimizer:
    return ReplicatedOptimizer(
        list(model.parameters()), kind="adam", lr=1e-4, dp_group=None, dp_size=1
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/sailplan-ckpt-bench")
    parser.add_argument("--blocks", type=int, default=24, help="OPT-350M has 24")
    args = parser.parse_args()
    spec = ModelSpec(
        name="OPT-350M",
        family="opt",
        hidden_size=1024,
        num_blocks=args.blocks,
        num_heads=16,
        vocab_size=50272,
        sequence_length=2048,
    )
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(minutes=10),
    )
    group = dist.new_group([0], backend="gloo")
    model = StageModel(spec, 0, spec.num_layers)
    model.initialise(seed=0)
    optimizer = _optimizer(model)
    for param in model.parameters():  # populate the Adam moments as one step would
        param.grad = torch.zeros_like(param)
    optimizer.step()
    parameters = sum(p.numel() for p in model.parameters())

    store = CheckpointStore(str(root))
    checkpointer = Checkpointer(store, rank=0, process_group=group, keep=1)
    saves = []
    for step in (1, 2):  # the second save reuses the host buffers, as every later one does
        began = time.perf_counter()
        checkpointer.save(
            step,
            model=model,
            optimizer=optimizer,
            tp=TPGroup(),
            tp_root=0,
            saves_parameters=True,
            marker={"step": step, "optimizer_moments": True},
        )
        returned_s = time.perf_counter() - began
        checkpointer.wait()
        saves.append(
            (checkpointer.last_snapshot_seconds or 0.0, returned_s, time.perf_counter() - began)
        )
    size = sum(f.stat().st_size for f in (root / "step-000000002").iterdir())
    info = store.latest()
    assert info is not None and info.step == 2

    restores = []
    for tp in (TPGroup(), TPGroup(rank=0, size=2)):
        target = StageModel(spec, 0, spec.num_layers, tp)
        target_optimizer = _optimizer(target)
        began = time.perf_counter()
        restore_state(
            store=store,
            info=info,
            model=target,
            optimizer=target_optimizer,
            tp=tp,
            process_group=group,
        )
        restores.append(time.perf_counter() - began)
        del target, target_optimizer
    dist.destroy_process_group()

    print(
        f"{spec.name} shape, {spec.num_layers} layers, {parameters / 1e6:.1f} M parameters, "
        f"fp32 weights + Adam moments, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"{'measure':<44} {'value':>12}")
    rows = []
    for label, (snapshot_s, returned_s, complete_s) in zip(("first", "later"), saves, strict=True):
        rows += [
            (f"{label} save: snapshot (training paused), s", f"{snapshot_s:.2f}"),
            (f"{label} save: save() returned, s", f"{returned_s:.2f}"),
            (f"{label} save: complete (data + marker), s", f"{complete_s:.2f}"),
        ]
    write_s = saves[1][2] - saves[1][0]
    rows += [
        ("size on disk, GB", f"{size / 1e9:.2f}"),
        ("background write throughput, GB/s", f"{size / 1e9 / write_s:.2f}"),
        ("restore same layout (TP 1), s", f"{restores[0]:.2f}"),
        ("restore resharded (TP 2, rank 0), s", f"{restores[1]:.2f}"),
    ]
    for name, value in rows:
        print(f"{name:<44} {value:>12}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
