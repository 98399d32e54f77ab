"""`sailplan plan --energy`, `--frontier-png`, `--energy-price`, `--objective energy`.

Small clusters keep each search well under a second; the PNG is checked by its signature.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sailplan.operator.cli.main import app
from sailplan.planner.api import Planned, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cli_inputs import cluster_from_flags
from sailplan.planner.plan import EnergyPrediction, Plan

SMALL = ["--model", "GPT3-Small", "--global-batch", "64", "--pool", "A100-40:us-central1-a:4"]
runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_energy_prints_energy_per_iteration_and_the_no_slowdown_savings() -> None:
    code, out, _ = run("plan", *SMALL, "--energy", "--energy-price", "0.12")
    assert code == 0, out
    assert "kJ/iteration at default clocks" in out
    assert "at no slowdown (saves" in out
    assert "no-slowdown SM clocks (MHz)" in out
    assert "one clock per GPU, as the node agent locks it" in out
    assert "per-pass clocks (not applied" in out
    assert "USD/iteration" in out and "0.12 USD/kWh" in out


def test_energy_json_carries_the_energy_fields() -> None:
    code, out, _ = run("plan", *SMALL, "--energy", "--json")
    assert code == 0, out
    plan = Plan.from_json(out)
    assert plan.predictions is not None and plan.predictions.energy is not None
    energy = plan.predictions.energy
    assert energy.joules_per_iteration <= energy.joules_per_iteration_default
    assert energy.iteration_seconds == pytest.approx(plan.predictions.iteration_seconds)
    assert len(energy.stage_clocks) == plan.pipeline_depth
    # without --energy the document has no energy fields
    code, out, _ = run("plan", *SMALL, "--json")
    assert code == 0
    predictions = Plan.from_json(out).predictions
    assert predictions is not None and predictions.energy is None


def test_frontier_png_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "frontier.png"
    code, out, _ = run("plan", *SMALL, "--frontier-png", str(target))
    assert code == 0, out
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "frontier:" in out or "frontier plotted" in out


def test_energy_objective_meets_the_floor_with_the_least_energy() -> None:
    code, out, _ = run("plan", *SMALL, "--objective", "energy", "--min-throughput", "20", "--json")
    assert code == 0, out
    plan = Plan.from_json(out)
    assert plan.predictions is not None and plan.predictions.energy is not None
    chosen = plan.predictions.energy
    assert plan.global_batch_size / chosen.iteration_seconds >= 20 * (1 - 1e-9)
    assert chosen.joules_per_iteration <= chosen.joules_per_iteration_default
    # the search's energy objective, not a re-ranking of the other objectives' plans
    assert plan.reason.startswith("least GPU energy at no-slowdown clocks")
    assert chosen.iteration_seconds == pytest.approx(plan.predictions.iteration_seconds)


def test_energy_price_flows_into_the_cost() -> None:
    code, out, _ = run("plan", *SMALL, "--json")
    assert code == 0, out
    plain = Plan.from_json(out).predictions
    code, out, _ = run("plan", *SMALL, "--energy-price", "0.5", "--json")
    assert code == 0, out
    priced = Plan.from_json(out).predictions
    assert plain is not None and priced is not None and priced.energy is not None
    # the price covers the GPUs' energy at default clocks
    energy_usd = priced.energy.joules_per_iteration_default / 3.6e6 * 0.5
    assert priced.energy_usd_per_iteration == pytest.approx(energy_usd, rel=1e-9)
    assert priced.usd_per_iteration == pytest.approx(plain.usd_per_iteration + energy_usd)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--energy-price", "-0.1"), "below zero"),
        (("--objective", "energy"), "needs a throughput floor"),
    ],
)
def test_bad_energy_input_is_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    code, out, err = run("plan", *SMALL, *args)
    assert code == 2, out
    assert needle in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_gpu_for_the_energy_model_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sailplan.planner import cli
    from sailplan.planner.catalog import default_catalog

    catalog = default_catalog()
    gpus = dict(catalog.gpus)
    gpus["A100-40"] = gpus["A100-40"].model_copy(update={"power": None})
    without_power = type(catalog)(
        gpus=gpus,
        models=catalog.models,
        regions=catalog.regions,
        egress=catalog.egress,
        remote_continents=catalog.remote_continents,
        continent_prefixes=catalog.continent_prefixes,
    )
    monkeypatch.setattr(cli, "default_catalog", lambda: without_power)
    for extra in (
        ("--energy",),
        ("--energy-price", "0.1"),
        ("--objective", "energy", "--min-throughput", "5"),
    ):
        code, out, err = run("plan", *SMALL, *extra)
        assert code == 2, (extra, out)
        assert "no power data for GPU type 'A100-40'" in err
        assert len(err.strip().splitlines()) == 1


def _energy(*args: str) -> EnergyPrediction:
    code, out, err = run("plan", *SMALL, *args, "--json")
    assert code == 0, out + err
    predictions = Plan.from_json(out).predictions
    assert predictions is not None and predictions.energy is not None
    return predictions.energy


def test_max_slowdown_prices_the_plan_at_that_point_of_the_frontier_as_a_job_would() -> None:
    """`--max-slowdown 0.1` carries what a TrainingJob with spec.energy.maxSlowdown 0.1 gets
    (the operator's request: energy predictions at that slowdown), and that point trades
    at most 10% of the default-clock time for less energy than the no-slowdown point."""
    slowed = _energy("--max-slowdown", "0.1")
    no_slowdown = _energy("--energy")
    assert slowed.max_slowdown == 0.1 and no_slowdown.max_slowdown == 0.0
    assert slowed.joules_per_iteration_default == no_slowdown.joules_per_iteration_default
    assert slowed.joules_per_iteration < no_slowdown.joules_per_iteration
    assert slowed.iteration_seconds <= no_slowdown.iteration_seconds * 1.1 * (1 + 1e-9)
    assert slowed.iteration_seconds > no_slowdown.iteration_seconds

    catalog = default_catalog()
    job = make_plan(
        PlanRequest(
            model=catalog.model("GPT3-Small"),
            global_batch_size=64,
            cluster=cluster_from_flags(["A100-40:us-central1-a:4"], catalog, None),
            energy_predictions=True,
            energy_max_slowdown=0.1,
            memory_options=True,
        ),
        None,
        catalog,
    )
    assert isinstance(job, Planned) and job.best.predictions is not None
    operator = job.best.predictions.energy
    assert operator is not None
    assert slowed.joules_per_iteration == pytest.approx(operator.joules_per_iteration, rel=1e-9)
    assert slowed.stage_clocks == operator.stage_clocks

    code, out, _ = run("plan", *SMALL, "--max-slowdown", "0.1")
    assert code == 0, out
    assert "max slowdown 10%:" in out and "max-slowdown SM clocks (MHz)" in out


def test_max_slowdown_moves_the_energy_objective_within_the_throughput_floor() -> None:
    floor = ("--objective", "energy", "--min-throughput", "20")
    slowed = _energy(*floor, "--max-slowdown", "0.5")
    at_no_slowdown = _energy(*floor)
    assert slowed.max_slowdown == 0.5
    assert slowed.joules_per_iteration <= at_no_slowdown.joules_per_iteration
    assert 64 / slowed.iteration_seconds >= 20 * (1 - 1e-9)  # never below the floor


@pytest.mark.parametrize("value", ["10", "-0.1", "1.5", "abc", "nan", ""])
def test_a_bad_max_slowdown_is_one_line_and_exit_2(value: str) -> None:
    code, out, err = run("plan", *SMALL, "--max-slowdown", value)
    assert code == 2, out
    assert f"--max-slowdown {value} is not a fraction from 0 to 1" in err
    assert len(err.strip().splitlines()) == 1
