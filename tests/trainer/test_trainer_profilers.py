"""The profilers measure on real processes (gloo on the CPU) and write files the planner loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_harness import TINY
from typer.testing import CliRunner

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.store import load_profile_dir
from sailplan.planner.profiles.types import ProfileSet
from sailplan.trainer.profilers.cli import app
from sailplan.trainer.profilers.compute import LayerTimes, profile_grid
from sailplan.trainer.profilers.network import directions, fit_curve

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


def _network(tmp_path: Path, *args: str) -> ProfileSet:
    small = ["--min-bytes", str(64 * 1024), "--max-bytes", str(2**20), "--repeats", "1"]
    result = CliRunner().invoke(app, ["network", "--out", str(tmp_path), *small, *args])
    assert result.exit_code == 0, result.output
    return load_profile_dir(tmp_path)


def test_intra_node_profiler_measures_p2p_and_the_nodes_allreduce(tmp_path: Path) -> None:
    # three local ranks stand for a three-GPU node
    profiles = _network(
        tmp_path,
        *("--link", "intra-node", "--gpu-type", "CPU", "--peer-gpu-type", "CPU"),
        *("--gpus-per-node", "3", "--procs-per-node", "3"),
    )
    p2p = profiles.network_profile("intra-node", "CPU", "CPU", 3)
    assert p2p is not None and p2p.measure == "p2p" and p2p.provenance.source == "measured"
    assert p2p.curve.max_bytes_per_s >= p2p.curve.min_bytes_per_s > 0
    bus = profiles.network_profile("intra-node", "CPU", "CPU", 3, measure="allreduce")
    assert bus is not None and (bus.gpus_per_node, bus.ranks) == (3, 3)
    assert bus.provenance.tool == "sailplan-profile" and bus.provenance.date
    assert "all-reduce bus bandwidth" in bus.provenance.note


def test_node_pair_profiler_measures_both_directions_flows_and_allreduce(tmp_path: Path) -> None:
    # two "nodes" of two ranks each, all local (gloo), with different GPU type names so the
    # two directions are filed apart
    profiles = _network(
        tmp_path,
        *("--link", "intra-zone", "--gpu-type", "A", "--peer-gpu-type", "B"),
        *("--procs-per-node", "2"),
    )
    by_measure: dict[str, list[tuple[str, str]]] = {}
    for found in profiles.network:
        assert found.link == "intra-zone" and found.provenance.source == "measured"
        by_measure.setdefault(found.measure, []).append((found.gpu_type, found.peer_gpu_type))
    assert sorted(by_measure["p2p"]) == [("A", "B"), ("B", "A")]
    assert sorted(by_measure["concurrent"]) == [("A", "B"), ("B", "A")]
    assert by_measure["allreduce"] == [("A", "B")]
    flows = profiles.network_profile("intra-zone", "B", "A", 2, measure="concurrent")
    assert flows is not None and (flows.gpu_type, flows.ranks, flows.gpus_per_node) == ("B", 4, 2)
    bus = profiles.network_profile("intra-zone", "A", "B", 2, measure="allreduce")
    assert bus is not None and bus.ranks == 4


def test_one_gpu_type_keeps_the_slower_direction_at_each_size() -> None:
    forward = [(1, 10.0), (2, 5.0)]
    backward = [(1, 4.0), (2, 8.0)]
    ((sender, receiver, rates, how),) = directions(forward, backward, "A100", "A100")
    assert (sender, receiver, rates) == (("", "A100"), ("", "A100"), [(1, 4.0), (2, 5.0)])
    assert "slower" in how


def test_a_zone_pair_of_one_gpu_type_keeps_both_directions() -> None:
    forward = [(1, 10.0), (2, 5.0)]
    backward = [(1, 4.0), (2, 8.0)]
    found = directions(forward, backward, "A100", "A100", ("z-a", "z-b"))
    assert [(s, r, rates) for s, r, rates, _ in found] == [
        (("z-a", "A100"), ("z-b", "A100"), forward),
        (("z-b", "A100"), ("z-a", "A100"), backward),
    ]


def test_node_pair_profiler_files_curves_under_the_zone_pair(tmp_path: Path) -> None:
    # two "nodes" of two ranks in two zones, one GPU type: each direction under its sender
    profiles = _network(
        tmp_path,
        *("--link", "inter-zone", "--gpu-type", "A", "--peer-gpu-type", "A"),
        *("--zone", "r1-a", "--peer-zone", "r1-b", "--procs-per-node", "2"),
    )
    ends = {(p.measure, p.zone, p.peer_zone) for p in profiles.network}
    assert ends == {
        ("p2p", "r1-a", "r1-b"),
        ("p2p", "r1-b", "r1-a"),
        ("concurrent", "r1-a", "r1-b"),
        ("concurrent", "r1-b", "r1-a"),
        ("allreduce", "r1-a", "r1-b"),
    }
    assert all(p.api_version == "sailplan.dev/v1alpha2" for p in profiles.network)
    # a class lookup does not take a zone pair's curve for the whole class
    assert profiles.network_profile("inter-zone", "A", "A") is None
    back = profiles.zone_pair_profile("r1-b", "A", "r1-a", "A", 0)
    assert back is not None and "node 1 -> node 0" in back.provenance.note


def test_zone_options_are_checked_in_one_line(tmp_path: Path) -> None:
    half = ["network", "--out", str(tmp_path), "--link", "inter-zone", "--zone", "r1-a"]
    result = CliRunner().invoke(app, half)
    assert result.exit_code == 2 and "--zone and --peer-zone go together" in result.output
    inside = ["network", "--out", str(tmp_path), "--link", "intra-zone"]
    result = CliRunner().invoke(app, [*inside, "--zone", "a", "--peer-zone", "b"])
    assert result.exit_code == 2 and "inter-zone or inter-region" in result.output


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
