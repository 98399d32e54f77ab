"""The energy model and the frequency planner (planner/energy), from first principles.

- the power model: the datasheet TDP at the maximum clock, falling with the clock, and an
  energy optimum strictly inside the clock range for compute-bound work;
- a pipeline's per-pass clocks (solve, Perseus' two clocks per stage): at the fastest
  deadline the time is the default-clock time and the energy never above the default; a
  stage with slack gets a lower clock than the critical one; identical stages have no
  steady-state slack; the frontier is monotone (the one-clock solver, what the node agent
  applies, is checked against exhaustive enumeration in test_energy_single_clock.py);
- a Plan: the no-slowdown time is simulate()'s iteration time, one clock per GPU costs
  the short stage its slack at no slowdown and a small slowdown buys it back, helper GPUs
  and uneven data splits slow down, a measured PowerProfile overrides the datasheet;
- bad input: an unknown GPU, a negative price, an inconsistent profile.
"""

from __future__ import annotations

import itertools
import math

import pytest
from pydantic import ValidationError

from sailplan.planner.catalog import default_catalog, load_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.energy import (
    EnergyError,
    EnergyModel,
    PipelineProblem,
    PowerPoint,
    PowerProfile,
    StageOptions,
    clock_scaled_share,
    default_clocks,
    modelled_watts,
    pipeline_seconds,
    plan_energy,
    simulate_energy,
    solve,
    usd_for,
    with_energy,
)
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.types import ProfileSet, Provenance
from sailplan.planner.simulator import PlanningContext, simulate

CATALOG = default_catalog()
ZONE = "us-central1-a"


# -- the power model -------------------------------------------------------------------


def test_every_packaged_gpu_has_power_data_with_tdp_at_the_maximum_clock() -> None:
    model = EnergyModel(CATALOG)
    for name, spec in CATALOG.gpus.items():
        assert spec.power is not None, name
        curve = model.curve(name)
        assert curve.mhz[0] == spec.power.max_sm_mhz
        assert math.isclose(curve.load_watts[0], spec.power.tdp_watts)
        assert all(b < a for a, b in itertools.pairwise(curve.load_watts))
        assert curve.blocking_watts == spec.power.idle_watts
        assert curve.source == "datasheet"


def test_compute_bound_energy_has_an_optimum_inside_the_clock_range() -> None:
    spec = CATALOG.gpu("A100-40")
    assert spec.power is not None
    curve = EnergyModel(CATALOG).curve("A100-40")
    factors = curve.time_factors(1.0)  # fully compute bound: t ~ 1/f
    energy = [
        (w - curve.blocking_watts) * t for w, t in zip(curve.load_watts, factors, strict=True)
    ]
    best = min(range(len(energy)), key=energy.__getitem__)
    assert 0 < best < len(energy) - 1
    assert energy[best] < energy[0]
    assert math.isclose(modelled_watts(spec, spec.power.max_sm_mhz), spec.power.tdp_watts)


def test_memory_bound_time_does_not_scale_with_the_clock() -> None:
    curve = EnergyModel(CATALOG).curve("A100-40")
    assert set(curve.time_factors(0.0)) == {1.0}
    half = curve.time_factors(0.5)
    full = curve.time_factors(1.0)
    assert all(h <= f for h, f in zip(half, full, strict=True))
    lowest = curve.mhz[-1]
    assert math.isclose(full[-1], curve.mhz[0] / lowest)


def test_clock_scaled_share_is_a_fraction_and_grows_with_the_micro_batch() -> None:
    model = CATALOG.model("GPT3-XL")
    spec = CATALOG.gpu("A100-40")
    one = clock_scaled_share(model, spec, 1, 25, tp=1, mbs=1)
    eight_tp = clock_scaled_share(model, spec, 1, 25, tp=8, mbs=1)
    assert 0.0 < one < 1.0
    assert eight_tp < one  # TP all-reduces do not follow the SM clock


# -- one pipeline's clocks -------------------------------------------------------------


def _stage(
    base: float, links: float = 0.0, gpu: str = "A100-40", share: float = 0.8
) -> StageOptions:
    curve = EnergyModel(CATALOG).curve(gpu)
    seconds = [base * x for x in curve.time_factors(share)]
    joules = [
        (w - curve.blocking_watts) * t for w, t in zip(curve.load_watts, seconds, strict=True)
    ]
    return StageOptions(
        mhz=curve.mhz, seconds=tuple(seconds), effective_joules=tuple(joules), links=links
    )


def test_no_slowdown_keeps_the_default_time_and_never_costs_more_energy() -> None:
    problem = PipelineProblem(
        stages=(_stage(0.10), _stage(0.06), _stage(0.09), _stage(0.03)), micro_batches=16
    )
    default = default_clocks(problem)
    best = solve(problem, default.seconds)
    assert best.seconds <= default.seconds * (1 + 1e-12)
    assert math.isclose(best.seconds, default.seconds, rel_tol=1e-12)
    assert best.effective_joules < default.effective_joules
    assert math.isclose(
        pipeline_seconds(problem, best.fill, best.steady), best.seconds, rel_tol=1e-12
    )


def test_a_stage_with_slack_gets_a_lower_clock_than_the_critical_one() -> None:
    problem = PipelineProblem(stages=(_stage(0.10), _stage(0.05)), micro_batches=8)
    best = solve(problem, default_clocks(problem).seconds)
    critical, slack = best.steady_mhz(problem)
    assert critical == CATALOG.gpu("A100-40").power.max_sm_mhz  # type: ignore[union-attr]
    assert slack < critical
    # the warm-up/cool-down pass is on the critical path of every stage: never slowed here
    assert set(best.fill_mhz(problem)) == {critical}


def test_identical_stages_have_no_steady_state_slack() -> None:
    top = CATALOG.gpu("A100-40").power.max_sm_mhz  # type: ignore[union-attr]
    problem = PipelineProblem(stages=(_stage(0.05),) * 4, micro_batches=32)
    default = default_clocks(problem)
    best = solve(problem, default.seconds)
    assert set(best.steady_mhz(problem)) == {top}
    assert math.isclose(best.effective_joules, default.effective_joules)
    # with transfers, only the end stages (one link instead of two) have a little slack
    link = 0.001
    problem = PipelineProblem(
        stages=(
            _stage(0.05, link),
            _stage(0.05, 2 * link),
            _stage(0.05, 2 * link),
            _stage(0.05, link),
        ),
        micro_batches=32,
        fill_links=6 * link,
    )
    default = default_clocks(problem)
    best = solve(problem, default.seconds)
    steady = best.steady_mhz(problem)
    assert steady[1] == steady[2] == top
    saved = 1 - best.effective_joules / default.effective_joules
    assert 0.0 <= saved < 0.02


def test_frontier_of_a_pipeline_is_monotone_in_the_deadline() -> None:
    problem = PipelineProblem(stages=(_stage(0.10), _stage(0.07), _stage(0.04)), micro_batches=12)
    fastest = default_clocks(problem).seconds
    previous = math.inf
    for slowdown in (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4):
        deadline = fastest * (1 + slowdown)
        found = solve(problem, deadline)
        assert found.seconds <= deadline * (1 + 1e-12)
        assert found.effective_joules <= previous * (1 + 1e-12)
        previous = found.effective_joules


def test_stage_options_must_be_sorted_fastest_first() -> None:
    with pytest.raises(ValueError, match="fastest first"):
        StageOptions(mhz=(1000, 1100), seconds=(2.0, 1.0), effective_joules=(1.0, 1.0))


# -- a plan ------------------------------------------------------------------------------


def _context(model_name: str, pools: list[Pool], gpus: list[str], mbs: int) -> PlanningContext:
    model = CATALOG.model(model_name)
    profiles = complete_profiles(model, gpus, [1], [mbs], measured=ProfileSet(), catalog=CATALOG)
    profiles = complete_profiles(model, gpus, [], [], measured=profiles, catalog=CATALOG)
    return PlanningContext(
        model=model, cluster=ClusterSnapshot(pools=tuple(pools)), profiles=profiles, catalog=CATALOG
    )


def _plan(
    model_name: str,
    splits: list[int],
    replicas: list[list[Replica]],
    *,
    mbs: int = 1,
    micro_batches: int = 16,
    pipeline_micro_batches: tuple[int, ...] | None = None,
) -> Plan:
    model = CATALOG.model(model_name)
    bounds = [0, *splits, model.num_layers]
    dp = len(replicas[0])
    total = sum(pipeline_micro_batches) if pipeline_micro_batches else micro_batches * dp
    return Plan(
        model=model,
        global_batch_size=mbs * total,
        micro_batch_size=mbs,
        num_micro_batches=max(pipeline_micro_batches) if pipeline_micro_batches else micro_batches,
        pipeline_micro_batches=pipeline_micro_batches,
        stages=tuple(
            Stage(layer_start=a, layer_end=b, replicas=tuple(reps))
            for a, b, reps in zip(bounds[:-1], bounds[1:], replicas, strict=True)
        ),
    )


A100 = Replica(pool="a100", gpu_type="A100-40", zone=ZONE)
H100 = Replica(pool="h100", gpu_type="H100-80", zone=ZONE)
POOLS = [
    Pool(name="a100", gpu_type="A100-40", zone=ZONE, gpus_per_node=8, nodes=1),
    Pool(name="h100", gpu_type="H100-80", zone=ZONE, gpus_per_node=8, nodes=1),
]


def test_no_slowdown_time_is_the_simulators_and_the_short_stage_slows_down() -> None:
    context = _context("GPT3-XL", POOLS, ["A100-40", "H100-80"], 1)
    plan = _plan("GPT3-XL", [19], [[A100], [A100]])  # 19 layers against 7: stage 1 has slack
    predictions = simulate(plan, context)
    report = plan_energy(plan, context, frontier_points=20, per_pass=True)
    assert math.isclose(report.default.iteration_seconds, predictions.iteration_seconds)
    assert math.isclose(
        report.no_slowdown.iteration_seconds, predictions.iteration_seconds, rel_tol=1e-12
    )
    # one clock per GPU: the short stage's every pass, its fill pass too, would lengthen
    # the iteration, so at no slowdown nothing slows down
    assert report.no_slowdown.fill_mhz == report.no_slowdown.steady_mhz == ((1410,), (1410,))
    assert math.isclose(
        report.no_slowdown.joules_per_iteration, report.default.joules_per_iteration
    )
    # per-pass switching (reported, not applied) slows the short stage's steady passes only
    assert report.per_pass is not None
    assert math.isclose(report.per_pass.iteration_seconds, predictions.iteration_seconds)
    per_pass_saved = report.per_pass_saved_fraction
    assert per_pass_saved is not None and per_pass_saved > 0.02
    (critical,), (slack,) = report.per_pass.steady_mhz
    assert slack < critical == 1410
    assert report.per_pass.fill_mhz == ((1410,), (1410,))
    # 1% of time lets the one clock of the short stage fall: its fill pass is one of M
    slowed = plan_energy(plan, context, max_slowdown=0.01).chosen
    assert slowed.iteration_seconds <= 1.01 * predictions.iteration_seconds * (1 + 1e-12)
    (critical,), (slack,) = slowed.steady_mhz
    assert slowed.fill_mhz == slowed.steady_mhz and slack < critical
    assert slowed.joules_per_iteration < (1 - 0.02) * report.default.joules_per_iteration
    # the frontier starts at the no-slowdown point and trades time for energy
    frontier = report.frontier
    assert frontier[0] == report.no_slowdown
    assert len(frontier) > 2
    for faster, slower in itertools.pairwise(frontier):
        assert slower.iteration_seconds > faster.iteration_seconds
        assert slower.joules_per_iteration < faster.joules_per_iteration


def test_a_balanced_split_saves_less_than_an_unbalanced_one() -> None:
    context = _context("GPT3-XL", POOLS, ["A100-40"], 1)
    # 14 of 26 layers (embedding + 13 blocks | 11 blocks + the vocabulary head) is the
    # split with the least bottleneck; 19 leaves stage 1 idle over half of each cycle
    times = {
        k: max(
            s.forward_backward_seconds
            for s in simulate(_plan("GPT3-XL", [k], [[A100], [A100]]), context).stages
        )
        for k in range(1, 25)
    }
    assert min(times, key=times.__getitem__) == 14
    balanced = plan_energy(_plan("GPT3-XL", [14], [[A100], [A100]]), context, per_pass=True)
    unbalanced = plan_energy(_plan("GPT3-XL", [19], [[A100], [A100]]), context, per_pass=True)
    assert balanced.per_pass_saved_fraction is not None
    assert unbalanced.per_pass_saved_fraction is not None
    assert balanced.per_pass_saved_fraction < unbalanced.per_pass_saved_fraction
    assert balanced.per_pass_saved_fraction < 0.01


def test_a_faster_helper_replica_runs_at_a_lower_clock() -> None:
    context = _context("GPT3-XL", POOLS, ["A100-40", "H100-80"], 1)
    plan = _plan("GPT3-XL", [13], [[A100, H100], [A100, H100]])
    report = plan_energy(plan, context)
    for stage_clocks in report.no_slowdown.steady_mhz:
        a100, h100 = stage_clocks
        assert a100 <= 1410
        assert h100 < 1980  # the H100 pipeline waits for the A100 one at the all-reduce
    assert math.isclose(
        report.no_slowdown.iteration_seconds, simulate(plan, context).iteration_seconds
    )


def test_an_uneven_split_lets_the_short_pipeline_slow_down() -> None:
    context = _context("GPT3-XL", POOLS, ["A100-40"], 1)
    plan = _plan("GPT3-XL", [13], [[A100, A100], [A100, A100]], pipeline_micro_batches=(16, 12))
    report = plan_energy(plan, context)
    long_pipeline = [stage[0] for stage in report.no_slowdown.steady_mhz]
    short_pipeline = [stage[1] for stage in report.no_slowdown.steady_mhz]
    assert min(short_pipeline) < min(long_pipeline)
    assert math.isclose(
        report.no_slowdown.iteration_seconds, simulate(plan, context).iteration_seconds
    )


def test_predictions_gain_energy_fields_and_stay_backward_compatible() -> None:
    context = _context("GPT3-XL", POOLS, ["A100-40"], 1)
    plan = _plan("GPT3-XL", [19], [[A100], [A100]])
    predictions = simulate_energy(plan, context)
    assert predictions.energy is not None
    assert (
        predictions.energy.joules_per_iteration <= predictions.energy.joules_per_iteration_default
    )
    assert len(predictions.energy.stage_clocks) == 2
    annotated = with_energy(plan, context)
    assert Plan.from_json(annotated.to_json()) == annotated
    # a document written before the energy fields existed still loads
    old = simulate(plan, context).model_dump()
    del old["energy"]
    assert type(predictions).model_validate(old).energy is None


def test_a_measured_power_profile_overrides_the_datasheet() -> None:
    context = _context("GPT3-XL", POOLS, ["A100-40"], 1)
    plan = _plan("GPT3-XL", [19], [[A100], [A100]])
    profile = PowerProfile(
        gpu_type="nvidia-tesla-a100",  # aliases resolve
        points=(
            PowerPoint(sm_mhz=1410, watts=380.0, time_factor=1.0),
            PowerPoint(sm_mhz=1200, watts=300.0, time_factor=1.12),
            PowerPoint(sm_mhz=1000, watts=240.0, time_factor=1.3),
        ),
        idle_watts=50.0,
        provenance=Provenance(source="measured", tool="test"),
    )
    report = plan_energy(plan, context, profiles=[profile])
    assert report.source == "measured"
    assert {m for stage in report.no_slowdown.steady_mhz for m in stage} <= {1410, 1200, 1000}
    datasheet = plan_energy(plan, context)
    assert report.default.joules_per_iteration != datasheet.default.joules_per_iteration


# -- bad input -------------------------------------------------------------------------


def test_an_unknown_gpu_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(EnergyError) as error:
        EnergyModel(CATALOG).curve("Z100")
    message = str(error.value)
    assert "\n" not in message and "Z100" in message and "A100-40" in message
    # a user catalog entry without power fields cannot be priced in energy
    extra = load_catalog(
        {
            "gpus": {
                "X1": {
                    "memory_gib": 80,
                    "peak_flops": 1e15,
                    "memory_bandwidth_bytes_per_s": 3e12,
                    "gpus_per_node": [8],
                    "intra_node_link": "nvlink4",
                    "intra_node_bytes_per_s": 4.5e11,
                    "node_network_bytes_per_s": 2.5e10,
                    "prices": {"default": {"on_demand": 1.0, "spot": 0.5}},
                }
            }
        }
    )
    with pytest.raises(EnergyError, match="no power data for GPU type 'X1'"):
        EnergyModel(extra).curve("X1")
    with pytest.raises(EnergyError, match="PowerProfile"):
        EnergyModel(
            CATALOG,
            [
                PowerProfile(
                    gpu_type="Z100",
                    points=(PowerPoint(sm_mhz=1000, watts=100.0),),
                    idle_watts=10.0,
                    provenance=Provenance(source="measured", tool="test"),
                )
            ],
        )


def test_a_negative_energy_price_is_rejected() -> None:
    assert math.isclose(usd_for(3.6e6, 0.12), 0.12)
    with pytest.raises(ValueError, match="below zero"):
        usd_for(1.0, -0.01)


@pytest.mark.parametrize(
    ("points", "needle"),
    [
        (((1400, 300.0, 1.0), (1400, 250.0, 1.1)), "distinct"),
        (((1400, 300.0, 1.0), (1200, 250.0, None)), "every point"),
        (((1400, 300.0, 1.1), (1200, 250.0, 1.2)), "must be 1.0"),
        (((1400, 300.0, 1.0), (1200, 250.0, 1.2), (1000, 200.0, 1.1)), "must not fall"),
    ],
)
def test_inconsistent_power_profiles_are_rejected(
    points: tuple[tuple[int, float, float | None], ...], needle: str
) -> None:
    with pytest.raises(ValidationError, match=needle):
        PowerProfile(
            gpu_type="A100-40",
            points=tuple(PowerPoint(sm_mhz=m, watts=w, time_factor=t) for m, w, t in points),
            idle_watts=50.0,
            provenance=Provenance(source="measured", tool="test"),
        )


def test_catalog_power_fields_are_validated() -> None:
    with pytest.raises(Exception, match="idle_watts"):
        load_catalog({"gpus": {"A100-40": {"power": {"idle_watts": 500}}}})
