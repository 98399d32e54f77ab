"""Which profiles a TrainingJob still lacks, and whether it may plan without them.

Compute: one profiling run per (model, GPU type) of the selected pools that has no
measured compute profile, over the TP degrees a node of that pool allows and the
micro-batch sizes the planner searches (make_plan plans a GPU type on its measured grid
points only, so profiling fewer sizes would shrink the search). Network: what the
simulator's network model needs (simulator/collectives.py), per node shape:

- inside a node, per (GPU type, GPUs per node): one pod with all the node's GPUs measures
  p2p and the all-reduce bus bandwidth of the node; satisfied by a measured intra-node
  `allreduce` profile of exactly that shape;
- between every pair of pools (same zone, across zones, across regions; GPU types at each
  end): two pods, each with `flows` = the smaller node's GPUs, measure p2p both ways,
  `flows` concurrent flows both ways (the node's aggregate rate) and the all-reduce over
  both nodes. In one zone: satisfied by a measured `concurrent` profile of that GPU pair
  and shape (and, for two nodes of one GPU type and shape, an `allreduce` one). Across
  zones or regions the need is the pair of zones itself (key network/<link>/<zone>/<gpu>/
  <zone>/<gpu>/n<flows>, ends sorted): satisfied by measured zone-pair p2p profiles of
  both directions of exactly those zones, GPU types and shape; one measurement of a link
  class no longer stands for every pair of zones in it.

A need disappears as soon as those profiles are measured.

The profiling policy decides what happens meanwhile: Auto plans with estimates now and
replans when measurements arrive (replan.triggers.PROFILES_MEASURED), Required waits,
Skip never profiles. Called by the TrainingJob reconcile; jobs.py renders the needs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final, Literal

from sailplan.operator.reconcile.naming import split_pool_key
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.types import LinkClass, Measure, ProfileSet, zone_pair_key

# planner.api searches micro-batch sizes that divide the global batch up to this size
# (its _MAX_ESTIMATED_MICRO_BATCH); profiling covers the same grid.
MAX_MICRO_BATCH: Final = 32
# Link classes measured per pair of zones (NetworkProfile.zone / peer_zone); inside a zone
# the node NIC and the collective are properties of the GPU type and node shape.
CROSS_ZONE: Final[frozenset[LinkClass]] = frozenset({"inter-zone", "inter-region"})


@dataclass(frozen=True)
class Site:
    """Where a profiling pod runs: one GPUPool in one zone (a snapshot pool)."""

    gpupool: str
    zone: str
    gpu_type: str
    gpus_per_node: int
    spot: bool = False

    @classmethod
    def of(cls, pool: Pool) -> Site:
        gpupool, zone = split_pool_key(pool.name)
        return cls(gpupool, zone, pool.gpu_type, pool.gpus_per_node, pool.spot)


@dataclass(frozen=True)
class ComputeNeed:
    model: ModelSpec
    site: Site
    tensor_parallel: tuple[int, ...]
    micro_batch_sizes: tuple[int, ...]

    @property
    def key(self) -> str:
        return f"compute/{self.model.name}/{self.site.gpu_type}"


@dataclass(frozen=True)
class NetworkNeed:
    link: LinkClass
    site: Site  # rank 0 (and the only pod for intra-node)
    peer: Site  # rank 1 (same as site for intra-node)

    @property
    def flows(self) -> int:
        """GPUs (ranks) per node the measurement uses: the whole node inside one, the
        smaller node's GPUs across two (each GPU of it sending to one on the other)."""
        if self.link == "intra-node":
            return self.site.gpus_per_node
        return max(1, min(self.site.gpus_per_node, self.peer.gpus_per_node))

    @property
    def zone_pair(self) -> bool:
        """Whether the Job measures a pair of zones (its profiles carry both zones)."""
        return self.link in CROSS_ZONE

    @property
    def key(self) -> str:
        """The store key of what the Job measures: network/<link>/<gpu>/<peer>/n<flows>,
        or, between zones, network/<link>/<zone>/<gpu>/<zone>/<gpu>/n<flows>."""
        if self.zone_pair:
            return zone_pair_key(
                self.link,
                self.site.zone,
                self.site.gpu_type,
                self.peer.zone,
                self.peer.gpu_type,
                self.flows,
            )
        return f"network/{self.link}/{self.site.gpu_type}/{self.peer.gpu_type}/n{self.flows}"


Need = ComputeNeed | NetworkNeed


def key_id(key: str) -> str:
    """Short stable id of a profile-store key: label value and name suffix (keys contain '/')."""
    return hashlib.sha256(key.encode()).hexdigest()[:10]


def need_id(need: Need) -> str:
    """key_id of the need's key: a profiling Job and an import of the same key share a name."""
    return key_id(need.key)


def link_class(a: Pool, b: Pool) -> LinkClass:
    """Across nodes, as planner.simulator.costs.CostModel.link_class decides."""
    if a.zone == b.zone:
        return "intra-zone"
    if a.region == b.region:
        return "inter-zone"
    return "inter-region"


def micro_batch_grid(global_batch_size: int) -> tuple[int, ...]:
    top = min(global_batch_size, MAX_MICRO_BATCH)
    return tuple(m for m in range(1, top + 1) if global_batch_size % m == 0)


def _measured_network(  # noqa: PLR0917 (a lookup's coordinates)
    profiles: ProfileSet, link: LinkClass, a: str, b: str, n: int, measure: Measure
) -> bool:
    """Whether a measured `measure` profile of exactly this link, pair and node shape exists."""
    found = profiles.network_profile(link, a, b, n, measure=measure)
    return (
        found is not None
        and found.provenance.source == "measured"
        and found.gpus_per_node == n
        and {found.gpu_type, found.peer_gpu_type} == {a, b}
    )


def _zone_pair_measured(profiles: ProfileSet, need: NetworkNeed) -> bool:
    """Both directions' p2p curve measured between exactly these zones, GPU types and shape
    (what CostModel.zone_link prices a link between zones from)."""
    n = need.flows
    for sender, receiver in ((need.site, need.peer), (need.peer, need.site)):
        found = profiles.zone_pair_profile(
            sender.zone, sender.gpu_type, receiver.zone, receiver.gpu_type, n
        )
        if found is None or found.provenance.source != "measured" or found.gpus_per_node != n:
            return False
    return True


def _pair_measured(profiles: ProfileSet, need: NetworkNeed) -> bool:
    if need.zone_pair:
        return _zone_pair_measured(profiles, need)
    a, b, n = need.site.gpu_type, need.peer.gpu_type, need.flows
    if not _measured_network(profiles, need.link, a, b, n, "concurrent"):
        return False
    same_shape = a == b and need.site.gpus_per_node == need.peer.gpus_per_node
    return not same_shape or _measured_network(profiles, need.link, a, b, n, "allreduce")


def missing_profiles(
    model: ModelSpec, global_batch_size: int, cluster: ClusterSnapshot, measured: ProfileSet
) -> tuple[Need, ...]:
    """Every profile the job's pools need and the store lacks, in a stable order."""
    pools = sorted((p for p in cluster.pools if p.nodes > 0), key=lambda p: p.name)
    needs: dict[str, Need] = {}
    for gpu in sorted({p.gpu_type for p in pools}):
        grid = measured.compute_grid(model.name, gpu)
        if any(
            (found := measured.compute_profile(model.name, gpu, tp, mbs)) is not None
            and found.provenance.source == "measured"
            for tp, mbs in grid
        ):
            continue
        # The largest node of this type: it can measure every TP degree the planner may use.
        largest = max(
            (p for p in pools if p.gpu_type == gpu), key=lambda p: (p.gpus_per_node, p.nodes)
        )
        tps = tuple(
            t for t in range(1, largest.gpus_per_node + 1) if model.supports_tensor_parallel(t)
        )
        compute = ComputeNeed(model, Site.of(largest), tps, micro_batch_grid(global_batch_size))
        needs.setdefault(compute.key, compute)
    for pool in pools:
        n = pool.gpus_per_node
        if n >= 2 and not _measured_network(
            measured, "intra-node", pool.gpu_type, pool.gpu_type, n, "allreduce"
        ):
            inside = NetworkNeed("intra-node", Site.of(pool), Site.of(pool))
            needs.setdefault(inside.key, inside)
    for i, a in enumerate(pools):
        for b in pools[i:]:
            if a is b and a.nodes < 2:
                continue  # two pods on distinct nodes of one pool need two nodes
            link = link_class(a, b)
            if link in CROSS_ZONE:  # the ends in the order zone_pair_key names them
                first, second = sorted((a, b), key=lambda p: (p.zone, p.gpu_type, p.name))
            else:
                first, second = sorted((a, b), key=lambda p: (p.gpu_type, p.name))
            between = NetworkNeed(link, Site.of(first), Site.of(second))
            if not _pair_measured(measured, between):
                needs.setdefault(between.key, between)
    return tuple(needs[key] for key in sorted(needs))


Verdict = Literal["plan", "plan-and-profile", "wait-for-profiles"]


@dataclass(frozen=True)
class ProfilingDecision:
    verdict: Verdict
    launch: tuple[Need, ...]  # profiling Jobs to run
    message: str

    @property
    def may_plan(self) -> bool:
        return self.verdict != "wait-for-profiles"


def profiling_decision(mode: str, needs: tuple[Need, ...]) -> ProfilingDecision:
    """What the job's spec.profiling.mode (Auto, Required, Skip) makes of the needs."""
    if not needs:
        return ProfilingDecision("plan", (), "every profile the pools need is measured")
    listed = f"{len(needs)} profiles missing (first: {needs[0].key})"
    if mode == "Skip":
        return ProfilingDecision(
            "plan", (), f"{listed}; profiling is Skip: planning with estimates"
        )
    if mode == "Required":
        return ProfilingDecision(
            "wait-for-profiles", needs, f"{listed}; profiling is Required: waiting for them"
        )
    return ProfilingDecision(
        "plan-and-profile", needs, f"{listed}; planning with estimates and profiling meanwhile"
    )
