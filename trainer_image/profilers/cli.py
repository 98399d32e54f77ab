"""`sailplan-profile`: the profilers' command line (model and network), run in profiling Jobs.

Both write profile files into `--out` in the layout the planner's profile-directory loader
reads (planner/profiles/store.py), and print one line per file written. Mistakes in the
arguments end with a one-line message and exit status 2.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, get_args

import typer

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.store import write_profile
from sailplan.planner.profiles.types import MEASURES, LinkClass, Measure

app = typer.Typer(
    name="sailplan-profile",
    help="Measure compute and network profiles for the Sailplan planner.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{what} must be positive integers, got {text!r}")
    return values


def _fail(message: str) -> None:
    typer.echo(f"sailplan-profile: {message}", err=True)
    raise typer.Exit(2)


def _load_model(model_file: Path | None, model: str | None) -> ModelSpec:
    if model_file is not None:
        try:
            return ModelSpec.model_validate_json(model_file.read_text())
        except OSError as error:
            _fail(f"cannot read {model_file}: {error.strerror}")
        except ValueError as error:
            _fail(f"{model_file} is not a ModelSpec: {str(error).splitlines()[0]}")
    if model is not None:
        from sailplan.planner.catalog import default_catalog

        try:
            return default_catalog().model(model)
        except LookupError as error:
            _fail(str(error))
    _fail("give --model NAME (catalog) or --model-file FILE (ModelSpec JSON)")
    raise AssertionError  # unreachable: _fail exits


@app.command("model")
def model_command(  # noqa: PLR0917 (typer maps parameters to options)
    gpu_type: Annotated[str, typer.Option(help="GPU type name the profiles are filed under")],
    out: Annotated[Path, typer.Option(help="profile directory to write into")],
    model: Annotated[str | None, typer.Option(help="catalog model name")] = None,
    model_file: Annotated[Path | None, typer.Option(help="ModelSpec JSON file")] = None,
    tp: Annotated[str, typer.Option(help="TP degrees, comma-separated")] = "1",
    mbs: Annotated[str, typer.Option(help="micro-batch sizes, comma-separated")] = "1,2,4",
    blocks: Annotated[int, typer.Option(help="blocks measured (the rest extrapolated)")] = 2,
    iterations: Annotated[int, typer.Option(help="timed iterations per layer")] = 3,
) -> None:
    """Per-layer forward/backward/update time and memory over a TP x micro-batch grid."""
    from sailplan.trainer.profilers.compute import profile_grid

    spec = _load_model(model_file, model)
    try:
        profiles = profile_grid(
            spec,
            gpu_type,
            _ints(tp, "--tp"),
            _ints(mbs, "--mbs"),
            blocks=max(1, blocks),
            iterations=max(1, iterations),
        )
    except ValueError as error:
        _fail(str(error))
    for profile in profiles:
        typer.echo(str(write_profile(out, profile)))


def _measures(text: str) -> tuple[Measure, ...]:
    wanted = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in wanted if m not in MEASURES]
    if unknown or not wanted:
        raise typer.BadParameter(f"--measure takes {', '.join(MEASURES)}, got {text!r}")
    return wanted  # type: ignore[return-value]


@app.command("network")
def network_command(  # noqa: PLR0917 (typer maps parameters to options)
    link: Annotated[str, typer.Option(help="intra-node, intra-zone, inter-zone, inter-region")],
    out: Annotated[Path, typer.Option(help="profile directory to write into")],
    gpu_type: Annotated[str, typer.Option(help="this rank's GPU type")] = "",
    peer_gpu_type: Annotated[str, typer.Option(help="the other rank's GPU type")] = "",
    zone: Annotated[
        str, typer.Option(help="this node's zone: file the curves under the zone pair")
    ] = "",
    peer_zone: Annotated[str, typer.Option(help="the other node's zone")] = "",
    gpus_per_node: Annotated[int, typer.Option(help="node shape the p2p curve is filed under")] = 0,
    procs_per_node: Annotated[
        int, typer.Option(help="ranks (GPUs) per node; 0 = 2 inside a node, 1 across")
    ] = 0,
    nodes: Annotated[int, typer.Option(help="nodes when all ranks run here (tests)")] = 0,
    measure: Annotated[str, typer.Option(help="p2p,concurrent,allreduce (comma list)")] = (
        "p2p,concurrent,allreduce"
    ),
    min_bytes: Annotated[int, typer.Option(help="smallest message")] = 64 * 1024,
    max_bytes: Annotated[int, typer.Option(help="largest message")] = 2**30,
    repeats: Annotated[int, typer.Option(help="timed repetitions per size")] = 3,
) -> None:
    """Bandwidth against message size: p2p both ways, concurrent flows, all-reduce bus bandwidth.

    With RANK and MASTER_ADDR set (one pod per node of a profiling Job) this pod runs ranks
    RANK x procs-per-node onwards of two nodes and rank 0's pod writes the profiles;
    otherwise every rank runs here (`--nodes`, default 1 for intra-node and 2 across nodes).
    """
    from sailplan.trainer.profilers import network

    if link not in get_args(LinkClass):
        _fail(f"unknown link class {link!r}: one of {', '.join(get_args(LinkClass))}")
    sizes = [s for s in network.default_sizes(max_bytes) if s >= min_bytes]
    if len(sizes) < 3:
        _fail("need at least three message sizes between --min-bytes and --max-bytes")
    try:
        measures = _measures(measure)
    except typer.BadParameter as error:
        _fail(str(error.message))
    if bool(zone) != bool(peer_zone):
        _fail("--zone and --peer-zone go together (the two ends of a zone pair)")
    if zone and link not in {"inter-zone", "inter-region"}:
        _fail(f"--zone files a pair of zones: --link inter-zone or inter-region, not {link}")
    if zone and (not gpu_type or not peer_gpu_type):
        _fail("a zone pair names both GPU types (--gpu-type and --peer-gpu-type)")
    inside = link == "intra-node"
    per_node = procs_per_node or (2 if inside else 1)
    repeats = max(1, repeats)
    if inside and per_node < 2:
        _fail("intra-node profiling needs --procs-per-node of at least 2")
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ and not inside:
        from sailplan.trainer.profilers.common import run_ranks

        node = int(os.environ["RANK"])
        found = run_ranks(
            node * per_node,
            per_node,
            2 * per_node,
            os.environ["MASTER_ADDR"],
            int(os.environ.get("MASTER_PORT", "29500")),
            network.measure_ranks,
            sizes,
            repeats,
            per_node,
            measures,
        )
        if node != 0:
            return
    else:
        count = nodes or (1 if inside else 2)
        found = network.measure_locally(count, per_node, sizes, repeats, measures)
    for profile in network.profiles_of(
        link,  # type: ignore[arg-type]
        found,
        gpu_type,
        peer_gpu_type,
        gpus_per_node,
        (zone, peer_zone),
    ):
        typer.echo(str(write_profile(out, profile)))


def main() -> None:
    app()
