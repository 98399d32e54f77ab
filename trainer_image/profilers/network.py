"""`sailplan-profile network`: what the simulator's network model needs, measured and fitted.

The ranks are `nodes` x `per_node` processes (one per GPU): all local (intra-node, or a
test), or one pod per node of the link being profiled (MASTER_ADDR/MASTER_PORT/RANK set by
the profiling Job, RANK being the pod's node index). Ranks node * per_node + i run on node
`node`. For each message size (64 KiB .. 1 GiB by default; median of a few repetitions
after a warm-up) they measure:

- p2p: inside a node, rank 0 and rank 1 ping-pong (one-way time = round trip / 2); across
  nodes, rank 0 streams to the first rank of node 1 and back, timed per direction (a send
  and a one-byte acknowledgement), because links (and VM egress caps) need not be symmetric;
- concurrent (across nodes): every rank of node 0 sends to its counterpart on node 1 at
  once, then the reverse; the node's aggregate rate is per_node x bytes / the slowest flow's
  time, what the simulator's node NIC curve stands for when all the node's GPUs talk;
- allreduce: an all-reduce of each size over all ranks, as bus bandwidth
  2 (n - 1) / n x bytes / time (nccl-tests all_reduce_perf), the slowest rank's time.

Each series is fitted as a quadratic in log2(message MB), Sailor's BandwidthCurve form, with
numpy's least squares. Output: NetworkProfiles in the planner's profile-directory layout,
each with provenance (tool version, GPU, date, what was measured).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from sailplan.planner.profiles.types import (
    BandwidthCurve,
    LinkClass,
    Measure,
    NetworkProfile,
)
from sailplan.trainer.profilers.common import provenance, run_local, synchronize

KIB = 1024
DEFAULT_SIZES = tuple(64 * KIB * 4**i for i in range(9))  # 64 KiB .. 4 GiB, cut to 1 GiB below

# (message bytes, achieved bytes per second)
Rates = list[tuple[int, float]]


def default_sizes(max_bytes: int = 2**30) -> list[int]:
    return [s for s in DEFAULT_SIZES if s <= max_bytes]


def ping_pong(
    rank: int, world: int, device: torch.device, sizes: list[int], repeats: int
) -> list[tuple[int, float]]:
    """(bytes, one-way seconds) per size, measured between ranks 0 and 1."""
    if world != 2:
        raise ValueError("the network profiler runs on exactly two ranks")
    return _ping_pong_pair(rank, device, sizes, repeats, 0, 1)


def _ping_pong_pair(  # noqa: PLR0917 (a measurement's coordinates)
    rank: int, device: torch.device, sizes: list[int], repeats: int, first: int, second: int
) -> list[tuple[int, float]]:
    results = []
    for size in sizes:
        buffer = torch.empty(size, dtype=torch.uint8, device=device)
        times = []
        for repeat in range(repeats + 1):
            dist.barrier()
            synchronize(device)
            began = time.perf_counter()
            if rank == first:
                dist.send(buffer, second)
                dist.recv(buffer, second)
            elif rank == second:
                dist.recv(buffer, first)
                dist.send(buffer, first)
            synchronize(device)
            if repeat > 0:
                times.append((time.perf_counter() - began) / 2)
        results.append((size, statistics.median(times)))
        del buffer
    return results


def _slowest(seconds: float, device: torch.device) -> float:
    """The largest of every rank's `seconds` (a collective ends when its last rank does)."""
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def _timed_flows(  # noqa: PLR0917 (a measurement's coordinates)
    rank: int,
    device: torch.device,
    buffer: torch.Tensor,
    ack: torch.Tensor,
    pairs: dict[int, int],
    repeats: int,
) -> float:
    """Median over repeats of the slowest flow's time: senders (keys of `pairs`) send
    `buffer` to their receiver, which answers with a one-byte `ack` so the sender's clock
    covers delivery."""
    receivers = {dst: src for src, dst in pairs.items()}
    times = []
    for repeat in range(repeats + 1):
        dist.barrier()
        synchronize(device)
        began = time.perf_counter()
        if rank in pairs:
            dist.send(buffer, pairs[rank])
            dist.recv(ack, pairs[rank])
        elif rank in receivers:
            dist.recv(buffer, receivers[rank])
            dist.send(ack, receivers[rank])
        synchronize(device)
        elapsed = time.perf_counter() - began if rank in pairs else 0.0
        slowest = _slowest(elapsed, device)
        if repeat > 0:
            times.append(slowest)
    return statistics.median(times)


def _allreduce_busbw(rank: int, world: int, device: torch.device, size: int, repeats: int) -> float:
    """Bus bandwidth of an all-reduce of `size` bytes per rank over all `world` ranks."""
    del rank
    tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
    times = []
    for repeat in range(repeats + 1):
        dist.barrier()
        synchronize(device)
        began = time.perf_counter()
        dist.all_reduce(tensor)
        synchronize(device)
        slowest = _slowest(time.perf_counter() - began, device)
        if repeat > 0:
            times.append(slowest)
    return 2.0 * (world - 1) / world * size / statistics.median(times)


@dataclass
class Measurements:
    """Every series one profiling run measured (rank 0 returns it to the caller)."""

    nodes: int
    per_node: int
    p2p: Rates = field(default_factory=list)  # intra-node ping-pong
    forward: Rates = field(default_factory=list)  # node 0 -> node 1, one flow
    backward: Rates = field(default_factory=list)  # node 1 -> node 0, one flow
    concurrent_forward: Rates = field(default_factory=list)  # node aggregate, all flows
    concurrent_backward: Rates = field(default_factory=list)
    allreduce: Rates = field(default_factory=list)  # bus bandwidth


def measure_ranks(  # noqa: PLR0917 (called through run_ranks' positional protocol)
    rank: int,
    world: int,
    device: torch.device,
    sizes: list[int],
    repeats: int,
    per_node: int,
    measures: tuple[Measure, ...],
) -> Measurements:
    """One rank's part of every measurement `measures` asks for (the same on every rank)."""
    nodes = world // per_node
    found = Measurements(nodes=nodes, per_node=per_node)
    if "p2p" in measures and nodes == 1 and world >= 2:
        found.p2p = [(s, s / t) for s, t in _ping_pong_pair(rank, device, sizes, repeats, 0, 1)]
    for size in sizes:
        buffer = torch.empty(size, dtype=torch.uint8, device=device)
        ack = torch.zeros(1, dtype=torch.uint8, device=device)
        if nodes == 2 and "p2p" in measures:
            there = _timed_flows(rank, device, buffer, ack, {0: per_node}, repeats)
            back = _timed_flows(rank, device, buffer, ack, {per_node: 0}, repeats)
            found.forward.append((size, size / there))
            found.backward.append((size, size / back))
        if nodes == 2 and "concurrent" in measures:
            flows = {i: per_node + i for i in range(per_node)}
            there = _timed_flows(rank, device, buffer, ack, flows, repeats)
            back = _timed_flows(
                rank, device, buffer, ack, {v: k for k, v in flows.items()}, repeats
            )
            found.concurrent_forward.append((size, per_node * size / there))
            found.concurrent_backward.append((size, per_node * size / back))
        del buffer
        if "allreduce" in measures and world >= 2:
            found.allreduce.append((size, _allreduce_busbw(rank, world, device, size, repeats)))
    return found


def measure_locally(
    nodes: int, per_node: int, sizes: list[int], repeats: int, measures: tuple[Measure, ...]
) -> Measurements:
    """Every rank on this machine (intra-node profiling, or a test standing in for nodes)."""
    result: Measurements = run_local(
        nodes * per_node, measure_ranks, sizes, repeats, per_node, measures
    )
    return result


def fit_rates(rates: Rates) -> BandwidthCurve:
    """Least-squares quadratic of bandwidth (GB/s) in log2(message MB), clamped to what was seen."""
    if len(rates) < 3:
        raise ValueError("a quadratic fit needs at least three message sizes")
    sizes = np.array([r[0] for r in rates], dtype=np.float64)
    bandwidth = np.array([r[1] for r in rates], dtype=np.float64)
    x = np.log2(sizes / 1e6)
    c0, c1, c2 = np.polyfit(x, bandwidth / 1e9, 2)
    return BandwidthCurve(
        coefficients=(float(c0), float(c1), float(c2)),
        max_bytes_per_s=float(bandwidth.max()),
        min_bytes_per_s=float(bandwidth.min()),
    )


def fit_curve(measurements: list[tuple[int, float]]) -> BandwidthCurve:
    """fit_rates of (bytes, seconds) measurements."""
    return fit_rates([(size, size / seconds) for size, seconds in measurements])


def profile_link(
    link: LinkClass,
    measurements: list[tuple[int, float]],
    gpu_type: str = "",
    peer_gpu_type: str = "",
    gpus_per_node: int = 0,
) -> NetworkProfile:
    """A p2p profile from (bytes, one-way seconds) ping-pong measurements."""
    rates = [(size, size / seconds) for size, seconds in measurements]
    return _profile(link, "p2p", rates, gpu_type, peer_gpu_type, gpus_per_node, 2, "ping-pong")


def _profile(  # noqa: PLR0917 (a profile's identity)
    link: LinkClass,
    measure: Measure,
    rates: Rates,
    gpu_type: str,
    peer_gpu_type: str,
    gpus_per_node: int,
    ranks: int,
    how: str,
    zones: tuple[str, str] = ("", ""),
) -> NetworkProfile:
    sizes = f"{rates[0][0]}..{rates[-1][0]} bytes, {len(rates)} sizes"
    return NetworkProfile(
        link=link,
        measure=measure,
        ranks=ranks,
        gpu_type=gpu_type,
        peer_gpu_type=peer_gpu_type,
        zone=zones[0],
        peer_zone=zones[1],
        gpus_per_node=gpus_per_node,
        curve=fit_rates(rates),
        provenance=provenance(f"{how}, {ranks} ranks, {sizes}"),
    )


def directions(
    forward: Rates,
    backward: Rates,
    gpu_type: str,
    peer: str,
    zones: tuple[str, str] = ("", ""),
) -> list[tuple[tuple[str, str], tuple[str, str], Rates, str]]:
    """((sender zone, GPU), (receiver zone, GPU), rates, how) per direction; when both ends
    are one key (one GPU type, no zones or one zone) the two directions become the slower
    of the two at each size. A zone pair keeps both: A -> B may differ from B -> A."""
    zone, peer_zone = zones
    if (zone, gpu_type) == (peer_zone, peer):
        slower = [(s, min(a, b)) for (s, a), (_, b) in zip(forward, backward, strict=True)]
        return [((zone, gpu_type), (peer_zone, peer), slower, "slower of both directions")]
    return [
        ((zone, gpu_type), (peer_zone, peer), forward, "node 0 -> node 1"),
        ((peer_zone, peer), (zone, gpu_type), backward, "node 1 -> node 0"),
    ]


def profiles_of(  # noqa: PLR0917 (a run's identity)
    link: LinkClass,
    found: Measurements,
    gpu_type: str,
    peer_gpu_type: str,
    gpus_per_node: int = 0,
    zones: tuple[str, str] = ("", ""),
) -> list[NetworkProfile]:
    """The NetworkProfiles of one run: gpu_type is node 0's GPU, peer_gpu_type node 1's.

    Intra-node: the p2p curve (filed under `gpus_per_node` as given, as before) and the
    all-reduce bus bandwidth of the node's per_node GPUs (filed under that node shape).
    Across nodes: p2p and concurrent curves per direction and the all-reduce over both
    nodes, the last two filed under per_node GPUs per node. `zones` (node 0's, node 1's)
    files the across-node curves under that zone pair, each direction under its sender's.
    """
    n, g = found.nodes, found.per_node
    profiles: list[NetworkProfile] = []
    if found.p2p:
        profiles.append(
            _profile(link, "p2p", found.p2p, gpu_type, peer_gpu_type, gpus_per_node, 2, "ping-pong")
        )
    for (zone, sender), (peer_zone, receiver), rates, how in directions(
        found.forward, found.backward, gpu_type, peer_gpu_type, zones
    ):
        if rates:
            profiles.append(
                _profile(
                    link,
                    "p2p",
                    rates,
                    sender,
                    receiver,
                    gpus_per_node,
                    2,
                    f"one way, {how}",
                    (zone, peer_zone),
                )
            )
    for (zone, sender), (peer_zone, receiver), rates, how in directions(
        found.concurrent_forward, found.concurrent_backward, gpu_type, peer_gpu_type, zones
    ):
        if rates:
            what = f"{g} concurrent flows, node aggregate, {how}"
            profiles.append(
                _profile(
                    link, "concurrent", rates, sender, receiver, g, 2 * g, what, (zone, peer_zone)
                )
            )
    if found.allreduce:
        what = f"all-reduce bus bandwidth over {n} node(s) x {g} GPUs"
        profiles.append(
            _profile(
                link,
                "allreduce",
                found.allreduce,
                gpu_type,
                peer_gpu_type,
                g,
                n * g,
                what,
                zones if n > 1 else ("", ""),
            )
        )
    return profiles
