"""What every profiler needs: provenance of the machine it ran on, and a local process group.

Provenance makes a measured profile traceable (GPU name, driver, torch version, date, tool
version); the planner prefers measured profiles and shows where they came from. The local
launcher starts `world` processes on this machine with a gloo (CPU) or NCCL (GPU) group,
used for TP > 1 compute profiling and for the network profiler's two ranks when both run
here. Called by sailplan.trainer.profilers.compute and .network.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import subprocess
from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch
import torch.distributed as dist

from sailplan.planner.profiles.types import Provenance

TOOL = "sailplan-profile"


def _driver() -> str:
    if not torch.cuda.is_available():
        return ""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


def provenance(note: str = "") -> Provenance:
    try:
        version = metadata.version("sailplan")
    except metadata.PackageNotFoundError:
        version = "unknown"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return Provenance(
        source="measured",
        tool=TOOL,
        tool_version=version,
        gpu_name=gpu,
        driver=_driver(),
        torch_version=torch.__version__,
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        note=note,
    )


def device_for(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def init_group(rank: int, world: int, addr: str, port: int) -> torch.device:
    # Ranks of a local test share one machine's GPUs; ranks in separate pods each see only
    # their own GPU (device 0). The modulo covers both.
    device = device_for(rank % torch.cuda.device_count() if torch.cuda.is_available() else 0)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(minutes=10),
    )
    return device


def _entry(  # noqa: PLR0917 (multiprocessing passes positional args)
    rank: int,
    world: int,
    addr: str,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    queue: Any,
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    device = init_group(rank, world, addr, port)
    try:
        result = fn(rank, world, device, *args)
        if rank == 0:
            queue.put(result)
    finally:
        dist.destroy_process_group()


def run_ranks(  # noqa: PLR0917 (a process group's coordinates)
    first_rank: int,
    local: int,
    world: int,
    addr: str,
    port: int,
    fn: Callable[..., Any],
    *args: Any,
) -> Any:
    """Run fn(rank, world, device, *args) as ranks first_rank .. first_rank + local - 1 of a
    `world`-rank group whose rank 0 listens on addr:port; return rank 0's result when rank 0
    runs here, else None. One pod of a multi-node profiling run starts its GPUs' ranks so."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [
        context.Process(target=_entry, args=(rank, world, addr, port, fn, args, queue))
        for rank in range(first_rank, first_rank + local)
    ]
    for process in processes:
        process.start()
    result = queue.get() if first_rank == 0 else None
    for process in processes:
        process.join()
    failed = [p.exitcode for p in processes if p.exitcode]
    if failed:
        raise RuntimeError(f"profiling processes failed with exit codes {failed}")
    return result


def run_local(world: int, fn: Callable[..., Any], *args: Any) -> Any:
    """Run fn(rank, world, device, *args) on `world` local processes; return rank 0's result."""
    return run_ranks(0, world, world, "127.0.0.1", free_port(), fn, *args)
