"""Plans whose right shape follows from first principles, asserted on properties.

Roofline-estimated profiles (no artifact needed), small clusters so the search is fast:
- a small model on one NVLink node: data parallelism (the gradient all-reduce of a 350M
  model is milliseconds over NVLink, far less than what pipeline bubbles cost);
- a model too large for one GPU: split by TP or PP, and no stage over its GPU's memory;
- a far region behind a 100 Mbit/s link: no stage boundary or all-reduce crosses it when
  the near zone has GPUs enough;
- A100 + V100 in one pipeline: an A100 GPU holds more layers than a V100 GPU;
- more GPUs of the same kind never lower the best plan's predicted throughput.
The chosen plan against exhaustive enumeration lives in test_optimality.py.
"""

from __future__ import annotations

from sailplan.planner.api import Planned, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.types import BandwidthCurve, NetworkProfile, ProfileSet, Provenance

CATALOG = default_catalog()


def best(
    model: str,
    batch: int,
    *pools: Pool,
    max_depth: int | None = None,
    measured: ProfileSet | None = None,
) -> Plan:
    request = PlanRequest(
        model=CATALOG.model(model),
        global_batch_size=batch,
        cluster=ClusterSnapshot(pools=pools),
        top_k=1,
        max_pipeline_depth=max_depth,
    )
    result = make_plan(request, measured, catalog=CATALOG)
    assert isinstance(result, Planned), result
    return result.best


def a100(zone: str = "us-central1-a", nodes: int = 1, name: str = "a") -> Pool:
    return Pool(name=name, gpu_type="A100-40", zone=zone, gpus_per_node=8, nodes=nodes)


def test_small_model_on_one_nvlink_node_is_data_parallel() -> None:
    plan = best("OPT-350M", 64, a100())
    assert plan.data_parallel >= 4
    assert plan.pipeline_depth == 1


def test_a_model_too_big_for_one_gpu_is_split_and_fits() -> None:
    model = CATALOG.model("GPT-Neo-2.7B")
    # 2.7e9 parameters x 16 bytes of mixed-precision Adam state >> 16 GiB of one V100
    assert model.total_parameters() * 16 > CATALOG.gpu("V100-16").memory_bytes
    v100 = Pool(name="v", gpu_type="V100-16", zone="us-central1-a", gpus_per_node=8, nodes=2)
    plan = best("GPT-Neo-2.7B", 16, v100)
    for stage in plan.stages:
        assert stage.tensor_parallel * plan.pipeline_depth > 1
    assert plan.predictions is not None
    for stage_prediction in plan.predictions.stages:
        assert stage_prediction.peak_memory_bytes <= CATALOG.gpu("V100-16").memory_bytes


def test_a_slow_inter_region_link_carries_no_stage_boundary_and_no_all_reduce() -> None:
    # 100 Mbit/s between the regions: one OPT-350M activation (4 MB) takes 0.3 s there,
    # ten times a stage's compute, and the far pool adds only a third more GPUs
    slow = NetworkProfile(
        link="inter-region",
        curve=BandwidthCurve(
            coefficients=(0.0, 0.0, 0.0125), max_bytes_per_s=12.5e6, min_bytes_per_s=12.5e6
        ),
        provenance=Provenance(source="measured", tool="test"),
    )
    plan = best(
        "OPT-350M",
        64,
        a100("us-central1-a", nodes=2, name="near"),
        a100("europe-west4-a", name="far"),
        measured=ProfileSet(network=(slow,)),
    )
    assert len({worker.zone for worker in plan.workers()}) == 1


def test_mixed_a100_v100_gives_the_faster_gpu_more_layers() -> None:
    plan = best(
        "OPT-350M",
        64,
        Pool(name="a", gpu_type="A100-40", zone="us-central1-a", gpus_per_node=4, nodes=1),
        Pool(name="v", gpu_type="V100-16", zone="us-central1-a", gpus_per_node=4, nodes=1),
        max_depth=2,
    )
    per_gpu: dict[str, list[float]] = {}
    for stage in plan.stages:
        # each GPU of a replica holds 1/TP of the stage's layers
        layers = (stage.layer_end - stage.layer_start) / stage.tensor_parallel
        for replica in stage.replicas:
            per_gpu.setdefault(replica.gpu_type, []).append(layers)
    assert set(per_gpu) == {"A100-40", "V100-16"}
    assert min(per_gpu["A100-40"]) > max(per_gpu["V100-16"])


def test_more_gpus_never_lower_the_best_throughput() -> None:
    small = best("OPT-350M", 64, a100(nodes=1))
    large = best("OPT-350M", 64, a100(nodes=2))
    assert small.predictions is not None and large.predictions is not None
    assert large.predictions.samples_per_second >= small.predictions.samples_per_second * 0.999
