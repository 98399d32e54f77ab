"""One SM clock per stage (frequency.solve_single): what the node agent can apply.

A GPU holds one locked clock, so every pass of a stage runs at one clock. The one-clock
solver is checked against exhaustive enumeration of every one-clock assignment of small
pipelines built from the datasheet power model (the independent reason for the expected
answers), with and without a price on time (blocking power); the per-pass solver
(solve, a second clock for the warm-up/cool-down pass) is shown to give a different,
unappliable answer on the same pipeline. On a Plan, every point plan_energy reports as
clocks to apply has fill == steady and a predicted time within its allowance.
"""

from __future__ import annotations

import itertools
import math

import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.energy import (
    EnergyModel,
    PipelineProblem,
    StageOptions,
    default_clocks,
    pipeline_seconds,
    plan_energy,
    solve,
    solve_single,
)
from sailplan.planner.energy.frequency import effective_joules
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator import PlanningContext, simulate

CATALOG = default_catalog()
ZONE = "us-central1-a"


def _stage(base: float, share: float, links: float, every: int = 6) -> StageOptions:
    """A stage on the A100 datasheet curve, keeping every `every`-th clock level."""
    curve = EnergyModel(CATALOG).curve("A100-40")
    keep = range(0, len(curve.mhz), every)
    factors = curve.time_factors(share)
    seconds = [base * factors[k] for k in keep]
    joules = [
        (curve.load_watts[k] - curve.blocking_watts) * t for k, t in zip(keep, seconds, strict=True)
    ]
    return StageOptions(
        mhz=tuple(curve.mhz[k] for k in keep),
        seconds=tuple(seconds),
        effective_joules=tuple(joules),
        links=links,
    )


def _problem(micro_batches: int = 8) -> PipelineProblem:
    """Three stages of unequal length: the middle one sets the cycle."""
    link = 0.002
    return PipelineProblem(
        stages=(
            _stage(0.06, 0.9, link),
            _stage(0.10, 0.8, 2 * link),
            _stage(0.04, 0.6, link),
        ),
        micro_batches=micro_batches,
        fill_links=4 * link,
    )


def _brute_force(problem: PipelineProblem, deadline: float, watts: float) -> float:
    """The least effective energy + watts x time over every one-clock assignment that
    meets the deadline (all of them: no pruning, no ordering)."""
    best = math.inf
    ranges = [range(len(s.mhz)) for s in problem.stages]
    for levels in itertools.product(*ranges):
        seconds = pipeline_seconds(problem, levels, levels)
        if seconds <= deadline * (1 + 1e-12):
            best = min(best, effective_joules(problem, levels, levels) + watts * seconds)
    return best


@pytest.mark.parametrize("micro_batches", [1, 8])
@pytest.mark.parametrize("slowdown", [0.0, 0.002, 0.01, 0.05, 0.3, math.inf])
@pytest.mark.parametrize("watts", [0.0, 400.0])
def test_one_clock_answer_is_the_least_of_every_one_clock_assignment(
    micro_batches: int, slowdown: float, watts: float
) -> None:
    problem = _problem(micro_batches)
    assert math.prod(len(s.mhz) for s in problem.stages) > 1000  # a real enumeration
    deadline = default_clocks(problem).seconds * (1 + slowdown)
    found = solve_single(problem, deadline, watts_of_time=watts)
    assert found.fill == found.steady
    assert found.seconds <= deadline * (1 + 1e-12)
    assert math.isclose(found.seconds, pipeline_seconds(problem, found.fill, found.steady))
    expected = _brute_force(problem, deadline, watts)
    assert math.isclose(found.effective_joules + watts * found.seconds, expected, rel_tol=1e-12)


def test_per_pass_and_one_clock_answers_differ_at_no_slowdown() -> None:
    problem = _problem()
    default = default_clocks(problem)
    fastest = default.seconds
    per_pass = solve(problem, fastest)
    one = solve_single(problem, fastest)
    # per pass: the short stages slow their steady passes for free, their fill pass stays
    # at the maximum clock; a GPU cannot hold those two clocks
    assert per_pass.fill != per_pass.steady
    assert per_pass.effective_joules < default.effective_joules
    # one clock: every slower level lengthens the fill chain, so nothing moves
    assert one.fill == one.steady == (0, 0, 0)
    assert math.isclose(one.effective_joules, _brute_force(problem, fastest, 0.0))
    # what running the per-pass steady clocks as one clock would really take: longer than
    # the no-slowdown deadline, the gap the one-clock solver closes
    applied = pipeline_seconds(problem, per_pass.steady, per_pass.steady)
    assert applied > fastest
    # a little more time, and one clock recovers most of the per-pass saving
    slowed = solve_single(problem, fastest * 1.02)
    saved_per_pass = default.effective_joules - per_pass.effective_joules
    assert default.effective_joules - slowed.effective_joules > 0.5 * saved_per_pass


# -- on a Plan ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan_and_context() -> tuple[Plan, PlanningContext]:
    """GPT3-XL split 19 | 7 layers over two A100s: the second stage has slack."""
    model = CATALOG.model("GPT3-XL")
    estimated = complete_profiles(
        model, ["A100-40"], [1], [1], measured=ProfileSet(), catalog=CATALOG
    )
    profiles = complete_profiles(model, ["A100-40"], [], [], measured=estimated, catalog=CATALOG)
    cluster = ClusterSnapshot(
        pools=(Pool(name="a100", gpu_type="A100-40", zone=ZONE, gpus_per_node=8, nodes=1),)
    )
    replica = Replica(pool="a100", gpu_type="A100-40", zone=ZONE)
    plan = Plan(
        model=model,
        global_batch_size=16,
        micro_batch_size=1,
        num_micro_batches=16,
        stages=(
            Stage(layer_start=0, layer_end=19, replicas=(replica,)),
            Stage(layer_start=19, layer_end=model.num_layers, replicas=(replica,)),
        ),
    )
    context = PlanningContext(model=model, cluster=cluster, profiles=profiles, catalog=CATALOG)
    return plan, context


def test_every_applied_point_has_one_clock_per_gpu_within_its_allowance(
    plan_and_context: tuple[Plan, PlanningContext],
) -> None:
    plan, context = plan_and_context
    default_seconds = simulate(plan, context).iteration_seconds
    previous = math.inf
    for slowdown in (0.0, 0.005, 0.01, 0.05, 0.2):
        report = plan_energy(plan, context, max_slowdown=slowdown, frontier_points=10)
        points = [report.no_slowdown, report.chosen, *report.frontier]
        for point in points:
            assert point.fill_mhz == point.steady_mhz
        chosen = report.chosen
        assert chosen.iteration_seconds <= (1 + slowdown) * default_seconds * (1 + 1e-12)
        assert chosen.joules_per_iteration <= previous * (1 + 1e-12)
        previous = chosen.joules_per_iteration
        prediction = report.prediction()
        assert prediction.iteration_seconds == chosen.iteration_seconds
        assert all(c.fill_mhz == c.steady_mhz for c in prediction.stage_clocks)
    assert previous < report.default.joules_per_iteration


def test_recomputation_and_offload_are_priced_as_the_simulator_times_them(
    plan_and_context: tuple[Plan, PlanningContext],
) -> None:
    """A recomputing stage's passes take the recomputed forward too, and an offloaded
    optimizer step runs on the CPU while the GPU waits: the energy must count them as the
    simulator times them, or the clock solve sees slack the stage does not have."""
    plan, context = plan_and_context
    curve = EnergyModel(CATALOG).curve("A100-40")
    busy = curve.load_watts[0] - curve.blocking_watts  # above blocking at the maximum clock
    gpus = len(plan.workers())
    table = context.costs.require_table("A100-40", 1, plan.micro_batch_size)
    plain = plan_energy(plan, context)
    plain_seconds = simulate(plan, context).iteration_seconds

    recomputing = plan.model_copy(
        update={"stages": tuple(s.model_copy(update={"recompute": "full"}) for s in plan.stages)}
    )
    report = plan_energy(recomputing, context)
    seconds = simulate(recomputing, context).iteration_seconds
    assert math.isclose(report.default.iteration_seconds, seconds)
    # one pipeline, one clock per GPU, no slowdown: no stage has time to spare
    assert report.no_slowdown.steady_mhz == ((1410,), (1410,))
    # every pass of every stage also runs its forward again, at the maximum clock's power
    forward = sum(table.forward_seconds(s.layer_start, s.layer_end) for s in plan.stages)
    expected = (
        plain.default.joules_per_iteration
        + busy * plan.num_micro_batches * forward
        + gpus * curve.blocking_watts * (seconds - plain_seconds)
    )
    assert math.isclose(report.default.joules_per_iteration, expected, rel_tol=1e-9)

    first = plan.stages[0]
    offloading = plan.model_copy(
        update={"stages": (first.model_copy(update={"optimizer_offload": True}), *plan.stages[1:])}
    )
    report = plan_energy(offloading, context)
    seconds = simulate(offloading, context).iteration_seconds
    step = context.costs.stage_update_seconds(
        table, first.layer_start, first.layer_end, False, plan.data_parallel
    )
    expected = (
        plain.default.joules_per_iteration
        - busy * step
        + gpus * curve.blocking_watts * (seconds - plain_seconds)
    )
    assert math.isclose(report.default.joules_per_iteration, expected, rel_tol=1e-9)
