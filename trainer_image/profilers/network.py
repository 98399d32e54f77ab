"""`sailplan-profile network`: point-to-point bandwidth between two ranks, fitted.

Rank 0 and rank 1 ping-pong messages of each size (64 KiB .. 1 GiB by default; one-way time
= round trip / 2, median of a few repetitions after a warm-up), and the achieved bandwidth
is fitted as a quadratic in log2(message MB), Sailor's BandwidthCurve form, with numpy's
least squares. The two ranks are two local processes (intra-node, or a test) or two pods on
the link class being profiled (MASTER_ADDR/MASTER_PORT/RANK set by the profiling Job).
Output: a NetworkProfile file in the planner's profile-directory layout.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from sailplan.planner.profiles.types import BandwidthCurve, LinkClass, NetworkProfile
from sailplan.trainer.profilers.common import provenance, run_local, synchronize

KIB = 1024
DEFAULT_SIZES = tuple(64 * KIB * 4**i for i in range(9))  # 64 KiB .. 4 GiB, cut to 1 GiB below


def default_sizes(max_bytes: int = 2**30) -> list[int]:
    return [s for s in DEFAULT_SIZES if s <= max_bytes]


def ping_pong(
    rank: int, world: int, device: torch.device, sizes: list[int], repeats: int
) -> list[tuple[int, float]]:
    """(bytes, one-way seconds) per size, measured between ranks 0 and 1."""
    if world != 2:
        raise ValueError("the network profiler runs on exactly two ranks")
    peer = 1 - rank
    results = []
    for size in sizes:
        buffer = torch.empty(size, dtype=torch.uint8, device=device)
        times = []
        for repeat in range(repeats + 1):
            dist.barrier()
            synchronize(device)
            began = time.perf_counter()
            if rank == 0:
                dist.send(buffer, peer)
                dist.recv(buffer, peer)
            else:
                dist.recv(buffer, peer)
                dist.send(buffer, peer)
            synchronize(device)
            if repeat > 0:
                times.append((time.perf_counter() - began) / 2)
        results.append((size, statistics.median(times)))
        del buffer
    return results


def fit_curve(measurements: list[tuple[int, float]]) -> BandwidthCurve:
    """Least-squares quadratic of bandwidth (GB/s) in log2(message MB), clamped to what was seen."""
    if len(measurements) < 3:
        raise ValueError("a quadratic fit needs at least three message sizes")
    sizes = np.array([m[0] for m in measurements], dtype=np.float64)
    seconds = np.array([m[1] for m in measurements], dtype=np.float64)
    bandwidth = sizes / seconds
    x = np.log2(sizes / 1e6)
    c0, c1, c2 = np.polyfit(x, bandwidth / 1e9, 2)
    return BandwidthCurve(
        coefficients=(float(c0), float(c1), float(c2)),
        max_bytes_per_s=float(bandwidth.max()),
        min_bytes_per_s=float(bandwidth.min()),
    )


def profile_link(
    link: LinkClass,
    measurements: list[tuple[int, float]],
    gpu_type: str = "",
    peer_gpu_type: str = "",
    gpus_per_node: int = 0,
) -> NetworkProfile:
    sizes = f"{measurements[0][0]}..{measurements[-1][0]} bytes, {len(measurements)} sizes"
    return NetworkProfile(
        link=link,
        gpu_type=gpu_type,
        peer_gpu_type=peer_gpu_type,
        gpus_per_node=gpus_per_node,
        curve=fit_curve(measurements),
        provenance=provenance(f"send/recv ping-pong, {sizes}"),
    )


def measure_locally(sizes: list[int], repeats: int) -> list[tuple[int, float]]:
    result: list[tuple[int, float]] = run_local(2, ping_pong, sizes, repeats)
    return result
