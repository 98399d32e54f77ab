"""`sailplan-train` rejects a broken pod configuration with one line and exit status 2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from trainer_harness import TINY, make_plan, run_fresh

from sailplan.planner import workerenv as env
from sailplan.planner.workerenv import TrainerConfig


def _run(tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess[str]:
    plan_path, config_path = tmp_path / "plan.json", tmp_path / "trainer.json"
    plan_path.write_text(make_plan(TINY, [(0, 6, 1)], 1, 2, 8).to_json())
    config_path.write_text(TrainerConfig(steps=1, checkpoint_dir=str(tmp_path)).model_dump_json())
    environment = {
        **os.environ,
        env.PLAN_PATH: str(plan_path),
        env.TRAINER_CONFIG_PATH: str(config_path),
        env.WORKER_INDEX: "0",
        **overrides,
    }
    return run_fresh(environment)


def test_missing_plan_file(tmp_path: Path) -> None:
    result = _run(tmp_path, **{env.PLAN_PATH: str(tmp_path / "nope.json")})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"sailplan-train: cannot read the plan at {tmp_path / 'nope.json'}: No such file or directory"
    ]


def test_worker_index_outside_the_plan(tmp_path: Path) -> None:
    result = _run(tmp_path, **{env.WORKER_INDEX: "3"})
    assert result.returncode == 2
    assert "SAILPLAN_WORKER_INDEX=3 but the plan has 1 workers" in result.stderr
    assert "Traceback" not in result.stderr


def test_world_size_that_disagrees_with_the_plan(tmp_path: Path) -> None:
    result = _run(tmp_path, **{env.WORLD_SIZE: "4"})
    assert result.returncode == 2
    assert "WORLD_SIZE=4 but the plan needs 1 ranks" in result.stderr
