"""Gradient all-reduce time of one stage from the network's physics, with no fitted constant.

The cost model (costs.CostModel) describes where a stage's data-parallel group sits: how
many of its replicas share a node (`ranks_per_node`), over how many nodes it spreads
(`nodes`), the per-GPU link inside a node and the per-node rate across nodes (the slowest
node's NIC or the slowest zone-crossing edge of the ring). This module turns that layout
into seconds the way NCCL runs the collective, vectorized over gradient sizes because the
search prices every layer range of a stage at once (search/terms.py) and simulate() prices
one: both call `allreduce_seconds`, so they agree exactly.

The algorithm (per gradient bucket; DeepSpeed/Megatron reduce in buckets):

- every TP rank of a replica runs its own data-parallel communicator over a shard of
  S = bucket / TP bytes; the TP communicators of a node run at the same time;
- inside a node (k replicas of the stage on it): reduce-scatter + all-gather over the node's
  NVLink/NVSwitch/PCIe, 2 (k - 1) / k x S at the per-GPU link rate;
- across nodes (N of them, m = k N members): NCCL's ring passes through every member, so
  the edge that leaves a node carries what every ring edge carries, 2 (m - 1) / m x S per
  TP communicator, and the node's NIC all its TP communicators' shards, 2 (m - 1) / m x
  bucket (not the 2 (N - 1) / N of a reduce-scatter inside the node followed by a ring of
  nodes, which NCCL's ring does not do); the edges run at once, so the slowest (the NIC
  share, or a GPU link inside the node) sets the pace. NCCL's tree is that hierarchy: the
  inside-node phase, then a double binary tree that sends and receives the whole buffer
  once in each half, 2 x bucket through the NIC. Rates are evaluated at the message one
  rank sends (S / k); NCCL picks ring or tree by which is faster, which makes the tree win
  for small messages on many nodes (fewer latency steps) and the ring for large ones;
- latencies are NCCL's own model for the Simple protocol (src/graph/tuning.cc: base 8.4 us
  per collective, 3.4 us per NVLink hop, 5.7 us per PCIe hop, 14 us per network hop).

Measured collectives replace this physics where the profile store has them
(`sailplan-profile network` writes all-reduce bus bandwidth, busbw = 2 (n - 1) / n x
bytes / time, against the message size each rank reduces):

- `intra_node_busbw`: the node shape's all-reduce measured over its GPUs; the inside-node
  phase is then 2 (k - 1) / k x S / busbw(S), its latencies included in the measurement;
- `collective_busbw`: an all-reduce measured over whole nodes of the group's GPU type and
  shape; the bucket's whole (hierarchical) all-reduce is then 2 (m - 1) / m x S / busbw(S)
  over the m = k N members, which carries what NIC physics cannot (NCCL reaching only a
  fraction of the p2p rate on real clusters) without a fitted constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sailplan.planner.profiles.types import BandwidthCurve

FloatArray = npt.NDArray[np.float64]

# NCCL src/graph/tuning.cc, Simple protocol (the one bulk gradient reductions use).
NCCL_BASE_LATENCY_S = 8.4e-6
NVLINK_HOP_LATENCY_S = 3.4e-6
PCIE_HOP_LATENCY_S = 5.7e-6
NETWORK_HOP_LATENCY_S = 14e-6


@dataclass(frozen=True)
class AllReduceLayout:
    """Where one stage's data-parallel group runs, as the collective sees it.

    ranks_per_node: replicas of the stage on the busiest node (k >= 1);
    nodes: nodes the group spans (N >= 1);
    intra_node: per-GPU link rate inside a node against message size;
    intra_hop_latency_s: NVLink or PCIe hop latency of that link;
    inter_node: per-node rate across nodes against message size (the slowest node's NIC, its
        share of it when other groups cross the same NIC, or a slower zone-crossing edge);
    inter_hop_latency_s: one network hop (larger across zones and regions).
    """

    ranks_per_node: int
    nodes: int
    intra_node: BandwidthCurve
    intra_hop_latency_s: float
    inter_node: BandwidthCurve
    inter_hop_latency_s: float
    intra_node_busbw: BandwidthCurve | None = None
    collective_busbw: BandwidthCurve | None = None

    @property
    def members(self) -> int:
        return self.ranks_per_node * self.nodes


def _rate(curve: BandwidthCurve, message_bytes: FloatArray) -> FloatArray:
    """Bytes/s of `curve` at each message size (the curve's clamps applied)."""
    safe = np.maximum(message_bytes, 1.0)
    x = np.log2(safe / 1e6)
    knee = curve.small_message_knee  # below it the time stays the knee's (BandwidthCurve)
    fit = np.maximum(x, knee)
    c0, c1, c2 = curve.coefficients
    gbps = (c0 * fit * fit + c1 * fit + c2) * np.exp2(np.minimum(x - knee, 0.0))
    rate: FloatArray = np.clip(gbps * 1e9, curve.min_bytes_per_s, curve.max_bytes_per_s)
    return rate


def _busbw_seconds(busbw: BandwidthCurve, members: int, message: FloatArray) -> FloatArray:
    """nccl-tests' definition read backwards: time = 2 (m - 1) / m x bytes / busbw(bytes)."""
    seconds: FloatArray = 2.0 * (members - 1) / members * message / _rate(busbw, message)
    return seconds


def _bucket_seconds(layout: AllReduceLayout, bucket: FloatArray, tp: int) -> FloatArray:
    """All-reduce time of one bucket of `bucket` bytes per TP group (array-wise)."""
    k, n = layout.ranks_per_node, layout.nodes
    shard = bucket / tp
    if n > 1 and layout.collective_busbw is not None:
        # every TP communicator reduces its shard at the measured bus bandwidth, at once
        return _busbw_seconds(layout.collective_busbw, k * n, shard)
    if k > 1 and layout.intra_node_busbw is not None and n == 1:
        return _busbw_seconds(layout.intra_node_busbw, k, shard)
    inside = np.zeros_like(bucket)
    if k > 1 and layout.intra_node_busbw is not None:
        inside = _busbw_seconds(layout.intra_node_busbw, k, shard)
    elif k > 1:
        moved = 2.0 * (k - 1) / k * shard
        inside = moved / _rate(layout.intra_node, shard / k)
        inside += 2 * (k - 1) * layout.intra_hop_latency_s
    if n == 1:
        return inside + NCCL_BASE_LATENCY_S
    rate = _rate(layout.inter_node, shard / k)
    # ring: one ring of all m = k N members per TP communicator; every edge, the one that
    # leaves a node included, carries 2 (m - 1) / m x its shard, all edges at once, so the
    # slowest edge sets the pace: the NIC (all TP communicators' shards) or a GPU link
    m = k * n
    ring = 2.0 * (m - 1) / m * bucket / rate
    if k > 1:
        ring = np.maximum(ring, 2.0 * (m - 1) / m * shard / _rate(layout.intra_node, shard / k))
    ring += 2 * (n - 1) * layout.inter_hop_latency_s + 2 * n * (k - 1) * layout.intra_hop_latency_s
    # tree: a chain inside each node (the reduce-scatter / all-gather above), a double
    # binary tree across nodes that sends and receives the whole buffer once in each half
    depth = math.ceil(math.log2(n))
    tree = inside + 2.0 * bucket / rate + 2 * depth * layout.inter_hop_latency_s
    seconds: FloatArray = np.minimum(ring, tree) + NCCL_BASE_LATENCY_S
    return seconds


def bucket_count(group_bytes: float, bucket_bytes: float) -> int:
    """Collectives one all-reduce of `group_bytes` in buckets of `bucket_bytes` issues (the
    full buckets and the rest), as allreduce_seconds prices them. The trainer packs whole
    tensors (sailplan.trainer.grads.buckets), so a tensor larger than the bucket is one
    collective of its own: the same count where tensors are small against the bucket."""
    if group_bytes <= 0:
        return 0
    full = math.floor(group_bytes / bucket_bytes)
    return full + (1 if group_bytes - full * bucket_bytes > 0 else 0)


def allreduce_seconds(
    layout: AllReduceLayout, group_bytes: FloatArray, tp: int, bucket_bytes: float
) -> FloatArray:
    """Seconds to all-reduce `group_bytes` (gradient bytes of one TP group, per entry).

    Zero where the group has one member or nothing to reduce; buckets of `bucket_bytes`
    run one after the other.
    """
    sizes = np.maximum(np.asarray(group_bytes, dtype=np.float64), 0.0)
    if layout.members <= 1:
        return np.zeros_like(sizes)
    full = np.floor(sizes / bucket_bytes)
    rest = sizes - full * bucket_bytes
    one_bucket = float(_bucket_seconds(layout, np.array([bucket_bytes]), tp)[0])
    total = full * one_bucket + np.where(rest > 0, _bucket_seconds(layout, rest, tp), 0.0)
    result: FloatArray = np.where(sizes > 0, total, 0.0)
    return result
