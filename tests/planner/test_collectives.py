"""The physical all-reduce model: each expectation follows from link speeds and NCCL's algorithms."""

from __future__ import annotations

import numpy as np
import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.profiles.types import NetworkProfile, ProfileSet, Provenance
from sailplan.planner.simulator import PlanningContext
from sailplan.planner.simulator.collectives import (
    NCCL_BASE_LATENCY_S,
    AllReduceLayout,
    allreduce_seconds,
)
from sailplan.planner.simulator.costs import CostModel, Endpoint, flat_curve

CATALOG = default_catalog()
MODEL = CATALOG.model("OPT-350M")


def costs_for(*pools: Pool) -> CostModel:
    cluster = ClusterSnapshot(pools=pools)
    # no measured network: every link is the catalog's datasheet figure
    return PlanningContext(model=MODEL, cluster=cluster, profiles=ProfileSet()).costs


def a100_pool(name: str = "a", gpus_per_node: int = 8, nodes: int = 2) -> Pool:
    return Pool(
        name=name,
        gpu_type="A100-40",
        zone="us-central1-a",
        gpus_per_node=gpus_per_node,
        nodes=nodes,
    )


def test_two_tp4_replicas_in_one_nvlink_node_reduce_in_milliseconds() -> None:
    costs = costs_for(a100_pool())
    replica = Endpoint("a", "A100-40", "us-central1-a")
    grads = 2.0 * MODEL.total_parameters()  # fp16 gradients of one TP-4 group
    seconds = costs.allreduce_seconds(grads, [replica, replica], tp=4)
    # each GPU reduces its ~1/4 shard with its peer over NVLink3 (300 GB/s datasheet):
    # 2 x 1/2 x grads / 4 / 300e9 ~ 0.6 ms, plus NCCL latencies
    assert seconds == pytest.approx(grads / 4 / 300e9, rel=0.05, abs=1e-4)


def test_replicas_on_two_nodes_cross_the_nic_at_the_documented_egress() -> None:
    costs = costs_for(a100_pool())
    replica = Endpoint("a", "A100-40", "us-central1-a")
    grads = 2.0 * MODEL.total_parameters()
    seconds = costs.allreduce_seconds(grads, [replica] * 4, tp=4)  # 2 per 8-GPU node
    inter = 2 * 1 / 2 * grads / 12.5e9  # a2-highgpu-8g: 100 Gbps per VM
    assert seconds > inter
    assert seconds < inter * 1.1


def test_a_group_with_half_of_each_node_gets_half_of_its_nic() -> None:
    costs = costs_for(a100_pool(nodes=4))
    replica = Endpoint("a", "A100-40", "us-central1-a")
    grads = 1e9
    whole = costs.allreduce_layout([replica] * 2, tp=8)  # one replica fills each node
    half = costs.allreduce_layout([replica] * 2, tp=4)  # packed: both on one node, no NIC
    assert half.nodes == 1 and whole.nodes == 2
    lone = costs_for(a100_pool(gpus_per_node=8, nodes=4))
    spread = lone.allreduce_layout([replica] * 3, tp=4)  # 2 + 1 replicas per node
    assert spread.inter_node.max_bytes_per_s == pytest.approx(12.5e9)
    assert costs.allreduce_seconds(grads, [replica] * 2, tp=8) > costs.allreduce_seconds(
        grads, [replica] * 2, tp=4
    )


def test_the_slowest_member_sets_the_pace_of_a_mixed_group() -> None:
    costs = costs_for(
        a100_pool(gpus_per_node=1),
        Pool(name="v", gpu_type="V100-16", zone="us-central1-a", gpus_per_node=1, nodes=2),
    )
    a = Endpoint("a", "A100-40", "us-central1-a")
    v = Endpoint("v", "V100-16", "us-central1-a")
    layout = costs.allreduce_layout([a, v], tp=1)
    # both one-GPU VMs are documented at 24 Gbps; the mixed ring is no faster than that
    assert layout.inter_node.max_bytes_per_s <= 3.0e9


def test_tree_beats_ring_for_small_messages_on_many_nodes_and_not_for_large_ones() -> None:
    link = flat_curve(10e9)
    layout = AllReduceLayout(
        ranks_per_node=1,
        nodes=64,
        intra_node=link,
        intra_hop_latency_s=0.0,
        inter_node=link,
        inter_hop_latency_s=1e-5,
    )
    small, large = 1e3, 1e9
    got = allreduce_seconds(layout, np.array([small, large]), 1, 5e8)
    ring_small = 2 * 63 / 64 * small / 10e9 + 2 * 63 * 1e-5
    tree_small = 2 * small / 10e9 + 2 * 6 * 1e-5 + NCCL_BASE_LATENCY_S
    assert got[0] < ring_small
    assert got[0] == pytest.approx(tree_small, rel=0.01)
    ring_large = 2 * (2 * 63 / 64 * 5e8 / 10e9 + 2 * 63 * 1e-5 + NCCL_BASE_LATENCY_S)
    assert got[1] == pytest.approx(ring_large, rel=0.01)


def test_a_measured_link_between_two_gpu_types_bounds_their_mixed_group() -> None:
    # each node's own NIC is fast (the datasheet), but the pair was measured at 100 MB/s
    pair = NetworkProfile(
        link="intra-zone",
        gpu_type="A100-40",
        peer_gpu_type="V100-16",
        curve=flat_curve(100e6),
        provenance=Provenance(source="measured", tool="test"),
    )
    cluster = ClusterSnapshot(
        pools=(
            a100_pool(gpus_per_node=1),
            Pool(name="v", gpu_type="V100-16", zone="us-central1-a", gpus_per_node=1, nodes=2),
        )
    )
    context = PlanningContext(model=MODEL, cluster=cluster, profiles=ProfileSet(network=(pair,)))
    a = Endpoint("a", "A100-40", "us-central1-a")
    v = Endpoint("v", "V100-16", "us-central1-a")
    layout = context.costs.allreduce_layout([a, v], tp=1)
    assert layout.inter_node.max_bytes_per_s == pytest.approx(100e6)
    # a pipeline send between the two types crosses the same measured link
    assert context.costs.p2p_seconds(1e8, a, v) == pytest.approx(1.0, rel=0.01)
