"""simulate() on tiny synthetic profiles, where every prediction can be computed by hand."""

from __future__ import annotations

import dataclasses

import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.types import (
    BandwidthCurve,
    ComputeProfile,
    NetworkProfile,
    ProfileSet,
    Provenance,
)
from sailplan.planner.simulator import (
    MissingProfileError,
    PlanningContext,
    SimulatorConstants,
    one_f_one_b_seconds,
    profile_refs,
    simulate,
)
from sailplan.planner.simulator.collectives import NCCL_BASE_LATENCY_S, NETWORK_HOP_LATENCY_S

MODEL = ModelSpec(
    name="tiny", hidden_size=64, num_blocks=4, num_heads=4, vocab_size=128, sequence_length=32
)  # 6 layers: embedding, 4 blocks, head
MEASURED = Provenance(source="measured", tool="test")
BANDWIDTH = 1e6  # bytes/s on every inter-node link: slow enough that transfers show
CONSTANTS = SimulatorConstants()


def compute(gpu: str, mbs: int, layer_s: float, tp: int = 1) -> ComputeProfile:
    """Forward `layer_s`, backward 2 x layer_s, update 0.1 ms per layer, times scale with mbs."""
    n = MODEL.num_layers
    return ComputeProfile(
        model="tiny",
        gpu_type=gpu,
        tensor_parallel=tp,
        micro_batch_size=mbs,
        forward_s=(layer_s * mbs,) * n,
        backward_s=(2 * layer_s * mbs,) * n,
        update_s=(1e-4,) * n,
        provenance=MEASURED,
    )


def flat(rate: float) -> BandwidthCurve:
    return BandwidthCurve(
        coefficients=(0.0, 0.0, rate / 1e9), max_bytes_per_s=rate, min_bytes_per_s=rate
    )


PROFILES = ProfileSet(
    compute=tuple(
        compute(gpu, mbs, layer_s)
        for gpu, layer_s in (("A100-40", 1e-3), ("V100-16", 3e-3))
        for mbs in (1, 2, 4)
    ),
    network=tuple(
        NetworkProfile(link=link, curve=flat(BANDWIDTH), provenance=MEASURED)
        for link in ("intra-zone", "inter-zone", "inter-region")
    ),
)
CLUSTER = ClusterSnapshot(
    pools=(
        Pool(name="a100-a", gpu_type="A100-40", zone="us-central1-a", nodes=8),
        Pool(name="a100-b", gpu_type="A100-40", zone="us-central1-b", nodes=8),
        Pool(name="v100-a", gpu_type="V100-16", zone="us-central1-a", nodes=8),
    )
)
A = Replica(pool="a100-a", gpu_type="A100-40", zone="us-central1-a")
B = Replica(pool="a100-b", gpu_type="A100-40", zone="us-central1-b")
V = Replica(pool="v100-a", gpu_type="V100-16", zone="us-central1-a")


def context(constants: SimulatorConstants = CONSTANTS) -> PlanningContext:
    return PlanningContext(model=MODEL, cluster=CLUSTER, profiles=PROFILES, constants=constants)


def plan(
    cuts: tuple[int, ...], replicas: list[tuple[Replica, ...]], mbs: int = 1, micro: int = 4
) -> Plan:
    bounds = (0, *cuts, MODEL.num_layers)
    stages = tuple(
        Stage(layer_start=bounds[i], layer_end=bounds[i + 1], replicas=replicas[i])
        for i in range(len(bounds) - 1)
    )
    dp = len(replicas[0])
    return Plan(
        model=MODEL,
        global_batch_size=mbs * micro * dp,
        micro_batch_size=mbs,
        num_micro_batches=micro,
        stages=stages,
    )


def test_single_stage_is_micro_batches_times_compute_plus_update() -> None:
    p = simulate(plan((), [(A,)], micro=4), context())
    # 6 layers x (1 + 2) ms per micro-batch, 4 micro-batches, then 6 x 0.1 ms of update
    assert p.pipeline_seconds == pytest.approx(4 * 6 * 3e-3)
    assert p.iteration_seconds == pytest.approx(4 * 6 * 3e-3 + 6 * 1e-4)
    assert p.samples_per_second == pytest.approx(4 / p.iteration_seconds)


def test_two_stage_1f1b_matches_the_hand_computed_schedule() -> None:
    p = simulate(plan((3,), [(A,), (A,)], micro=4), context())
    t = 3 * 3e-3  # each stage: 3 layers x (1 ms forward + 2 ms backward)
    # one fp16 activation of 32 tokens x 64 hidden over 1 MB/s, after one network hop
    x = NETWORK_HOP_LATENCY_S + 2 * 32 * 64 / BANDWIDTH
    # warm-up + cool-down: the first micro-batch crosses both stages and the boundary both
    # ways; the other 3 leave at the bottleneck cycle (a stage's compute plus its transfer).
    expected = (t + t) + 2 * x + 3 * (t + x)
    assert p.pipeline_seconds == pytest.approx(expected)
    assert p.iteration_seconds == pytest.approx(expected + 3 * 1e-4)  # both stages update 3 layers
    assert [s.forward_backward_seconds for s in p.stages] == pytest.approx([t, t])


def test_1f1b_formula_is_the_textbook_one_for_equal_stages() -> None:
    # (M + P - 1) x (f + b) for P equal stages and free communication (Narayanan et al. 2021)
    assert one_f_one_b_seconds([2.0] * 4, [0.0] * 3, 8) == pytest.approx((8 + 4 - 1) * 2.0)


def test_blocking_sends_pay_each_boundary_twice_per_cycle_and_never_for_one_stage() -> None:
    # Two stages of 2 s with a 0.5 s boundary, 4 micro-batches. Paired exchanges
    # (Sailplan's trainer): the last stage receives an activation and sends a gradient back
    # in one exchange per cycle, 2 + 0.5; warm-up and cool-down cross the boundary once each
    # way: (2 + 2) + 2 x 0.5 + 3 x 2.5 = 12.5. DeepSpeed's separate blocking receive and
    # send: 2 + 2 x 0.5 per cycle, 5 + 3 x 3 = 14.
    assert one_f_one_b_seconds([2.0, 2.0], [0.5], 4) == pytest.approx(12.5)
    assert one_f_one_b_seconds([2.0, 2.0], [0.5], 4, blocking_p2p=True) == pytest.approx(14.0)
    # a middle stage exchanges with both neighbours
    assert one_f_one_b_seconds([1.0, 1.0, 1.0], [0.5, 0.5], 2, blocking_p2p=True) == (
        pytest.approx(3.0 + 2.0 + 1.0 * (1.0 + 2 * (0.5 + 0.5)))
    )
    assert one_f_one_b_seconds([2.0], [], 4, blocking_p2p=True) == pytest.approx(8.0)


def test_a_slower_replica_slows_its_stage_and_the_iteration() -> None:
    fast = simulate(plan((), [(A, A)]), context())
    mixed = simulate(plan((), [(A, V)]), context())
    assert mixed.stages[0].forward_backward_seconds == pytest.approx(6 * 3 * 3e-3)  # the V100's
    assert mixed.iteration_seconds > fast.iteration_seconds


def test_cross_zone_stages_pay_egress_and_same_zone_ones_do_not() -> None:
    same = simulate(plan((3,), [(A,), (A,)], micro=4), context())
    cross = simulate(plan((3,), [(A,), (B,)], micro=4), context())
    assert same.egress_bytes_per_iteration == 0
    boundary = 2 * 32 * 64
    # every micro-batch's activation goes forward and its gradient comes back
    assert cross.egress_bytes_per_iteration == pytest.approx(2 * 4 * boundary)
    gpu_cost = 2 * 3.67 * cross.iteration_seconds / 3600  # two A100-40 at the list price
    egress_cost = 2 * 4 * boundary / 1e9 * 0.01  # zones of one region: 0.01 USD/GB
    assert cross.usd_per_iteration == pytest.approx(gpu_cost + egress_cost)
    assert same.usd_per_iteration == pytest.approx(2 * 3.67 * same.iteration_seconds / 3600)


def test_data_parallel_ring_all_reduce_and_its_egress() -> None:
    p = simulate(plan((), [(A, A, B, B)]), context())
    grads = 2 * MODEL.total_parameters()  # fp16 gradients of the whole model
    # ring all-reduce over 4 one-GPU nodes: 2 (N - 1) network hops, NCCL's base latency
    ring = 2 * 3 / 4 * grads / BANDWIDTH + 2 * 3 * NETWORK_HOP_LATENCY_S + NCCL_BASE_LATENCY_S
    assert p.allreduce_seconds == pytest.approx(ring)
    # the zone-sorted ring a, a, b, b crosses zones twice (b -> a closes the ring)
    assert p.egress_bytes_per_iteration == pytest.approx(2 * (2 * 3 / 4 * grads))


def test_overlapping_the_all_reduce_hides_what_the_last_backward_covers() -> None:
    grads = 2 * MODEL.total_parameters()
    buckets = dataclasses.replace(CONSTANTS, bucket_bytes=grads / 4)  # four equal buckets
    exposed = simulate(plan((), [(A, A)]), context(buckets))
    hidden = simulate(
        plan((), [(A, A)]), context(dataclasses.replace(buckets, overlap_allreduce=True))
    )
    backward = 6 * 2e-3  # the last micro-batch's backward runs under the reduction
    per_bucket_latency = 2 * NETWORK_HOP_LATENCY_S + NCCL_BASE_LATENCY_S
    last_bucket = 2 * 1 / 2 * (grads / 4) / BANDWIDTH + per_bucket_latency
    assert exposed.allreduce_seconds == pytest.approx(
        2 * 1 / 2 * grads / BANDWIDTH + 4 * per_bucket_latency
    )
    assert hidden.allreduce_seconds == pytest.approx(
        max(exposed.allreduce_seconds - backward, last_bucket)
    )


def test_pool_price_override_beats_the_catalog() -> None:
    cluster = ClusterSnapshot(
        pools=(
            Pool(
                name="a100-a",
                gpu_type="A100-40",
                zone="us-central1-a",
                nodes=1,
                usd_per_gpu_hour=1.0,
            ),
        )
    )
    ctx = PlanningContext(model=MODEL, cluster=cluster, profiles=PROFILES, constants=CONSTANTS)
    p = simulate(plan((), [(A,)]), ctx)
    assert p.usd_per_hour == pytest.approx(1.0)


def test_peak_memory_grows_with_micro_batch_size() -> None:
    peaks = [
        simulate(plan((3,), [(A,), (A,)], mbs=m), context()).peak_memory_bytes for m in (1, 2, 4)
    ]
    assert peaks[0] < peaks[1] < peaks[2]


def test_peak_memory_falls_with_more_stages() -> None:
    # weights and optimizer states split across stages; 1F1B's first stage still holds P
    # micro-batches of its L/P layers, so activations do not grow
    big = ModelSpec(
        name="tiny", hidden_size=256, num_blocks=4, num_heads=4, vocab_size=128, sequence_length=32
    )
    ctx = PlanningContext(model=big, cluster=CLUSTER, profiles=PROFILES, constants=CONSTANTS)

    def peak(cuts: tuple[int, ...]) -> int:
        p = plan(cuts, [(A,)] * (len(cuts) + 1))
        return simulate(p.model_copy(update={"model": big}), ctx).peak_memory_bytes

    assert peak(()) > peak((3,)) > peak((2, 4))


def test_stage_memory_counts_states_in_flight_activations_and_overhead() -> None:
    ctx = context()
    p = simulate(plan((3,), [(A,), (A,)], micro=4), ctx)
    table = ctx.costs.require_table("A100-40", 1, 1)
    states = table.parameters(0, 3) * 16  # mixed-precision Adam: 16 bytes per parameter
    # stage 0 of 2 holds 2 micro-batches of activations under 1F1B
    activations = 2 * table.activation_bytes(0, 3) * CONSTANTS.activation_allocator_factor
    assert p.stages[0].peak_memory_bytes == int(
        states + activations + CONSTANTS.framework_overhead_bytes
    )


def test_a_missing_profile_is_a_clear_error() -> None:
    with pytest.raises(MissingProfileError, match="no usable compute profile for tiny on A100-40"):
        simulate(plan((), [(A,)], mbs=8), context())


def test_catalog_gpu_memory_is_the_capacity() -> None:
    assert (
        context().costs.gpu_memory_bytes("A100-40") == default_catalog().gpu("A100-40").memory_bytes
    )


def test_profile_refs_list_what_the_prediction_used_and_flag_estimates() -> None:
    refs = {r.key: r.source for r in profile_refs(plan((3,), [(A, V), (A, V)]), context())}
    assert refs["compute/tiny/A100-40/tp1/mbs1"] == "measured"
    assert refs["compute/tiny/V100-16/tp1/mbs1"] == "measured"
    assert refs["network/intra-zone"] == "measured"  # the generic same-zone profile
    # the nodes' NICs under the pipeline and the all-reduce, by node shape: priced from the
    # measured same-zone flow, so measured
    nics = {"network/intra-zone/A100-40/A100-40/n1", "network/intra-zone/V100-16/V100-16/n1"}
    assert set(refs) == {
        "compute/tiny/A100-40/tp1/mbs1",
        "compute/tiny/V100-16/tp1/mbs1",
        "network/intra-zone",
        *nics,
    }
    assert {refs[key] for key in nics} == {"measured"}


def test_a_pool_missing_from_the_cluster_is_a_clear_error() -> None:
    stray = Replica(pool="gone", gpu_type="A100-40", zone="us-central1-a")
    with pytest.raises(MissingProfileError, match="pool 'gone'"):
        simulate(plan((), [(stray,)]), context())
