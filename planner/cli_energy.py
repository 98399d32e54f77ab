"""`sailplan plan --energy`: energy per iteration, no-slowdown savings, the frontier PNG.

Called only by planner/cli.py. The energy model and the frequency planner are pure
(planner/energy); this edge puts `--energy-price` on the cluster's pools, rebuilds the
planning context of a chosen plan, prices it at `--max-slowdown`'s point of the frontier
(TrainingJob spec.energy.maxSlowdown), renders the report as lines (the clocks a job runs
with are one per GPU, as the node agent locks them; the per-pass figure Perseus would reach
by switching clocks inside the trainer is printed beside them, labelled as not applied),
and draws the frontier with matplotlib (imported here only, never by the planner core:
`pip install 'sailplan[plot]'`). Every user mistake is an InputError with one line.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from sailplan.planner.api import MAX_ENERGY_SLOWDOWN
from sailplan.planner.catalog import Catalog
from sailplan.planner.cli_inputs import InputError
from sailplan.planner.cli_sources import plan_context
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.energy import EnergyError, EnergyReport, FrontierPoint, plan_energy, usd_for
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator import MissingProfileError, PlanningContext, simulate

FRONTIER_POINTS = 40


def check_price(usd_per_kwh: float | None) -> None:
    if usd_per_kwh is not None and usd_per_kwh < 0:
        raise InputError(f"--energy-price {usd_per_kwh:g} USD/kWh is below zero")


def check_max_slowdown(text: str | None) -> float:
    """`--max-slowdown` as a fraction of the iteration time (0: not given); the bounds are
    PlanRequest.energy_max_slowdown's, as the API server's for spec.energy.maxSlowdown."""
    if text is None:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= MAX_ENERGY_SLOWDOWN:  # NaN too
        raise InputError(
            f"--max-slowdown {text} is not a fraction from 0 to {MAX_ENERGY_SLOWDOWN:g} "
            "of the iteration time (0.05 = at most 5% slower)"
        )
    return value


def priced(snapshot: ClusterSnapshot, usd_per_kwh: float | None) -> ClusterSnapshot:
    """`--energy-price` on every pool that has no energy price of its own."""
    if usd_per_kwh is None:
        return snapshot
    pools = tuple(
        p if p.usd_per_kwh is not None else p.model_copy(update={"usd_per_kwh": usd_per_kwh})
        for p in snapshot.pools
    )
    return snapshot.model_copy(update={"pools": pools})


def context_for(
    plan: Plan, cluster: ClusterSnapshot, measured: ProfileSet | None, catalog: Catalog
) -> PlanningContext:
    """The context the plan was priced in (cli_sources.plan_context), with the model's
    remaining estimates completed as make_plan completes them."""
    context = plan_context(plan, cluster, measured, catalog)
    types = sorted({w.gpu_type for w in plan.workers()})
    profiles = complete_profiles(
        plan.model, types, [], [], measured=context.profiles, catalog=catalog
    )
    return dataclasses.replace(context, profiles=profiles)


def report_for(
    plan: Plan,
    context: PlanningContext,
    frontier: bool,
    max_slowdown: float = 0.0,
    max_iteration_seconds: float | None = None,
) -> EnergyReport:
    """The plan's energy report, its chosen point at `max_slowdown` (no slower than
    `max_iteration_seconds`, the throughput floor's time), as the operator prices a job."""
    try:
        return plan_energy(
            plan,
            context,
            frontier_points=FRONTIER_POINTS if frontier else 0,
            max_slowdown=max_slowdown,
            max_iteration_seconds=max_iteration_seconds,
            per_pass=True,
        )
    except (EnergyError, MissingProfileError) as error:
        raise InputError(str(error)) from None


def attach(
    plan: Plan, context: PlanningContext, report: EnergyReport, point: FrontierPoint | None = None
) -> Plan:
    """The plan with fresh predictions carrying the energy fields (the no-slowdown point, or
    `point` from the frontier)."""
    predictions = simulate(plan, context)
    energy = report.prediction()
    if point is not None:
        energy = energy.model_copy(
            update={
                "joules_per_iteration": point.joules_per_iteration,
                "iteration_seconds": point.iteration_seconds,
                "stage_clocks": point.stage_clocks(),
            }
        )
    return plan.model_copy(
        update={"predictions": predictions.model_copy(update={"energy": energy})}
    )


def _clocks(point: FrontierPoint) -> str:
    parts = []
    for i, (steady, fill) in enumerate(zip(point.steady_mhz, point.fill_mhz, strict=True)):
        s = sorted(set(steady))
        f = sorted(set(fill))
        text = "/".join(str(x) for x in s)
        if f != s:
            text += f" (warm-up {'/'.join(str(x) for x in f)})"
        parts.append(f"s{i} {text}")
    return ", ".join(parts)


def energy_lines(report: EnergyReport, usd_per_kwh: float | None) -> list[str]:
    default, best = report.default, report.no_slowdown
    lines = [
        f"energy {default.joules_per_iteration / 1e3:.2f} kJ/iteration at default clocks; "
        f"{best.joules_per_iteration / 1e3:.2f} kJ at no slowdown "
        f"(saves {report.saved_fraction * 100:.1f}%, iteration {best.iteration_seconds:.3f} s; "
        f"one clock per GPU, as the node agent locks it; {report.source} power model)",
        f"no-slowdown SM clocks (MHz): {_clocks(best)}",
    ]
    per_pass = report.per_pass
    if per_pass is not None:
        saved = 1 - per_pass.joules_per_iteration / default.joules_per_iteration
        lines.append(
            f"per-pass clocks (not applied: they need clock switching inside the trainer) "
            f"would save {saved * 100:.1f}% at no slowdown: {_clocks(per_pass)}"
        )
    planned = report.planned
    if planned is not None:
        slower = planned.iteration_seconds / default.iteration_seconds - 1
        saved = 1 - planned.joules_per_iteration / default.joules_per_iteration
        lines += [
            f"max slowdown {report.max_slowdown * 100:g}%: "
            f"{planned.joules_per_iteration / 1e3:.2f} kJ/iteration (saves {saved * 100:.1f}%, "
            f"iteration {planned.iteration_seconds:.3f} s, {slower * 100:.1f}% slower)",
            f"max-slowdown SM clocks (MHz): {_clocks(planned)}",
        ]
    if usd_per_kwh is not None:
        lines.append(
            f"energy cost {usd_for(default.joules_per_iteration, usd_per_kwh):.6f} USD/iteration at "
            f"default clocks, {usd_for(best.joules_per_iteration, usd_per_kwh):.6f} at no slowdown "
            f"({usd_per_kwh:g} USD/kWh)"
        )
    if len(report.frontier) > 1:
        last = report.frontier[-1]
        slower = last.iteration_seconds / default.iteration_seconds - 1
        saved = 1 - last.joules_per_iteration / default.joules_per_iteration
        lines.append(
            f"frontier: {len(report.frontier)} points, down to {saved * 100:.1f}% less energy "
            f"at {slower * 100:.1f}% slower"
        )
    return lines


def plot_frontier(report: EnergyReport, path: Path, title: str) -> None:
    """The iteration time-energy frontier as a PNG (matplotlib, Agg backend)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        raise InputError("--frontier-png needs matplotlib: pip install 'sailplan[plot]'") from None
    points = report.frontier or (report.no_slowdown,)
    fig, ax = plt.subplots(figsize=(6, 4), tight_layout=True)
    ax.plot(
        [p.iteration_seconds for p in points],
        [p.joules_per_iteration / 1e3 for p in points],
        marker=".",
        label="frequency plans (frontier)",
    )
    ax.scatter(
        [report.default.iteration_seconds],
        [report.default.joules_per_iteration / 1e3],
        color="red",
        zorder=3,
        label="default clocks",
    )
    ax.scatter(
        [report.no_slowdown.iteration_seconds],
        [report.no_slowdown.joules_per_iteration / 1e3],
        color="green",
        zorder=3,
        label="no slowdown",
    )
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("GPU energy per iteration (kJ)")
    ax.set_title(title)
    ax.legend()
    try:
        fig.savefig(path, dpi=120)
    except OSError as error:
        raise InputError(f"cannot write {path}: {error.strerror or error}") from None
    finally:
        plt.close(fig)
