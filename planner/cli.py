"""`sailplan plan` and `sailplan simulate`: the planner from a terminal.

Registered on the root app by operator/cli/main.py (`register(app)`). This is the thin edge:
it parses flags and files (cli_inputs.py), loads profiles, calls the pure planner
(`api.make_plan`, `simulator.simulate`) and renders the answer (cli_render.py). User mistakes
exit 2 with one line, an infeasible request exits 3 with the planner's reason; no traceback
for either.

`--json` prints the Plan document of the best plan; with `--top K` (K > 1) it prints a JSON
list of the K best Plan documents, best first, so scripts always get Plan documents.

`--energy` adds each plan's GPU energy per iteration at default clocks and at the
no-slowdown frequency plan (planner/energy; the Plan JSON gains predictions.energy);
`--frontier-png FILE` draws the best plan's time-energy frontier; `--energy-price` (USD/kWh)
prices the energy of every `--pool` pool (and of cluster-file pools without their own
usd_per_kwh), which the cost figures and the cost objective then include.
`--objective energy` (needs `--min-throughput`) is the search's energy objective: the least
GPU energy per iteration at no-slowdown clocks among plans above the floor.
`--max-slowdown F` (a fraction, 0 to 1; implies --energy) moves both to another point of the
time-energy frontier, as a TrainingJob's spec.energy.maxSlowdown does: the least energy with
the iteration at most (1 + F) x its default-clock time and above the throughput floor.
A PowerProfile in `--profiles` (a GPU type's measured power against SM clock) replaces the
datasheet power model of its GPU type in all of these.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError

from sailplan.planner.api import Infeasible, Objective, PlanRequest, make_plan
from sailplan.planner.catalog import Catalog, CatalogError, default_catalog
from sailplan.planner.cli_energy import (
    attach,
    check_max_slowdown,
    check_price,
    context_for,
    energy_lines,
    plot_frontier,
    priced,
    report_for,
)
from sailplan.planner.cli_inputs import (
    InputError,
    cluster_from_file,
    cluster_from_flags,
    model_from_file,
)
from sailplan.planner.cli_render import console, render_plans, render_simulation
from sailplan.planner.cli_sources import (
    estimated_inputs,
    load_plan_file,
    load_profiles,
    simulate_plan,
)
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.search.energy import input_problem as energy_input_problem

EXIT_USAGE = 2
EXIT_INFEASIBLE = 3


class ObjectiveKind(StrEnum):
    throughput = "throughput"
    cost = "cost"
    energy = "energy"


class OptimizerKind(StrEnum):
    adam = "adam"
    sgd = "sgd"


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _model(catalog: Catalog, name: str | None, file: Path | None) -> ModelSpec:
    if (name is None) == (file is None):
        _fail("give exactly one of --model NAME or --model-file FILE")
    if file is not None:
        return model_from_file(file)
    assert name is not None
    return catalog.model(name)


def plan_command(
    *,
    model: Annotated[
        str | None, typer.Option("--model", help="catalog model name or alias")
    ] = None,
    model_file: Annotated[
        Path | None, typer.Option("--model-file", help="custom ModelSpec YAML")
    ] = None,
    global_batch: Annotated[int, typer.Option("--global-batch", min=1)] = 2048,
    pool: Annotated[
        list[str] | None,
        typer.Option("--pool", help="GPU:ZONE:COUNT[:spot], COUNT in GPUs; repeatable"),
    ] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", min=1, help="node size for --pool pools")
    ] = None,
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="ClusterSnapshot YAML (instead of --pool)")
    ] = None,
    objective: Annotated[ObjectiveKind, typer.Option("--objective")] = ObjectiveKind.throughput,
    min_throughput: Annotated[
        float | None, typer.Option("--min-throughput", min=0.0, help="samples/s floor")
    ] = None,
    max_cost_per_hour: Annotated[
        float | None, typer.Option("--max-cost-per-hour", min=0.0, help="USD/hour budget")
    ] = None,
    max_cost_per_iteration: Annotated[
        float | None, typer.Option("--max-cost-per-iteration", min=0.0, help="USD/iteration")
    ] = None,
    profiles: Annotated[
        Path | None,
        typer.Option("--profiles", help="measured profiles directory or a Sailor artifact"),
    ] = None,
    optimizer: Annotated[OptimizerKind, typer.Option("--optimizer")] = OptimizerKind.adam,
    top: Annotated[int, typer.Option("--top", min=1, max=50, help="plans to show")] = 1,
    max_pipeline_depth: Annotated[int | None, typer.Option("--max-pipeline-depth", min=1)] = None,
    memory_options: Annotated[
        bool,
        typer.Option(
            "--memory-options/--no-memory-options",
            help="let stages that do not fit recompute activations or offload the optimizer",
        ),
    ] = True,
    as_json: Annotated[
        bool, typer.Option("--json", help="print Plan JSON (a list if --top > 1)")
    ] = False,
    energy: Annotated[
        bool,
        typer.Option("--energy", help="GPU energy per iteration and the no-slowdown savings"),
    ] = False,
    energy_price: Annotated[
        float | None, typer.Option("--energy-price", help="USD per kWh (implies --energy)")
    ] = None,
    frontier_png: Annotated[
        Path | None,
        typer.Option("--frontier-png", help="plot the best plan's time-energy frontier (PNG)"),
    ] = None,
    max_slowdown_text: Annotated[
        str | None,
        typer.Option(
            "--max-slowdown",
            metavar="FRACTION",
            help="trade time for energy: the least energy with the iteration at most "
            "(1 + FRACTION) x as long, 0 to 1 (0.05 = 5%; as spec.energy.maxSlowdown); "
            "implies --energy",
        ),
    ] = None,
) -> None:
    """Find the best parallel plan for a model on a cluster."""
    catalog = default_catalog()
    energy_objective = objective == ObjectiveKind.energy
    energy = (
        energy
        or energy_objective
        or energy_price is not None
        or frontier_png is not None
        or max_slowdown_text is not None
    )
    max_slowdown = 0.0
    try:
        check_price(energy_price)
        max_slowdown = check_max_slowdown(max_slowdown_text)
        if energy_objective and not min_throughput:
            _fail("--objective energy needs a throughput floor: give --min-throughput")
        spec = _model(catalog, model, model_file)
        if (cluster is None) == (not pool):
            _fail("give either --pool flags or --cluster FILE (not both, not neither)")
        snapshot = priced(
            cluster_from_file(cluster, catalog)
            if cluster is not None
            else cluster_from_flags(pool or [], catalog, gpus_per_node),
            energy_price,
        )
        measured = load_profiles(profiles, catalog) if profiles is not None else None
        request = PlanRequest(
            model=spec,
            global_batch_size=global_batch,
            optimizer=optimizer.value,
            cluster=snapshot,
            objective=Objective(
                kind=objective.value,
                min_samples_per_second=min_throughput or None,
                max_usd_per_hour=max_cost_per_hour or None,
                max_usd_per_iteration=max_cost_per_iteration or None,
            ),
            top_k=top,
            max_pipeline_depth=max_pipeline_depth,
            memory_options=memory_options,
            energy_max_slowdown=max_slowdown,
        )
    except (InputError, CatalogError) as error:
        _fail(str(error))
    except ValidationError as error:
        first = error.errors()[0]
        _fail(f"{'.'.join(str(p) for p in first['loc']) or 'request'}: {first['msg']}")
    problem = energy_input_problem(request, catalog, measured)
    if problem is not None:
        _fail(problem)
    result = make_plan(request, measured, catalog)
    if isinstance(result, Infeasible):
        _fail(f"no feasible plan ({result.code}): {result.reason}", EXIT_INFEASIBLE)
    plans = [result.best, *result.alternatives][:top]
    lines: list[list[str]] = []
    try:
        if energy:
            shown = []
            for index, plan in enumerate(plans):
                context = context_for(plan, snapshot, measured, catalog)
                report = report_for(
                    plan,
                    context,
                    frontier=index == 0 and frontier_png is not None,
                    max_slowdown=max_slowdown,
                    max_iteration_seconds=global_batch / min_throughput if min_throughput else None,
                )
                if not energy_objective:
                    plan = attach(plan, context, report)
                shown.append(plan)
                lines.append(energy_lines(report, energy_price))
                if index == 0 and frontier_png is not None:
                    plot_frontier(report, frontier_png, f"{plan.model.name}: best plan")
                    lines[-1].append(f"frontier plotted to {frontier_png}")
            plans = shown
    except InputError as error:
        _fail(str(error))
    result = result.model_copy(update={"best": plans[0], "alternatives": tuple(plans[1:])})
    if as_json:
        if top == 1:
            typer.echo(result.best.to_json())
        else:
            documents = [json.loads(p.to_json()) for p in plans]
            typer.echo(json.dumps(documents, indent=2))
        return
    render_plans(plans, snapshot, result.plans_evaluated, result.search_seconds, lines or None)


def simulate_command(
    *,
    plan_file: Annotated[
        Path, typer.Option("--plan", help="a Plan JSON or a Sailor plan_config_*.json")
    ],
    profiles: Annotated[
        Path | None,
        typer.Option("--profiles", help="measured profiles directory or a Sailor artifact"),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="model for a Sailor plan (default: OPT-350M)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the Predictions JSON")] = False,
) -> None:
    """Predict iteration time, memory per stage and cost of a given plan."""
    catalog = default_catalog()
    try:
        loaded = load_plan_file(plan_file, catalog, model)
        measured = load_profiles(profiles, catalog) if profiles is not None else None
        predictions = simulate_plan(loaded, measured, catalog)
        estimated = estimated_inputs(loaded, measured, catalog)
    except (InputError, CatalogError) as error:
        _fail(str(error))
    if as_json:
        typer.echo(predictions.model_dump_json(indent=2))
        return
    render_simulation(loaded.plan, predictions, loaded.measured_iteration_seconds, estimated)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
    app.command("simulate")(simulate_command)


__all__ = ["console", "register"]
