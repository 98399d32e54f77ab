"""Measured power curves (PowerProfile) reach the planner: the profile store reads and writes
them, `sailplan plan --profiles` carries them into the energy model, the energy objective's
search and the energy price, and a bad one is one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sailplan.operator.cli.main import app
from sailplan.planner.api import Objective, Planned, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cli_energy import context_for
from sailplan.planner.cli_inputs import cluster_from_flags
from sailplan.planner.energy import plan_energy
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.store import (
    ProfileStoreError,
    dumps,
    load_profile_dir,
    loads,
    write_profile,
)
from sailplan.planner.profiles.types import PowerPoint, PowerProfile, ProfileSet, Provenance
from sailplan.planner.search.energy import EnergyBound
from sailplan.planner.simulator import simulate

CATALOG = default_catalog()
MEASURED = Provenance(source="measured", tool="nvidia-smi", gpu_name="A100-SXM4-40GB")
# The A100-40's datasheet model draws 400 W (TDP) at 1410 MHz and 55 W idle, and about 328 W
# at 1200 MHz (planner/energy/power.py). This curve has the same two ends but is much
# flatter: lowering the clock saves almost no power, so it saves no energy either.
FLAT = PowerProfile(
    gpu_type="A100-40",
    idle_watts=55.0,
    points=tuple(
        PowerPoint(sm_mhz=mhz, watts=watts)
        for mhz, watts in ((1410, 400.0), (1305, 396.0), (1200, 392.0), (1095, 388.0))
    ),
    provenance=MEASURED,
)
# A GPU that draws less than its datasheet says at every clock (a power-capped board).
CAPPED = PowerProfile(
    gpu_type="A100-40",
    idle_watts=40.0,
    points=(
        PowerPoint(sm_mhz=1410, watts=300.0, time_factor=1.0),
        PowerPoint(sm_mhz=1200, watts=240.0, time_factor=1.1),
    ),
    provenance=MEASURED,
)
SMALL = ["--model", "GPT3-Small", "--global-batch", "64", "--pool", "A100-40:us-central1-a:4"]
runner = CliRunner()


def _plan(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["plan", *SMALL, *args])
    return result.exit_code, result.stdout, result.stderr


# -- the store --------------------------------------------------------------------------


def test_a_power_profile_round_trips_through_the_store(tmp_path: Path) -> None:
    path = write_profile(tmp_path, FLAT)
    assert path == tmp_path / "power" / "A100-40.json"
    assert load_profile_dir(tmp_path).power == (FLAT,)
    # YAML with the field names of the JSON document, and a whole ProfileSet, read the same
    (tmp_path / "power" / "A100-40.json").unlink()
    (tmp_path / "capped.yaml").write_text(
        "api_version: sailplan.dev/v1alpha1\nkind: PowerProfile\ngpu_type: A100-40\n"
        "idle_watts: 40\npoints:\n  - {sm_mhz: 1410, watts: 300, time_factor: 1.0}\n"
        "  - {sm_mhz: 1200, watts: 240, time_factor: 1.1}\n"
        "provenance: {source: measured, tool: nvidia-smi, gpu_name: A100-SXM4-40GB}\n"
    )
    assert load_profile_dir(tmp_path).power == (CAPPED,)
    assert loads(dumps(ProfileSet(power=(FLAT, CAPPED)))).power == (FLAT, CAPPED)


def test_measured_beats_estimated_and_later_beats_earlier() -> None:
    estimated = FLAT.model_copy(update={"provenance": Provenance(source="estimated", tool="x")})
    assert ProfileSet(power=(FLAT, estimated)).power_profiles() == (FLAT,)
    assert ProfileSet(power=(FLAT, CAPPED)).power_profiles() == (CAPPED,)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"points": []}, "points"),
        ({"idle_watts": 395.0}, "below the blocking power"),
        ({"points": [{"sm_mhz": 1410, "watts": 300, "time_factor": 0.9}]}, "time_factor"),
        ({"points": [{"sm_mhz": 1410, "watts": 300}, {"sm_mhz": 1410, "watts": 290}]}, "distinct"),
        ({"gpu_type": ""}, "gpu_type"),
    ],
)
def test_a_malformed_power_profile_is_one_line_naming_the_file(
    tmp_path: Path, change: dict[str, object], why: str
) -> None:
    document = {**FLAT.model_dump(mode="json"), **change}
    (tmp_path / "bad.json").write_text(json.dumps(document))
    with pytest.raises(ProfileStoreError) as error:
        load_profile_dir(tmp_path)
    message = str(error.value)
    assert "\n" not in message and "bad.json" in message and "PowerProfile" in message
    assert why in message
    code, _, err = _plan("--energy", "--profiles", str(tmp_path))
    assert code == 2
    assert err.count("\n") == 1 and "bad.json" in err and why in err


# -- the CLI ----------------------------------------------------------------------------


def test_a_flatter_measured_curve_saves_less_than_the_datasheet(tmp_path: Path) -> None:
    write_profile(tmp_path, FLAT)
    args = ("--energy", "--max-slowdown", "0.1", "--json")
    code, out, _ = _plan(*args)
    assert code == 0, out
    datasheet = Plan.from_json(out)
    code, out, _ = _plan(*args, "--profiles", str(tmp_path))
    assert code == 0, out
    measured = Plan.from_json(out)
    assert datasheet.predictions is not None and measured.predictions is not None
    with_sheet, with_curve = datasheet.predictions.energy, measured.predictions.energy
    assert with_sheet is not None and with_curve is not None
    assert (with_sheet.source, with_curve.source) == ("datasheet", "measured")
    # the same power at the default clock and while waiting: the same default-clock energy
    assert with_curve.joules_per_iteration_default == pytest.approx(
        with_sheet.joules_per_iteration_default, rel=1e-9
    )
    # the datasheet model trades the 10% for energy; the flat curve has nothing to trade
    assert with_sheet.joules_per_iteration < with_sheet.joules_per_iteration_default * 0.99
    assert with_curve.joules_per_iteration > with_sheet.joules_per_iteration
    sheet_clocks = [m for c in with_sheet.stage_clocks for m in c.steady_mhz]
    curve_clocks = [m for c in with_curve.stage_clocks for m in c.steady_mhz]
    assert max(sheet_clocks) < 1410 and set(curve_clocks) <= {p.sm_mhz for p in FLAT.points}
    assert min(curve_clocks) > min(sheet_clocks)
    # the text report names the model it used
    code, out, _ = _plan("--energy", "--profiles", str(tmp_path))
    assert code == 0 and "measured power model" in " ".join(out.split())


def test_a_power_profile_for_an_unknown_gpu_is_one_line_and_exit_2(tmp_path: Path) -> None:
    write_profile(tmp_path, FLAT.model_copy(update={"gpu_type": "Z100"}))
    code, _, err = _plan(
        "--objective", "energy", "--min-throughput", "20", "--profiles", str(tmp_path)
    )
    assert code == 2
    assert err.count("\n") == 1 and "Z100" in err and "PowerProfile" in err


# -- the search and the energy price ----------------------------------------------------


def _request(**objective: object) -> PlanRequest:
    return PlanRequest(
        model=CATALOG.model("GPT3-Small"),
        global_batch_size=64,
        cluster=cluster_from_flags(["A100-40:us-central1-a:4"], CATALOG),
        objective=Objective(**objective),  # type: ignore[arg-type]
    )


def test_the_energy_objective_searches_with_the_measured_curve() -> None:
    request = _request(kind="energy", min_samples_per_second=20.0)
    profiles = ProfileSet(power=(CAPPED,))
    capped = make_plan(request, profiles, CATALOG)
    datasheet = make_plan(request, None, CATALOG)
    assert isinstance(capped, Planned) and isinstance(datasheet, Planned)
    best = capped.best
    assert best.predictions is not None and best.predictions.energy is not None
    assert best.predictions.energy.source == "measured"
    # the energy the search ranked is plan_energy's with the curve ...
    context = context_for(best, request.cluster, profiles, CATALOG)
    again = plan_energy(best.model_copy(update={"predictions": None}), context)
    assert best.predictions.energy.joules_per_iteration == pytest.approx(
        again.prediction().joules_per_iteration, rel=1e-9
    )
    # ... which draws less than the datasheet at every clock, and so does its bound
    assert datasheet.best.predictions is not None
    assert datasheet.best.predictions.energy is not None
    assert best.predictions.energy.joules_per_iteration < (
        0.8 * datasheet.best.predictions.energy.joules_per_iteration
    )
    assert capped.energy_lower_bound is not None and datasheet.energy_lower_bound is not None
    assert capped.energy_lower_bound <= best.predictions.energy.joules_per_iteration * (1 + 1e-9)
    assert capped.energy_lower_bound < datasheet.energy_lower_bound
    # a bound from the datasheet would exceed this plan's energy and be capped at it
    assert capped.energy_lower_bound < 0.95 * best.predictions.energy.joules_per_iteration
    bound = EnergyBound(context, request.cluster.pools, 64)
    assert bound.model.curve("A100-40").source == "measured"
    assert bound.model.curve("A100-40").blocking_watts == 40.0


def test_the_energy_price_uses_the_measured_power() -> None:
    request = _request(kind="throughput")
    result = make_plan(request, None, CATALOG)
    assert isinstance(result, Planned)
    plan = result.best
    priced = request.cluster.model_copy(
        update={
            "pools": tuple(p.model_copy(update={"usd_per_kwh": 0.5}) for p in request.cluster.pools)
        }
    )
    usd = {}
    for name, profiles in (("datasheet", ProfileSet()), ("capped", ProfileSet(power=(CAPPED,)))):
        context = context_for(plan, priced, profiles, CATALOG)
        usd[name] = simulate(plan, context).energy_usd_per_iteration
        assert context.costs.gpu_watts("A100-40") == (
            (400.0, 55.0) if name == "datasheet" else (300.0, 40.0)
        )
    assert 0 < usd["capped"] < usd["datasheet"]
