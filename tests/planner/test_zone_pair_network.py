"""Links between zones are priced from the zone pair's own measured curve, per direction,
and otherwise from the link class, with the stand-in named (CostModel.zone_link)."""

from __future__ import annotations

import pytest

from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.types import (
    BandwidthCurve,
    ComputeProfile,
    NetworkProfile,
    ProfileSet,
    Provenance,
    zone_pair_key,
)
from sailplan.planner.simulator import PlanningContext, profile_refs, simulate, zone_links
from sailplan.planner.simulator.collectives import NETWORK_HOP_LATENCY_S

MODEL = ModelSpec(
    name="tiny", hidden_size=64, num_blocks=4, num_heads=4, vocab_size=128, sequence_length=32
)
MEASURED = Provenance(source="measured", tool="test", date="2026-11-25")
GPU = "A100-40"
ZA, ZB, ZC = "us-central1-a", "us-central1-b", "us-central1-c"
A = Replica(pool="pa", gpu_type=GPU, zone=ZA)
B = Replica(pool="pb", gpu_type=GPU, zone=ZB)
C = Replica(pool="pc", gpu_type=GPU, zone=ZC)
CLUSTER = ClusterSnapshot(
    pools=tuple(
        Pool(name=r.pool, gpu_type=GPU, zone=r.zone, gpus_per_node=1, nodes=4) for r in (A, B, C)
    )
)
NIC = 1e10  # the node's own NIC and links in a zone: never the bottleneck here
CLASS = 5e7  # the inter-zone class curve
A_TO_B, A_TO_C, B_TO_A = 1e6, 4e6, 2e6


def flat(rate: float) -> BandwidthCurve:
    return BandwidthCurve(
        coefficients=(0.0, 0.0, rate / 1e9), max_bytes_per_s=rate, min_bytes_per_s=rate
    )


def pair(sender: Replica, receiver: Replica, rate: float) -> NetworkProfile:
    return NetworkProfile(
        link="inter-zone",
        gpu_type=sender.gpu_type,
        peer_gpu_type=receiver.gpu_type,
        zone=sender.zone,
        peer_zone=receiver.zone,
        gpus_per_node=1,
        curve=flat(rate),
        provenance=MEASURED,
    )


def compute() -> ComputeProfile:
    n = MODEL.num_layers
    return ComputeProfile(
        model="tiny",
        gpu_type=GPU,
        tensor_parallel=1,
        micro_batch_size=1,
        forward_s=(1e-3,) * n,
        backward_s=(2e-3,) * n,
        update_s=(1e-4,) * n,
        provenance=MEASURED,
    )


def context(*network: NetworkProfile, class_curve: bool = True) -> PlanningContext:
    base = [NetworkProfile(link="intra-zone", curve=flat(NIC), provenance=MEASURED)]
    if class_curve:
        base.append(NetworkProfile(link="inter-zone", curve=flat(CLASS), provenance=MEASURED))
    profiles = ProfileSet(compute=(compute(),), network=(*base, *network))
    return PlanningContext(model=MODEL, cluster=CLUSTER, profiles=profiles)


PAIRS = (pair(A, B, A_TO_B), pair(A, C, A_TO_C), pair(B, A, B_TO_A))


def two_stages(first: Replica, second: Replica) -> Plan:
    stages = (
        Stage(layer_start=0, layer_end=3, replicas=(first,)),
        Stage(layer_start=3, layer_end=MODEL.num_layers, replicas=(second,)),
    )
    return Plan(
        model=MODEL, global_batch_size=4, micro_batch_size=1, num_micro_batches=4, stages=stages
    )


def test_two_zone_pairs_with_different_curves_give_different_times() -> None:
    ctx = context(*PAIRS)
    nbytes = 1e6
    to_b = ctx.costs.p2p_seconds(nbytes, A, B)
    to_c = ctx.costs.p2p_seconds(nbytes, A, C)
    assert to_b == pytest.approx(NETWORK_HOP_LATENCY_S + nbytes / A_TO_B)
    assert to_c == pytest.approx(NETWORK_HOP_LATENCY_S + nbytes / A_TO_C)
    # the same plan shape across the two pairs: the slower pair's pipeline is slower by the
    # boundary's difference at each of the 1F1B schedule's boundary crossings
    via_b = simulate(two_stages(A, B), ctx)
    via_c = simulate(two_stages(A, C), ctx)
    x_b = ctx.costs.boundary_seconds(ctx.costs.boundary_bytes(1, 3), A, B)
    x_c = ctx.costs.boundary_seconds(ctx.costs.boundary_bytes(1, 3), A, C)
    assert x_b > x_c
    t = 3 * 3e-3
    for predicted, x in ((via_b, x_b), (via_c, x_c)):
        assert predicted.pipeline_seconds == pytest.approx(2 * t + 2 * x + 3 * (t + x))
    assert via_b.iteration_seconds > via_c.iteration_seconds


def test_each_direction_has_its_own_curve() -> None:
    ctx = context(*PAIRS)
    assert ctx.costs.zone_link(A, B, 1).curve.max_bytes_per_s == A_TO_B
    assert ctx.costs.zone_link(B, A, 1).curve.max_bytes_per_s == B_TO_A
    assert ctx.costs.zone_link(A, B, 1).source == "measured"


def test_a_pipeline_boundary_is_paced_by_the_slower_direction() -> None:
    # activations go one way and gradients the other in the same 1F1B cycle
    slow_back = pair(B, A, A_TO_B / 4)
    ctx = context(pair(A, B, A_TO_B), slow_back)
    assert ctx.costs.p2p_seconds(1e6, A, B) == pytest.approx(
        NETWORK_HOP_LATENCY_S + 1e6 / (A_TO_B / 4)
    )
    fast_back = context(pair(A, B, A_TO_B), pair(B, A, A_TO_B * 4))
    assert fast_back.costs.p2p_seconds(1e6, A, B) == pytest.approx(
        NETWORK_HOP_LATENCY_S + 1e6 / A_TO_B
    )


def test_an_unmeasured_pair_falls_back_to_the_class_and_says_so() -> None:
    ctx = context(*PAIRS)
    link = ctx.costs.zone_link(C, A, 1)  # only A -> C was measured
    assert link.source == "estimated"
    assert link.curve.max_bytes_per_s == CLASS
    assert "class curve network/inter-zone" in link.how
    assert link.key == zone_pair_key("inter-zone", ZC, GPU, ZA, GPU, 1)


def test_without_a_class_curve_the_median_of_measured_pairs_stands_in() -> None:
    ctx = context(*PAIRS, class_curve=False)
    link = ctx.costs.zone_link(B, C, 1)
    assert link.source == "estimated"
    assert link.curve.max_bytes_per_s == B_TO_A  # median of 1e6, 2e6, 4e6
    assert "median of 3 measured inter-zone zone pairs" in link.how


def test_with_nothing_measured_between_zones_the_catalog_estimate_is_named() -> None:
    ctx = context(class_curve=False)
    link = ctx.costs.zone_link(A, B, 1)
    assert link.source == "estimated" and "catalog" in link.how
    assert ctx.costs.p2p_seconds(1e6, A, B) > 0


def test_the_plan_lists_pair_keys_measured_or_estimated() -> None:
    ctx = context(*PAIRS)
    # a ring over A and C crosses A -> C (measured) and C -> A (not): one key, estimated
    ring = Plan(
        model=MODEL,
        global_batch_size=2,
        micro_batch_size=1,
        num_micro_batches=1,
        stages=(Stage(layer_start=0, layer_end=MODEL.num_layers, replicas=(A, C)),),
    )
    refs = {r.key: r for r in profile_refs(ring, ctx)}
    key = zone_pair_key("inter-zone", ZA, GPU, ZC, GPU, 1)
    assert refs[key].source == "estimated"
    assert [(a.zone, b.zone, z.source) for a, b, z in zone_links(ring, ctx)] == [
        (ZA, ZC, "measured"),
        (ZC, ZA, "estimated"),
    ]
    # a pipeline boundary uses both directions: A <-> B were both measured
    forward = {r.key: r for r in profile_refs(two_stages(A, B), ctx)}
    assert forward[zone_pair_key("inter-zone", ZA, GPU, ZB, GPU, 1)].source == "measured"
    one_way = {r.key: r for r in profile_refs(two_stages(A, C), ctx)}
    assert one_way[zone_pair_key("inter-zone", ZA, GPU, ZC, GPU, 1)].source == "estimated"
    assert not any(k.startswith("network/inter-zone/A100") for k in forward)


def test_the_class_estimate_is_unchanged_when_no_pair_is_measured() -> None:
    # no zone-pair profile: the link is priced exactly as the class curve prices it
    ctx = context()
    seconds = ctx.costs.p2p_seconds(1e6, A, B)
    assert seconds == pytest.approx(NETWORK_HOP_LATENCY_S + 1e6 / CLASS)
