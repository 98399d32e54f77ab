"""The model-state memory model (planner/simulator/memory.py) and its precision plumbing.

Expected numbers come from the ZeRO paper (Rajbhandari et al. 2020, Sec. 3.1 and Fig. 1:
mixed-precision Adam keeps 2 + 2 + 12 bytes per parameter, ZeRO-1 partitions the 12 and
ZeRO-2 also the gradients' 2), from torch's Adam (two fp32 moments) and from what the
trainer's DeepSpeed configuration allocates (two reduce buckets under ZeRO-1, one under
ZeRO-2); tests/trainer/test_memory_model.py measures the trainer's side.
"""

from __future__ import annotations

import pytest

from sailplan.planner.api import Planned, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.precision import resolve_precision
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator import PlanningContext, simulate
from sailplan.planner.simulator.memory import TrainingSetup, model_state_bytes

P = 1e9
HALF_NO_BUCKETS = {"parameter_bytes": 2, "bucket_elements": 0}


def test_default_is_the_fitted_16_bytes_per_parameter_for_adam_and_8_for_sgd() -> None:
    # the layout the simulator's constants were fitted on: fp16 weights and gradients,
    # fp32 master weights, no ZeRO (ZeRO paper's baseline, 2 + 2 + 12)
    assert model_state_bytes(P, 8, TrainingSetup()).total == 16 * P
    assert model_state_bytes(P, 8, TrainingSetup(), "sgd").total == 8 * P


@pytest.mark.parametrize("replicas", [2, 8, 64])
def test_half_weights_follow_the_zero_paper(replicas: int) -> None:
    one = model_state_bytes(P, replicas, TrainingSetup(zero_stage=1, **HALF_NO_BUCKETS))
    # P_os: 2 + 2 + 12/Nd, plus this rank's reduced share of the gradients (2/Nd)
    assert one.weights + one.master_weights + one.optimizer_states == pytest.approx(
        (2 + 12 / replicas) * P
    )
    assert one.gradients == pytest.approx((2 + 2 / replicas) * P)
    two = model_state_bytes(P, replicas, TrainingSetup(zero_stage=2, **HALF_NO_BUCKETS))
    # P_os+g: 2 + 14/Nd, plus the step's fp32 copy of the share 4/Nd (16-bit gradients
    # accumulate in their partition: no separate fp32 accumulation, measured by
    # tests/trainer/test_memory_model.py)
    assert two.total == pytest.approx((2 + (14 + 4) / replicas) * P)


def test_the_trainer_without_zero_keeps_fp32_weights_gradients_and_adam() -> None:
    states = model_state_bytes(P, 1, TrainingSetup.trainer(zero_stage=1))
    # one replica: the replicated optimizer, fp32 parameters are the master weights
    assert (states.weights, states.gradients, states.master_weights) == (4 * P, 4 * P, 0)
    assert states.optimizer_states == 8 * P
    assert states.buckets == 0


def test_the_trainer_under_zero_1_holds_full_fp32_gradients_and_two_buckets() -> None:
    setup = TrainingSetup.trainer(zero_stage=1)
    states = model_state_bytes(P, 4, setup)
    assert states.weights == 4 * P
    assert states.gradients == 4 * P + P  # full, plus the reduced share in fp32
    assert states.master_weights + states.optimizer_states == 12 * P / 4
    assert states.buckets == 2 * 4 * 2**24  # two fp32 buckets of 2**24 elements


def test_more_replicas_never_cost_a_rank_more() -> None:
    for stage in (1, 2):
        setup = TrainingSetup.trainer(zero_stage=stage)  # type: ignore[arg-type]
        totals = [model_state_bytes(P, d, setup).total for d in (2, 4, 8, 16)]
        assert totals == sorted(totals, reverse=True)


def test_fp32_compute_doubles_activations_and_sends_fp32_boundaries() -> None:
    assert TrainingSetup.trainer(precision="fp32").activation_scale == 2
    assert TrainingSetup.trainer(precision="bf16").activation_scale == 1
    assert TrainingSetup.trainer().gradient_bytes == 4  # fp32 parameters, fp32 all-reduce
    assert TrainingSetup().gradient_bytes == 2


def test_auto_precision_is_bf16_only_where_every_gpu_has_it() -> None:
    catalog = default_catalog()
    assert resolve_precision("auto", ["A100-40", "H100-80"], catalog) == "bf16"
    assert resolve_precision("auto", ["A100-40", "V100-16"], catalog) == "fp16"
    assert resolve_precision("auto", ["T4"], catalog) == "fp16"
    assert resolve_precision("fp32", ["A100-40"], catalog) == "fp32"


def _request(gpu: str, **fields: object) -> PlanRequest:
    cluster = ClusterSnapshot(
        pools=(Pool(name="p", gpu_type=gpu, zone="us-central1-a", gpus_per_node=4, nodes=1),)
    )
    return PlanRequest(
        model=default_catalog().model("OPT-350M"),
        global_batch_size=16,
        cluster=cluster,
        top_k=1,
        **fields,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(("gpu", "expected"), [("A100-40", "bf16"), ("V100-16", "fp16")])
def test_plans_carry_the_resolved_precision(gpu: str, expected: str) -> None:
    result = make_plan(_request(gpu, precision="auto", zero_stage=1))
    assert isinstance(result, Planned), result
    assert result.best.precision == expected
    fp32 = make_plan(_request(gpu))
    assert isinstance(fp32, Planned), fp32
    assert fp32.best.precision == "fp32"
    # 16-bit parameters by default under a 16-bit precision (DeepSpeed's bf16/fp16 mode),
    # never under fp32; a request may keep fp32 parameters
    assert result.best.half_parameters and not fp32.best.half_parameters
    kept = make_plan(_request(gpu, precision="auto", zero_stage=1, half_parameters=False))
    assert isinstance(kept, Planned), kept
    assert not kept.best.half_parameters


def test_plans_with_half_parameters_are_priced_with_them() -> None:
    request = _request("A100-40", precision="bf16", zero_stage=1)
    result = make_plan(request)
    assert isinstance(result, Planned), result
    best = result.best
    assert best.predictions is not None and best.half_parameters
    from sailplan.planner.profiles.estimate import complete_profiles

    catalog = default_catalog()
    profiles = complete_profiles(
        request.model,
        ["A100-40"],
        sorted({s.tensor_parallel for s in best.stages}),
        [best.micro_batch_size],
        measured=ProfileSet(),
        catalog=catalog,
    )

    def context(half: bool) -> PlanningContext:
        training = TrainingSetup.trainer(zero_stage=1, precision="bf16", half_parameters=half)
        return PlanningContext(
            model=request.model,
            cluster=request.cluster,
            profiles=profiles,
            catalog=catalog,
            training=training,
        )

    bare = best.model_copy(update={"predictions": None})
    assert simulate(bare, context(True)).stages == best.predictions.stages
    # fp32 parameters would hold more on every stage
    fp32_states = simulate(bare, context(False)).stages
    for half, full in zip(best.predictions.stages, fp32_states, strict=True):
        assert half.peak_memory_bytes < full.peak_memory_bytes


def test_the_search_prices_memory_with_the_trainer_setup_it_was_asked_for() -> None:
    request = _request("A100-40", zero_stage=2)
    result = make_plan(request)
    assert isinstance(result, Planned), result
    best = result.best
    assert best.predictions is not None
    from sailplan.planner.profiles.estimate import complete_profiles

    catalog = default_catalog()
    tps = sorted({s.tensor_parallel for s in best.stages})
    profiles = complete_profiles(
        request.model,
        ["A100-40"],
        tps,
        [best.micro_batch_size],
        measured=ProfileSet(),
        catalog=catalog,
    )
    trainer = PlanningContext(
        model=request.model,
        cluster=request.cluster,
        profiles=profiles,
        catalog=catalog,
        training=TrainingSetup.trainer(zero_stage=2, precision="fp32"),
    )
    fitted = PlanningContext(
        model=request.model, cluster=request.cluster, profiles=profiles, catalog=catalog
    )
    bare = best.model_copy(update={"predictions": None})
    assert simulate(bare, trainer).stages == best.predictions.stages
    # fp32 gradients: the trainer's all-reduce moves twice the fitted layout's fp16 bytes
    if best.data_parallel > 1:
        assert simulate(bare, trainer).allreduce_seconds > simulate(bare, fitted).allreduce_seconds


def test_half_parameters_are_16_bit_weights_gradients_and_boundaries_over_fp32_masters() -> None:
    half = TrainingSetup.trainer(zero_stage=1, precision="bf16", half_parameters=True)
    assert (half.parameter_bytes, half.gradient_bytes, half.boundary_element_bytes) == (2, 2, 2)
    states = model_state_bytes(P, 4, half)
    fp32 = model_state_bytes(P, 4, TrainingSetup.trainer(zero_stage=1, precision="bf16"))
    # the weights and gradients halve; the fp32 master partition and Adam do not
    assert states.weights == fp32.weights / 2
    assert states.gradients == fp32.gradients / 2
    assert states.master_weights + states.optimizer_states == 12 * P / 4
    # ZeRO-0: the replicated optimizer's own fp32 copy, 2 + 2 + 12 bytes per parameter
    zero0 = TrainingSetup.trainer(zero_stage=0, precision="bf16", half_parameters=True)
    assert model_state_bytes(P, 1, zero0).total == 16 * P
    # fp32 compute has no 16-bit type to keep the parameters in
    fp32_compute = TrainingSetup.trainer(precision="fp32", half_parameters=True)
    assert fp32_compute.parameter_bytes == fp32_compute.boundary_element_bytes == 4
