"""DeepSpeed counts its gradient all-reduce bucket in elements, not bytes.

PipelineEngine._exec_reduce_grads calls allreduce_gradients(bucket_size=
MEMORY_OPT_ALLREDUCE_SIZE = 500,000,000), and allreduce_no_retain adds tensor.numel() until
the bucket holds more than that (deepspeed/runtime/engine.py): each rank's bucket is 5e8
elements, 2 GB of fp32 gradients. SimulatorConstants.bucket_elements prices that; the
default prices a TP group's bucket in bytes (bucket_bytes). Catalog links only, no
artifact needed: every bucket pays the collective's latency, so the bucket count shows.
"""

from __future__ import annotations

import dataclasses

import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator import DEFAULT_CONSTANTS, PlanningContext
from sailplan.planner.simulator.costs import CostModel, Endpoint
from sailplan.planner.simulator.memory import FP32_BYTES, TrainingSetup

CATALOG = default_catalog()
MODEL = CATALOG.model("OPT-350M")
FP32 = TrainingSetup(parameter_bytes=FP32_BYTES, boundary_element_bytes=FP32_BYTES)
DEEPSPEED = dataclasses.replace(DEFAULT_CONSTANTS, bucket_elements=5e8)
GROUP = [Endpoint("gh", "GH200-96", "us-central1-a")] * 4


def costs(training: TrainingSetup = FP32, **constants: float) -> CostModel:
    pool = Pool(name="gh", gpu_type="GH200-96", zone="us-central1-a", gpus_per_node=4, nodes=4)
    return PlanningContext(
        model=MODEL,
        cluster=ClusterSnapshot(pools=(pool,)),
        profiles=ProfileSet(),
        training=training,
        constants=dataclasses.replace(DEFAULT_CONSTANTS, **constants),
    ).costs


@pytest.mark.parametrize(("training", "tp", "expected"), [(FP32, 1, 2e9), (FP32, 4, 8e9)])
def test_a_tp_group_bucket_is_the_elements_of_each_rank_at_the_gradient_bytes(
    training: TrainingSetup, tp: int, expected: float
) -> None:
    assert costs(training, bucket_elements=5e8).group_bucket_bytes(tp) == expected
    assert costs(training).group_bucket_bytes(tp) == DEFAULT_CONSTANTS.bucket_bytes
    assert costs(TrainingSetup(), bucket_elements=5e8).group_bucket_bytes(tp) == expected / 2


def test_an_fp32_gradient_under_5e8_elements_is_one_bucket_not_three() -> None:
    nbytes = 3e8 * FP32_BYTES  # 1.2 GB of one TP-1 group
    by_elements = costs(bucket_elements=5e8).allreduce_seconds(nbytes, GROUP, tp=1)
    one_bucket = costs(bucket_bytes=2e9).allreduce_seconds(nbytes, GROUP, tp=1)
    three_buckets = costs(bucket_bytes=5e8).allreduce_seconds(nbytes, GROUP, tp=1)
    assert by_elements == pytest.approx(one_bucket, rel=1e-12)
    assert by_elements < three_buckets


def test_the_same_elements_take_as_many_buckets_in_fp32_as_in_half_precision() -> None:
    elements = 7e8  # two buckets of 5e8 elements in either dtype
    half = costs(TrainingSetup(), bucket_elements=5e8)
    full = costs(FP32, bucket_elements=5e8)
    # twice the bytes in as many buckets: the bandwidth term doubles, the latency stays
    half_s = half.allreduce_seconds(elements * 2, GROUP, tp=1)
    full_s = full.allreduce_seconds(elements * FP32_BYTES, GROUP, tp=1)
    latency = costs(TrainingSetup(), bucket_elements=5e8).allreduce_seconds(1.0, GROUP, tp=1)
    assert full_s == pytest.approx(2 * half_s - 2 * latency, rel=1e-6)
