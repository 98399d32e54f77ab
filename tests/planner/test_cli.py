"""`sailplan plan` / `sailplan simulate`: exit codes, one-line errors, JSON documents.

Runs the real root app (operator/cli/main.py mounts the planner's commands) with typer's
CliRunner. Small clusters (or a bounded pipeline depth) keep each search to seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sailplan.operator.cli.main import app
from sailplan.planner.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT.parent / "shared" / "reference" / "sailor-artifact"
SMALL = ["--model", "OPT-350M", "--global-batch", "64"]
runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_plan_prints_a_table_with_stages_and_predictions() -> None:
    code, out, _ = run(
        "plan", *SMALL, "--pool", "A100:us-central1-a:8", "--pool", "V100:us-central1-a:8"
    )
    assert code == 0, out
    assert "Best plan" in out
    assert "samples/s" in out and "USD/h" in out
    # nothing measured was given: the plan says its profiles are estimates
    assert "estimated profiles" in out


def test_plan_json_is_a_plan_document_and_a_list_with_top() -> None:
    code, out, _ = run("plan", *SMALL, "--pool", "A100-40:us-central1-a:8", "--json")
    assert code == 0
    plan = Plan.from_json(out)
    assert plan.global_batch_size == 64 and plan.predictions is not None
    assert plan.world_size <= 8

    code, out, _ = run("plan", *SMALL, "--pool", "A100-40:us-central1-a:8", "--json", "--top", "2")
    assert code == 0
    documents = json.loads(out)
    assert isinstance(documents, list) and len(documents) == 2
    assert [Plan.model_validate(d).reason != "" for d in documents] == [True, True]


def test_plan_from_cluster_file() -> None:
    # The example file's 128 GPUs make a full search of every depth take minutes
    # (docs/benchmarks.md, search speed): two stages at most keep this about the file.
    code, out, _ = run(
        "plan",
        *SMALL,
        "--cluster",
        str(ROOT / "benchmarks" / "clusters" / "two-zones-a100-v100.yaml"),
        "--objective",
        "cost",
        "--max-pipeline-depth",
        "2",
        "--json",
    )
    assert code == 0, out
    plan = Plan.from_json(out)
    pools = {r.pool for s in plan.stages for r in s.replicas}
    assert pools <= {"a100-central-a", "v100-central-a", "v100-central-b-spot"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--pool", "Z100:us-central1-a:8"), "known: A100-40"),
        (("--pool", "A100:us-central1-a"), "GPU:ZONE:COUNT"),
        (("--pool", "A100:us-central1-a:eight"), "not a whole number"),
        (("--pool", "A100:us-central1-a:12", "--gpus-per-node", "8"), "8-GPU nodes"),
        (("--pool", "A100:us-central1-a:8:ondemand"), "GPU:ZONE:COUNT:spot"),
        ((), "either --pool flags or --cluster FILE"),
    ],
)
def test_user_errors_exit_2_with_one_line(args: tuple[str, ...], needle: str) -> None:
    code, out, err = run("plan", *SMALL, *args)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in out + err


def test_unknown_model_exits_2_naming_the_known_ones() -> None:
    code, _, err = run("plan", "--model", "GPT-9", "--pool", "A100:us-central1-a:8")
    assert code == 2
    assert "unknown model 'GPT-9'" in err and "OPT-350M" in err


def test_malformed_number_exits_2() -> None:
    code, out, err = run(
        "plan", "--model", "OPT-350M", "--global-batch", "lots", "--pool", "A100:z:8"
    )
    assert code == 2
    assert "Traceback" not in out + err


def test_infeasible_exits_3_with_the_reason() -> None:
    code, _, err = run(
        "plan", "--model", "OPT-30B", "--global-batch", "8", "--pool", "V100:us-central1-a:1"
    )
    assert code == 3
    assert "OutOfMemory" in err and "GiB" in err
    assert len(err.strip().splitlines()) == 1


def test_model_file(tmp_path: Path) -> None:
    spec = tmp_path / "model.yaml"
    spec.write_text(
        "name: mini\nhidden_size: 512\nnum_blocks: 4\nnum_heads: 8\n"
        "vocab_size: 1000\nsequence_length: 256\n"
    )
    code, out, _ = run(
        "plan",
        "--model-file",
        str(spec),
        "--global-batch",
        "16",
        "--pool",
        "A100:us-central1-a:2",
        "--json",
    )
    assert code == 0, out
    assert Plan.from_json(out).model.name == "mini"

    spec.write_text(
        "name: mini\nhidden_size: 500\nnum_blocks: 4\nnum_heads: 8\nvocab_size: 1\nsequence_length: 8\n"
    )
    code, _, err = run("plan", "--model-file", str(spec), "--pool", "A100:us-central1-a:2")
    assert code == 2 and "not divisible" in err


def test_simulate_a_plan_the_planner_wrote(tmp_path: Path) -> None:
    code, out, _ = run("plan", *SMALL, "--pool", "A100:us-central1-a:8", "--json")
    assert code == 0
    planned = Plan.from_json(out)
    path = tmp_path / "plan.json"
    path.write_text(out)
    code, out, _ = run("simulate", "--plan", str(path), "--json")
    assert code == 0, out
    simulated = json.loads(out)
    # the same plan with the same (estimated) profiles: the same prediction
    assert planned.predictions is not None
    assert simulated["iteration_seconds"] == pytest.approx(planned.predictions.iteration_seconds)
    code, out, _ = run("simulate", "--plan", str(path))
    assert code == 0 and "Simulated plan" in out


def test_simulate_rejects_a_broken_plan_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    code, _, err = run("simulate", "--plan", str(path))
    assert code == 2 and "not JSON" in err
    path.write_text(json.dumps({"kind": "Plan"}))
    code, _, err = run("simulate", "--plan", str(path))
    assert code == 2 and "plan file" in err


def test_simulate_names_the_field_of_an_invalid_plan(tmp_path: Path) -> None:
    code, out, _ = run("plan", *SMALL, "--pool", "A100:us-central1-a:8", "--json")
    assert code == 0
    document = json.loads(out)
    document["stages"][-1]["layer_end"] -= 2  # the last two layers belong to no stage
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document))
    code, _, err = run("simulate", "--plan", str(path))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "stages cover layers" in err and "Value error" not in err
    document["micro_batch_size"] = 0
    path.write_text(json.dumps(document))
    code, _, err = run("simulate", "--plan", str(path))
    assert code == 2 and "micro_batch_size" in err


def test_simulate_a_sailor_plan_with_the_artifact_profiles() -> None:
    plans = sorted((ARTIFACT / "validation" / "gh200-opt350").glob("plan_config_*.json"))
    if not plans:
        pytest.skip(f"Sailor artifact not found at {ARTIFACT}")
    code, out, _ = run("simulate", "--plan", str(plans[0]), "--profiles", str(ARTIFACT), "--json")
    assert code == 0, out
    predicted = json.loads(out)["iteration_seconds"]
    measured = json.loads(plans[0].read_text())["real"]
    # planner-core calibrates the simulator to within tens of percent on these runs; a
    # prediction off by more than 2x would mean the plan was read wrongly
    assert measured / 2 < predicted < measured * 2
