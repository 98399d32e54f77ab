"""The gradient dtype a run trains with is what its all-reduce moves.

The Sailor artifact's runs trained in fp32 (benchmarks/simulator_accuracy.py
SAILOR_TRAINING says where that is written down), so their gradient all-reduce and their
stage-boundary sends carry 4-byte elements. These tests check the properties the benchmark
relies on, on a cluster priced from the catalog alone (no artifact needed): the all-reduce
term follows the gradient bytes per element, the boundary term the boundary element size,
and fp32 training keeps the 16 bytes per parameter the memory constants were fitted with.
"""

from __future__ import annotations

import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator import PlanningContext
from sailplan.planner.simulator.costs import CostModel, Endpoint
from sailplan.planner.simulator.memory import FP32_BYTES, TrainingSetup, model_state_bytes

CATALOG = default_catalog()
MODEL = CATALOG.model("OPT-350M")
FP32_RUN = TrainingSetup(parameter_bytes=FP32_BYTES, boundary_element_bytes=FP32_BYTES)


def costs_for(training: TrainingSetup, nodes: int = 4) -> CostModel:
    pool = Pool(name="gh", gpu_type="GH200-96", zone="us-central1-a", gpus_per_node=4, nodes=nodes)
    cluster = ClusterSnapshot(pools=(pool,))
    return PlanningContext(
        model=MODEL, cluster=cluster, profiles=ProfileSet(), training=training
    ).costs


@pytest.mark.parametrize("replicas", [2, 4])
def test_fp32_gradients_all_reduce_what_twice_the_half_precision_bytes_take(
    replicas: int,
) -> None:
    half, full = costs_for(TrainingSetup()), costs_for(FP32_RUN)
    assert full.training.gradient_bytes == 2 * half.training.gradient_bytes
    group = [Endpoint("gh", "GH200-96", "us-central1-a")] * replicas
    elements = MODEL.total_parameters()
    # the same elements in fp32 are the bytes of twice as many half-precision elements
    fp32 = full.allreduce_seconds(full.training.gradient_bytes * elements, group, tp=4)
    doubled = half.allreduce_seconds(2 * half.training.gradient_bytes * elements, group, tp=4)
    assert fp32 == pytest.approx(doubled, rel=1e-12)
    # and more bytes over the same links never take less time
    bf16 = half.allreduce_seconds(half.training.gradient_bytes * elements, group, tp=4)
    assert fp32 > bf16


def test_fp32_boundary_tensors_are_twice_the_half_precision_ones() -> None:
    half, full = costs_for(TrainingSetup()), costs_for(FP32_RUN)
    for layer in (1, MODEL.num_layers // 2):
        assert full.boundary_bytes(8, layer) == 2 * half.boundary_bytes(8, layer)


@pytest.mark.parametrize("replicas", [1, 2, 16])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_fp32_training_without_zero_holds_what_half_weights_with_a_master_copy_hold(
    replicas: int, optimizer: str
) -> None:
    # fp32: weights 4 + gradients 4 + optimizer; half: 2 + 2 + fp32 master 4 + optimizer.
    # Equal totals are why pricing the Sailor runs in fp32 leaves the memory fit as it was.
    params = 1e8
    fp32 = model_state_bytes(params, replicas, FP32_RUN, optimizer)
    half = model_state_bytes(params, replicas, TrainingSetup(), optimizer)
    assert fp32.total == pytest.approx(half.total)
    assert fp32.master_weights == 0.0 and fp32.gradients == FP32_BYTES * params
