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
    # NCCL's ring passes through all 4 members of each TP communicator, so the edge leaving
    # a node carries 2 x 3/4 of its shard, and the NIC all 4 shards: 2 x 3/4 x grads
    inter = 2 * 3 / 4 * grads / 12.5e9  # a2-highgpu-8g: 100 Gbps per VM
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


def _bus(link: str, gpus_per_node: int, rate: float, measure: str = "allreduce") -> NetworkProfile:
    return NetworkProfile.model_validate(
        {
            "link": link,
            "gpu_type": "A100-40",
            "peer_gpu_type": "A100-40",
            "gpus_per_node": gpus_per_node,
            "measure": measure,
            "ranks": 2 * gpus_per_node,
            "curve": flat_curve(rate),
            "provenance": Provenance(source="measured", tool="sailplan-profile"),
        }
    )


def measured_costs(*profiles: NetworkProfile, pool: Pool | None = None) -> CostModel:
    cluster = ClusterSnapshot(pools=(pool or a100_pool(),))
    context = PlanningContext(model=MODEL, cluster=cluster, profiles=ProfileSet(network=profiles))
    return context.costs


A100 = Endpoint("a", "A100-40", "us-central1-a")


def test_a_measured_collective_prices_the_all_reduce_by_the_bus_bandwidth_formula() -> None:
    grads = 2e8  # one bucket (DeepSpeed's 5e8) per TP group
    replicas = [A100] * 4  # TP 4: two replicas per 8-GPU node, two nodes: 4 members
    shard = grads / 4  # what each TP communicator reduces
    for busbw in (2e9, 4e9):
        costs = measured_costs(_bus("intra-zone", 8, busbw))
        # nccl-tests: busbw = 2 (n - 1) / n x bytes / time, so time = 2 x 3/4 x shard / busbw
        assert costs.allreduce_seconds(grads, replicas, tp=4) == pytest.approx(
            2 * 3 / 4 * shard / busbw
        )
    physics = costs_for(a100_pool()).allreduce_seconds(grads, replicas, tp=4)
    assert physics != pytest.approx(2 * 3 / 4 * shard / 2e9)


def test_a_collective_measured_on_another_node_shape_is_not_used() -> None:
    grads = 2e8
    other_shape = measured_costs(_bus("intra-zone", 4, 1e9))
    physics = costs_for(a100_pool())
    assert other_shape.allreduce_layout([A100] * 4, tp=4).collective_busbw is None
    assert other_shape.allreduce_seconds(grads, [A100] * 4, tp=4) == pytest.approx(
        physics.allreduce_seconds(grads, [A100] * 4, tp=4)
    )


def test_a_measured_intra_node_all_reduce_prices_replicas_sharing_a_node() -> None:
    grads = 2e8
    costs = measured_costs(_bus("intra-node", 8, 50e9))
    # two TP-4 replicas on one 8-GPU node: 2 members, each shard reduced at the node's busbw
    assert costs.allreduce_seconds(grads, [A100] * 2, tp=4) == pytest.approx(
        2 * 1 / 2 * (grads / 4) / 50e9
    )


def test_measured_concurrent_flows_are_the_nodes_nic_rate() -> None:
    costs = measured_costs(_bus("intra-zone", 8, 7e9, measure="concurrent"))
    assert costs.node_nic_curve("A100-40", 8).bytes_per_second(64e6) == pytest.approx(7e9)
    # a 4-GPU node was not measured: its documented egress cap, not the 8-GPU measurement
    assert costs.node_nic_curve("A100-40", 4).bytes_per_second(64e6) != pytest.approx(7e9)


def test_the_all_reduce_inputs_say_which_were_estimated() -> None:
    replicas = [A100] * 4  # two per node, two nodes
    estimated = costs_for(a100_pool()).allreduce_inputs(replicas, tp=4)
    assert {key: source for key, (source, _) in estimated.items()} == {
        "network/intra-node/A100-40/A100-40/n8": "estimated",
        "network/intra-zone/A100-40/A100-40/n8": "estimated",
    }
    measured = measured_costs(
        _bus("intra-node", 8, 50e9),
        _bus("intra-zone", 8, 5e9),
        _bus("intra-zone", 8, 7e9, measure="concurrent"),
    ).allreduce_inputs(replicas, tp=4)
    assert {source for source, _ in measured.values()} == {"measured"}
    assert set(measured) == set(estimated)
    # single flows measured (a Sailor import): the physics ran on measured curves
    flows_only = measured_costs(
        _bus("intra-node", 8, 50e9, measure="p2p"), _bus("intra-zone", 8, 5e9, measure="p2p")
    ).allreduce_inputs(replicas, tp=4)
    assert {source for source, _ in flows_only.values()} == {"measured"}
