"""Switch decisions: gain vs threshold and restart cost, involuntary switches, no capacity.

Plans come from the real planner (make_plan) on small snapshots: OPT-350M, global batch 32,
A100 nodes of 4 GPUs in one zone.
"""

from __future__ import annotations

from typing import Any

import pytest
from operator_builders import JOB_SPEC, pool

from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.operator.replan import triggers as t
from sailplan.operator.replan.cost import RestartCostModel, evaluate
from sailplan.operator.replan.decision import (
    Keep,
    ReplanConfig,
    ReplanContext,
    ReplanInputs,
    Switch,
    Wait,
    decide,
    effective_config,
    plan_request,
)
from sailplan.planner.api import Planned, make_plan
from sailplan.planner.catalog import Catalog, default_catalog
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.plan import EnergyPrediction, Plan, Predictions, StagePrediction

ZONE = "us-central1-a"
SPEC = JOB_SPEC | {"training": {"globalBatchSize": 32, "steps": 100_000}}
CAPACITY_ADDED = t.Trigger(t.CAPACITY_ADDED, "a100: +12 GPUs")
PREEMPTED = t.Trigger(t.WORKER_PREEMPTED, "w0 preempted", involuntary=True, graceful=False)


def job(spec: dict[str, Any] | None = None, step: int = 0) -> TrainingJob:
    return TrainingJob.model_validate(
        {
            "name": "opt",
            "namespace": "team-a",
            "spec": spec or SPEC,
            "status": {"progress": {"step": step}},
        }
    )


def cluster(nodes: int, **spec: Any) -> ClusterSnapshot:
    return build_snapshot([pool("a100", "a100-ondemand", {ZONE: nodes}, **spec)])


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return default_catalog()


@pytest.fixture(scope="module")
def one_node_plan(catalog: Catalog) -> Plan:
    result = make_plan(plan_request(job(), catalog.model("OPT-350M"), cluster(1)))
    assert isinstance(result, Planned)
    return result.best


def inputs(plan: Plan | None, snapshot: ClusterSnapshot, the_job: TrainingJob) -> ReplanInputs:
    model = default_catalog().model("OPT-350M")
    return ReplanInputs(job=the_job, model=model, plan=plan, pods=(), nodes={}, cluster=snapshot)


def context(catalog: Catalog, the_job: TrainingJob | None = None) -> ReplanContext:
    """The operator's default settings, with `the_job`'s overrides as the reconcile applies."""
    config = effective_config(ReplanConfig(), the_job) if the_job else ReplanConfig()
    return ReplanContext(planner=make_plan, catalog=catalog, config=config)


def test_more_capacity_and_much_work_left_switches(catalog: Catalog, one_node_plan: Plan) -> None:
    # Four nodes instead of one: the planner spreads the model over more GPUs; with 100k
    # steps left any gain of a few percent repays a restart of a few minutes many times.
    decision = decide(inputs(one_node_plan, cluster(4), job()), context(catalog), CAPACITY_ADDED)
    assert isinstance(decision, Switch)
    assert decision.evaluation is not None
    assert decision.evaluation.gain_fraction >= 0.1  # the job's default minPredictedGain
    assert decision.plan.world_size > one_node_plan.world_size


def test_gain_below_the_threshold_keeps(catalog: Catalog, one_node_plan: Plan) -> None:
    # minPredictedGain 10 = +1000%: four times the GPUs cannot run a model 11 times faster
    # (each stage's per-micro-batch compute is at best split four ways).
    spec = SPEC | {"replan": {"minPredictedGain": 10}}
    decision = decide(
        inputs(one_node_plan, cluster(4), job(spec)), context(catalog), CAPACITY_ADDED
    )
    assert isinstance(decision, Keep)
    assert decision.evaluation is not None and decision.evaluation.gain_fraction < 10


def test_restart_cost_larger_than_what_is_left_keeps(catalog: Catalog, one_node_plan: Plan) -> None:
    # One step left (32 samples, ~2 s at ~15 samples/s): no speed-up can save the ~100 s a
    # restart costs.
    late = job(step=SPEC["training"]["steps"] - 1)
    decision = decide(inputs(one_node_plan, cluster(4), late), context(catalog), CAPACITY_ADDED)
    assert isinstance(decision, Keep)
    assert decision.evaluation is not None
    assert decision.evaluation.benefit < decision.evaluation.restart_penalty


def test_unchanged_best_plan_keeps(catalog: Catalog, one_node_plan: Plan) -> None:
    # Same cluster: the deterministic planner returns the same plan.
    decision = decide(inputs(one_node_plan, cluster(1), job()), context(catalog), CAPACITY_ADDED)
    assert isinstance(decision, Keep)
    assert "still the best" in decision.reason


def test_involuntary_switches_whatever_the_gain(catalog: Catalog, one_node_plan: Plan) -> None:
    spec = SPEC | {"replan": {"minPredictedGain": 10}}
    decision = decide(inputs(one_node_plan, cluster(1), job(spec)), context(catalog), PREEMPTED)
    assert isinstance(decision, Switch)


def test_no_capacity_waits(catalog: Catalog, one_node_plan: Plan) -> None:
    decision = decide(inputs(one_node_plan, cluster(0), job()), context(catalog), PREEMPTED)
    assert isinstance(decision, Wait)
    assert decision.code == "NoCapacity"


def test_edited_budget_the_current_plan_breaks_forces_a_switch(catalog: Catalog) -> None:
    # Planned on 4 nodes (about $51/h); the user lowers maxUsdPerHour to 20: the current plan
    # violates it, so the job switches even though the new plan is slower (negative gain).
    big = make_plan(plan_request(job(), catalog.model("OPT-350M"), cluster(4)))
    assert isinstance(big, Planned)
    assert big.best.predictions is not None and big.best.predictions.usd_per_hour > 20
    spec = SPEC | {"objective": {"maxUsdPerHour": 20}}
    decision = decide(inputs(big.best, cluster(4), job(spec)), context(catalog), CAPACITY_ADDED)
    assert isinstance(decision, Switch)
    assert "maxUsdPerHour" in decision.reason
    assert decision.plan.predictions is not None
    assert decision.plan.predictions.usd_per_hour <= 20


def _predictions(samples_per_second: float, usd_per_iteration: float) -> Predictions:
    iteration = 32 / samples_per_second
    return Predictions(
        iteration_seconds=iteration,
        samples_per_second=samples_per_second,
        stages=(StagePrediction(forward_backward_seconds=0.1, peak_memory_bytes=1),),
        usd_per_iteration=usd_per_iteration,
        usd_per_hour=usd_per_iteration * 3600 / iteration,
        egress_bytes_per_iteration=0.0,
    )


def test_throughput_gain_against_restart_cost_by_hand() -> None:
    # 1200 samples left: 120 s at 10 samples/s, 100 s at 12: 20 s saved, a 20% gain.
    current, candidate = _predictions(10, 0.1), _predictions(12, 0.1)
    common = {"global_batch_size": 32, "remaining_samples": 1200, "horizon_seconds": 1e9}
    slow = evaluate("Throughput", current, candidate, restart_seconds=30, min_gain=0.1, **common)
    assert slow.benefit == pytest.approx(20.0)
    assert not slow.worth_it  # 20 s saved < 30 s restart
    fast = evaluate("Throughput", current, candidate, restart_seconds=10, min_gain=0.1, **common)
    assert fast.worth_it
    # The horizon caps the work judged: 60 s at 10 samples/s = 600 samples, 10 s saved.
    capped = evaluate(
        "Throughput",
        current,
        candidate,
        global_batch_size=32,
        remaining_samples=1200,
        horizon_seconds=60,
        restart_seconds=10,
        min_gain=0.1,
    )
    assert capped.benefit == pytest.approx(10.0)
    assert not capped.worth_it


def test_cost_saving_against_restart_cost_by_hand() -> None:
    # $0.32 vs $0.16 per 32-sample iteration: $0.01 vs $0.005 per sample, a 50% saving;
    # 1000 samples left save $5. The candidate costs $0.16 per 32/12 s = $216/h, so a
    # 100 s restart costs $6 of idle GPUs (> $5: keep) and a 60 s one $3.6 (< $5: switch).
    current, candidate = _predictions(10, 0.32), _predictions(12, 0.16)
    common = {"global_batch_size": 32, "remaining_samples": 1000, "horizon_seconds": 1e9}
    long = evaluate("Cost", current, candidate, restart_seconds=100, min_gain=0.1, **common)
    assert long.gain_fraction == pytest.approx(0.5)
    assert long.benefit == pytest.approx(5.0)
    assert long.restart_penalty == pytest.approx(6.0)
    assert not long.worth_it
    short = evaluate("Cost", current, candidate, restart_seconds=60, min_gain=0.1, **common)
    assert short.worth_it


def test_restart_cost_from_model_size_and_measured_drain(catalog: Catalog) -> None:
    model = catalog.model("OPT-350M")
    cost = RestartCostModel(storage_bytes_per_second=1e8, teardown_seconds=5, pod_start_seconds=50)
    # Adam checkpoints 12 bytes per parameter; written once and read once at 100 MB/s.
    transfer = model.total_parameters() * 12 / 1e8
    assert cost.restart_seconds(model, "adam") == pytest.approx(2 * transfer + 5 + 50)
    # A measured drain (checkpoint request to clean exit) replaces the save + teardown guess.
    assert cost.restart_seconds(model, "adam", 30.0) == pytest.approx(30 + 50 + transfer)


def test_slow_checkpoint_storage_keeps_unless_the_horizon_is_longer(
    catalog: Catalog, one_node_plan: Plan
) -> None:
    # The same 1 -> 4 node change that switches with the defaults (first test), but the job
    # says its checkpoint storage does 1 MB/s and it judges gains over 3 h. Adam checkpoints
    # 12 B/param, written once and read once, plus 15 s teardown and 90 s pod start
    # (RestartCostModel defaults).
    model = catalog.model("OPT-350M")
    bandwidth = 1_000_000
    restart = 2 * model.total_parameters() * 12 / bandwidth + 15 + 90  # ~9882 s
    short_horizon, day_seconds = 3 * 3600, 86400
    slow = job(
        SPEC
        | {
            "replan": {
                "checkpointBandwidthBytesPerSecond": bandwidth,
                "horizonSeconds": short_horizon,
            }
        }
    )
    kept = decide(inputs(one_node_plan, cluster(4), slow), context(catalog, slow), CAPACITY_ADDED)
    assert isinstance(kept, Keep), kept
    evaluation = kept.evaluation
    assert evaluation is not None
    assert evaluation.restart_seconds == pytest.approx(restart)
    # 100k steps of 32 samples outlast a day, so the horizon H caps the work judged, and a
    # gain g saves H * g / (1 + g) seconds. A 3 h horizon cannot repay the restart when
    # g / (1 + g) < restart / 3 h, a 24 h horizon can when g / (1 + g) > restart / 24 h; the
    # planner's gain must lie between for this case to be the marginal one it claims.
    gain = evaluation.gain_fraction
    share = gain / (1 + gain)
    assert restart / day_seconds < share < restart / short_horizon, (
        f"gain {gain:.2f} leaves the marginal window; pick new numbers"
    )
    assert evaluation.benefit == pytest.approx(short_horizon * share)
    assert evaluation.benefit < evaluation.restart_penalty
    day = job(
        SPEC
        | {
            "replan": {
                "checkpointBandwidthBytesPerSecond": bandwidth,
                "horizonSeconds": day_seconds,
            }
        }
    )
    switched = decide(inputs(one_node_plan, cluster(4), day), context(catalog, day), CAPACITY_ADDED)
    assert isinstance(switched, Switch), switched
    assert switched.evaluation is not None
    assert switched.evaluation.benefit == pytest.approx(day_seconds * share)
    assert switched.evaluation.benefit > restart


def test_the_energy_objective_and_the_clock_opt_in_reach_the_planner(catalog: Catalog) -> None:
    plain = plan_request(job(), catalog.model("OPT-350M"), cluster(1))
    assert (plain.objective.kind, plain.energy_predictions) == ("throughput", False)
    energy_spec = SPEC | {"objective": {"kind": "Energy", "minSamplesPerSecond": 5.0}}
    energy = plan_request(job(energy_spec), catalog.model("OPT-350M"), cluster(1))
    assert energy.objective.kind == "energy"
    assert energy.objective.min_samples_per_second == 5.0
    assert energy.energy_predictions
    clocks = plan_request(
        job(SPEC | {"energy": {"clocks": "NoSlowdown"}}), catalog.model("OPT-350M"), cluster(1)
    )
    assert (clocks.objective.kind, clocks.energy_predictions) == ("throughput", True)
    # the plan it gets carries the no-slowdown clocks the node agent locks
    result = make_plan(clocks)
    assert isinstance(result, Planned)
    assert result.best.predictions is not None and result.best.predictions.energy is not None
    assert len(result.best.predictions.energy.stage_clocks) == result.best.pipeline_depth


def test_an_energy_objective_without_a_floor_is_invalid() -> None:
    with pytest.raises(ValueError, match="minSamplesPerSecond"):
        job(SPEC | {"objective": {"kind": "Energy"}})


def test_energy_saving_against_restart_cost_by_hand() -> None:
    # 40 kJ vs 30 kJ per 32-sample iteration: 1250 vs 937.5 J per sample, a 25% saving; 1000
    # samples left save 312.5 kJ. The candidate draws 30 kJ per 32/12 s = 11.25 kW, so a
    # 30 s restart costs 337.5 kJ (> saving: keep) and a 20 s one 225 kJ (< saving: switch).
    def with_energy(samples_per_second: float, joules: float) -> Predictions:
        base = _predictions(samples_per_second, 0.1)
        energy = EnergyPrediction(
            joules_per_iteration_default=joules * 1.1,
            joules_per_iteration=joules,
            iteration_seconds=base.iteration_seconds,
        )
        return base.model_copy(update={"energy": energy})

    current, candidate = with_energy(10, 40e3), with_energy(12, 30e3)
    common = {"global_batch_size": 32, "remaining_samples": 1000, "horizon_seconds": 1e9}
    long = evaluate("Energy", current, candidate, restart_seconds=30, min_gain=0.1, **common)
    assert long.gain_fraction == pytest.approx(0.25)
    assert long.benefit == pytest.approx(312.5e3)
    assert long.restart_penalty == pytest.approx(337.5e3)
    assert not long.worth_it
    short = evaluate("Energy", current, candidate, restart_seconds=20, min_gain=0.1, **common)
    assert short.worth_it
    assert "J over" in short.explain()
