"""The search's fast cost API agrees with itself and with simulate()."""

from __future__ import annotations

import numpy as np
import pytest

from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.types import (
    BandwidthCurve,
    ComputeProfile,
    NetworkProfile,
    ProfileSet,
    Provenance,
)
from sailplan.planner.simulator import Endpoint, PlanningContext, in_flight_micro_batches
from sailplan.planner.simulator.costs import transfer_seconds_array

MODEL = ModelSpec(
    name="tiny", hidden_size=64, num_blocks=4, num_heads=4, vocab_size=128, sequence_length=32
)
PROV = Provenance(source="measured", tool="test")


def context() -> PlanningContext:
    n = MODEL.num_layers
    compute = ComputeProfile(
        model="tiny",
        gpu_type="A100-40",
        tensor_parallel=1,
        micro_batch_size=1,
        forward_s=tuple(0.001 * (i + 1) for i in range(n)),
        backward_s=tuple(0.002 * (i + 1) for i in range(n)),
        update_s=(1e-4,) * n,
        provenance=PROV,
    )
    curve = BandwidthCurve(coefficients=(-0.1, 1.0, 2.0), max_bytes_per_s=5e9, latency_s=1e-5)
    network = tuple(
        NetworkProfile(link=link, curve=curve, provenance=PROV)
        for link in ("intra-zone", "inter-zone", "inter-region")
    )
    cluster = ClusterSnapshot(
        pools=(
            Pool(name="a", gpu_type="A100-40", zone="us-central1-a", nodes=4),
            Pool(name="b", gpu_type="A100-40", zone="europe-west4-a", nodes=4),
        )
    )
    return PlanningContext(
        model=MODEL, cluster=cluster, profiles=ProfileSet(compute=(compute,), network=network)
    )


def test_prefix_sums_give_range_sums() -> None:
    table = context().costs.require_table("A100-40", 1, 1)
    # layers 2..4 forward: 3 + 4 + 5 ms; backward twice that
    assert table.forward_backward_seconds(2, 5) == pytest.approx(3 * (0.003 + 0.004 + 0.005))
    assert table.parameters(1, 5) == 4 * MODEL.block_parameters(1)


def test_vectorized_transfer_and_allreduce_equal_the_scalar_ones() -> None:
    costs = context().costs
    replicas = [Endpoint("a", "A100-40", "us-central1-a")] * 3
    curve = costs.node_nic_curve("A100-40", 1)
    sizes = np.array([0.0, 1e3, 1e6, 7e8, 1.3e9])
    assert transfer_seconds_array(curve, sizes) == pytest.approx(
        [curve.transfer_seconds(s) for s in sizes]
    )
    layout = costs.allreduce_layout(replicas)
    assert costs.allreduce_seconds_array(sizes, layout, 1) == pytest.approx(
        [costs.allreduce_seconds(s, replicas) for s in sizes]
    )


def test_link_classes_and_prices() -> None:
    costs = context().costs
    a = Endpoint("a", "A100-40", "us-central1-a")
    b = Endpoint("b", "A100-40", "europe-west4-a")
    assert costs.link_class(a, a) == "intra-zone"
    assert costs.link_class(a, b) == "inter-region"
    assert costs.egress_usd_per_gb(a.zone, b.zone) == 0.08
    assert costs.price_per_gpu_hour("a") == 3.67


def test_in_flight_micro_batches_under_1f1b() -> None:
    # stage s of P holds P - s micro-batches, never more than there are
    assert [in_flight_micro_batches(s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight_micro_batches(0, 4, 2) == 2
