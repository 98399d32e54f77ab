"""A worker forked from the preloaded server behaves as `python -m sailplan.trainer.train`.

The trainer tests fork their workers (forked_workers.py) for speed; these checks are what
lets them stand for the fresh process a pod runs: the same exit status, stdout and stderr
for a broken configuration, and the same losses for a run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from forked_workers import start_worker
from trainer_harness import TINY, make_plan, run_fresh, run_plan, trainer_config

from sailplan.planner import workerenv as env


def test_a_broken_configuration_ends_a_forked_worker_as_it_ends_a_fresh_one(
    tmp_path: Path,
) -> None:
    environment = {
        **os.environ,
        env.PLAN_PATH: str(tmp_path / "nope.json"),
        env.WORKER_INDEX: "0",
    }
    fresh = run_fresh(environment)
    forked = start_worker(environment, tmp_path / "forked.err")
    stdout, _ = forked.communicate(timeout=120)
    assert fresh.returncode == 2  # the CLI's contract (test_train_cli.py)
    assert (forked.returncode, stdout, (tmp_path / "forked.err").read_text()) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )


@pytest.mark.trainer
def test_a_forked_worker_trains_the_losses_of_a_fresh_one(tmp_path: Path) -> None:
    plan = make_plan(TINY, [(0, TINY.num_layers, 1)], 1, 2, 8)
    fresh = run_plan(
        plan, trainer_config(tmp_path / "fresh", 3), tmp_path / "fresh", fresh_interpreters=True
    )
    forked = run_plan(plan, trainer_config(tmp_path / "forked", 3), tmp_path / "forked")
    assert sorted(fresh.losses) == [1, 2, 3]
    assert forked.losses == fresh.losses
    assert forked.returncodes == fresh.returncodes == [0]
