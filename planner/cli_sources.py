"""Files the CLI reads besides cluster/model YAML: profile directories and plan documents.

Called by planner/cli.py. A profile directory (the project's layout or a Sailor artifact,
told apart by planner-core's store) becomes a ProfileSet; a plan file is either the
project's Plan JSON or a Sailor `plan_config_*.json` (detected by its `pipeline_list`), and
`simulate_plan` prices it. Every user mistake is an InputError with one line.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from sailplan.planner.catalog import Catalog
from sailplan.planner.cli_inputs import InputError, default_gpus_per_node
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.plan import Plan, Predictions
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.sailor import (
    SailorFormatError,
    import_artifact,
    is_sailor_artifact,
    plan_from_sailor,
)
from sailplan.planner.profiles.store import ProfileStoreError, load_profile_dir
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator import MissingProfileError, PlanningContext, simulate, zone_links

DEFAULT_SAILOR_MODEL = "OPT-350M"  # the model of every plan in the Sailor artifact


def load_profiles(path: Path, catalog: Catalog) -> ProfileSet:
    """The profiles under `path`; a Sailor artifact's rejected files (a profile that cannot
    be the model its folder names) are warned about on stderr, one line each."""
    try:
        if path.is_dir() and is_sailor_artifact(path):
            imported = import_artifact(path, catalog)
            for line in imported.rejected:
                print(f"warning: {line}", file=sys.stderr)
            return imported.profiles
        return load_profile_dir(path, catalog)
    except (ProfileStoreError, SailorFormatError) as error:
        raise InputError(str(error)) from None


@dataclass(frozen=True)
class LoadedPlan:
    plan: Plan
    cluster: ClusterSnapshot
    measured_iteration_seconds: float | None = None


def cluster_of(plan: Plan, catalog: Catalog) -> ClusterSnapshot:
    """The smallest cluster that holds a plan: each pool it names, sized to what it uses.

    A Plan names pools but not their node size; take the catalog's default node shape for
    the GPUs used, at least the largest TP degree placed there (a TP group is one node).
    """
    used = plan.gpus_by_pool()
    largest_tp: dict[str, int] = {}
    where: dict[str, tuple[str, str]] = {}
    for worker in plan.workers():
        largest_tp[worker.pool] = max(largest_tp.get(worker.pool, 1), worker.tensor_parallel)
        where[worker.pool] = (worker.gpu_type, worker.zone)
    pools = []
    for name, gpus in used.items():
        gpu_type, zone = where[name]
        per_node = max(largest_tp[name], default_gpus_per_node(catalog, gpu_type, gpus))
        pools.append(
            Pool(
                name=name,
                gpu_type=gpu_type,
                zone=zone,
                gpus_per_node=per_node,
                nodes=-(-gpus // per_node),
            )
        )
    return ClusterSnapshot(pools=tuple(pools))


def plan_error_line(error: ValidationError) -> str:
    """The first problem of an invalid Plan as `field: what is wrong` (one line).

    Whole-plan checks (layers covering the model, one replica per pipeline) carry no field
    location in pydantic; their messages already name the field ("stages cover layers ..."),
    so only pydantic's "Value error, " prefix is dropped.
    """
    first = error.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {message}" if where else message


def load_plan_file(path: Path, catalog: Catalog, model_name: str | None) -> LoadedPlan:
    try:
        document = json.loads(path.read_text())
    except OSError as error:
        raise InputError(f"cannot read plan file {path}: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise InputError(
            f"plan file {path} is not JSON: {error.msg} (line {error.lineno})"
        ) from None
    if isinstance(document, dict) and "pipeline_list" in document:
        model = catalog.model(model_name or DEFAULT_SAILOR_MODEL)
        try:
            imported = plan_from_sailor(document, model, catalog)
        except (SailorFormatError, ValueError) as error:
            raise InputError(f"Sailor plan {path}: {str(error).splitlines()[0]}") from None
        return LoadedPlan(imported.plan, imported.cluster, imported.measured_iteration_seconds)
    try:
        plan = Plan.model_validate(document)
    except ValidationError as error:
        raise InputError(f"plan file {path}: {plan_error_line(error)}") from None
    if model_name is not None and catalog.resolve_model(model_name) != plan.model.name:
        raise InputError(f"plan file {path} is for model {plan.model.name}, not {model_name}")
    return LoadedPlan(plan, cluster_of(plan, catalog))


def plan_context(
    plan: Plan, cluster: ClusterSnapshot, measured: ProfileSet | None, catalog: Catalog
) -> PlanningContext:
    """The context to price `plan` in: measured profiles where given, estimates for the plan's
    GPU types, TP degrees and micro-batch size elsewhere (as make_plan completes them)."""
    types = sorted({w.gpu_type for w in plan.workers()})
    tps = sorted({s.tensor_parallel for s in plan.stages})
    profiles = complete_profiles(
        plan.model,
        types,
        tps,
        [plan.micro_batch_size],
        measured=measured or ProfileSet(),
        catalog=catalog,
        optimizer=plan.optimizer,
    )
    return PlanningContext(
        model=plan.model,
        cluster=cluster,
        profiles=profiles,
        catalog=catalog,
        optimizer=plan.optimizer,
    )


def estimated_inputs(
    loaded: LoadedPlan, measured: ProfileSet | None, catalog: Catalog
) -> list[str]:
    """The compute profiles simulate_plan had to estimate, each with how (the roofline, a
    measurement on another GPU scaled by the GPU ratio, a measured point scaled), and the
    links between zones whose pair was not measured, each with the curve that stood in
    (simulator.zone_links: the class curve, the median of measured pairs, the catalog)."""
    plan = loaded.plan
    context = plan_context(plan, loaded.cluster, measured, catalog)
    lines = []
    for key in sorted({w.gpu_type for w in plan.workers()}):
        for tp in sorted({s.tensor_parallel for s in plan.stages}):
            found = context.profiles.compute_profile(
                plan.model.name, key, tp, plan.micro_batch_size
            )
            if found is not None and found.provenance.source == "estimated":
                how = found.provenance.note or found.provenance.tool
                lines.append(f"{found.key} ({found.provenance.tool}: {how})")
    for a, b, link in zone_links(plan, context):
        if link.source == "estimated":
            lines.append(
                f"{link.key} ({a.zone}/{a.gpu_type} -> {b.zone}/{b.gpu_type} not measured: "
                f"priced from {link.how})"
            )
    return lines


def simulate_plan(loaded: LoadedPlan, measured: ProfileSet | None, catalog: Catalog) -> Predictions:
    """simulate() the plan with measured profiles where given, estimates elsewhere."""
    plan = loaded.plan
    context = plan_context(plan, loaded.cluster, measured, catalog)
    try:
        return simulate(plan, context)
    except MissingProfileError as error:
        raise InputError(str(error)) from None
