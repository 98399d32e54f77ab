"""`sailplan plan` and `sailplan simulate`: the planner from a terminal.

Registered on the root app by operator/cli/main.py (`register(app)`). This is the thin edge:
it parses flags and files (cli_inputs.py), loads profiles, calls the pure planner
(`api.make_plan`, `simulator.simulate`) and renders the answer (cli_render.py). User mistakes
exit 2 with one line, an infeasible request exits 3 with the planner's reason; no traceback
for either.

`--json` prints the Plan document of the best plan; with `--top K` (K > 1) it prints a JSON
list of the K best Plan documents, best first, so scripts always get Plan documents.
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
from sailplan.planner.cli_inputs import (
    InputError,
    cluster_from_file,
    cluster_from_flags,
    model_from_file,
)
from sailplan.planner.cli_render import console, render_plans, render_simulation
from sailplan.planner.cli_sources import load_plan_file, load_profiles, simulate_plan
from sailplan.planner.modelspec import ModelSpec

EXIT_USAGE = 2
EXIT_INFEASIBLE = 3


class ObjectiveKind(StrEnum):
    throughput = "throughput"
    cost = "cost"


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
    as_json: Annotated[
        bool, typer.Option("--json", help="print Plan JSON (a list if --top > 1)")
    ] = False,
) -> None:
    """Find the best parallel plan for a model on a cluster."""
    catalog = default_catalog()
    try:
        spec = _model(catalog, model, model_file)
        if (cluster is None) == (not pool):
            _fail("give either --pool flags or --cluster FILE (not both, not neither)")
        snapshot = (
            cluster_from_file(cluster, catalog)
            if cluster is not None
            else cluster_from_flags(pool or [], catalog, gpus_per_node)
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
        )
    except (InputError, CatalogError) as error:
        _fail(str(error))
    except ValidationError as error:
        first = error.errors()[0]
        _fail(f"{'.'.join(str(p) for p in first['loc']) or 'request'}: {first['msg']}")
    result = make_plan(request, measured, catalog)
    if isinstance(result, Infeasible):
        _fail(f"no feasible plan ({result.code}): {result.reason}", EXIT_INFEASIBLE)
    plans = [result.best, *result.alternatives][:top]
    if as_json:
        if top == 1:
            typer.echo(result.best.to_json())
        else:
            documents = [json.loads(p.to_json()) for p in plans]
            typer.echo(json.dumps(documents, indent=2))
        return
    render_plans(plans, snapshot, result.plans_evaluated, result.search_seconds)


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
    except (InputError, CatalogError) as error:
        _fail(str(error))
    if as_json:
        typer.echo(predictions.model_dump_json(indent=2))
        return
    render_simulation(loaded.plan, predictions, loaded.measured_iteration_seconds)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
    app.command("simulate")(simulate_command)


__all__ = ["console", "register"]
