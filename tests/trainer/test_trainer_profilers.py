"""The profilers measure on real processes (gloo on the CPU) and write files the planner loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_harness import TINY
from typer.testing import CliRunner

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.store import load_profile_dir
from sailplan.trainer.profilers.cli import app
from sailplan.trainer.profilers.compute import LayerTimes, profile_grid
from sailplan.trainer.profilers.network import fit_curve

pytestmark = pytest.mark.trainer


def test_model_profiler_writes_one_measured_profile_per_grid_point(tmp_path: Path) -> None:
    model_file = tmp_path / "tiny.json"
    model_file.write_text(TINY.model_dump_json())
    result = CliRunner().invoke(
        app,
        [
            "model",
            "--model-file",
            str(model_file),
            "--gpu-type",
            "CPU",
            "--out",
            str(tmp_path / "p"),
            "--tp",
            "1,2",
            "--mbs",
            "1",
            "--blocks",
            "2",
            "--iterations",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    profiles = load_profile_dir(tmp_path / "p")
    assert profiles.compute_grid("tiny-gpt", "CPU") == [(1, 1), (2, 1)]
    profile = profiles.compute_profile("tiny-gpt", "CPU", 2, 1)
    assert profile is not None and not profile.oom
    assert len(profile.forward_s) == TINY.num_layers
    assert all(t > 0 for t in profile.forward_s + profile.backward_s + profile.update_s)
    # blocks beyond the measured two are the measured mean, so all blocks agree
    assert len(set(profile.forward_s[1:-1])) == 1
    assert profile.provenance.source == "measured"
    assert profile.provenance.tool == "sailplan-profile"
    assert profile.provenance.torch_version == torch.__version__


def test_out_of_memory_points_are_recorded_not_raised() -> None:
    def measure(
        spec: ModelSpec, tp: int, mbs: int, blocks: int, iterations: int
    ) -> list[LayerTimes] | None:
        if mbs > 1:
            return None  # what measure_locally returns when a rank hit torch.OutOfMemoryError
        return [LayerTimes(1.0, 2.0, 0.5, 0)] * (blocks + 2)

    profiles = profile_grid(TINY, "CPU", [1], [1, 2], blocks=2, measure=measure)
    assert [p.oom for p in profiles] == [False, True]
    assert profiles[1].forward_s == ()
    assert profiles[0].forward_s == (1.0,) * TINY.num_layers


def test_bandwidth_fit_recovers_a_known_quadratic() -> None:
    # bandwidth(x) = -0.02 x^2 + 0.5 x + 4 GB/s with x = log2(MB): sample it, then fit
    sizes = [64 * 1024 * 4**i for i in range(8)]
    truth = [(-0.02, 0.5, 4.0)]
    measurements = []
    for size in sizes:
        x = torch.log2(torch.tensor(size / 1e6)).item()
        gbps = -0.02 * x * x + 0.5 * x + 4.0
        measurements.append((size, size / (gbps * 1e9)))
    curve = fit_curve(measurements)
    assert curve.coefficients == pytest.approx(truth[0], abs=1e-6)
    assert curve.bytes_per_second(sizes[3]) == pytest.approx(
        sizes[3] / measurements[3][1], rel=1e-6
    )


def test_network_profiler_writes_a_profile_the_planner_loads(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "network",
            "--link",
            "intra-node",
            "--gpu-type",
            "CPU",
            "--out",
            str(tmp_path),
            "--max-bytes",
            str(4 * 2**20),
            "--repeats",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    profile = load_profile_dir(tmp_path).network_profile("intra-node", "CPU")
    assert profile is not None and profile.provenance.source == "measured"
    assert profile.curve.max_bytes_per_s >= profile.curve.min_bytes_per_s > 0


def test_unknown_link_class_is_a_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["network", "--link", "moon", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown link class 'moon'" in result.output


def test_unknown_catalog_model_is_a_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["model", "--model", "no-such-model", "--gpu-type", "CPU", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "unknown model 'no-such-model'" in result.output
