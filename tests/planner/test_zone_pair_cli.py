"""`sailplan simulate` prices a link between zones from that zone pair's measured curve and
names the link class it fell back to when the pair was not measured."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sailplan.operator.cli.main import app
from sailplan.planner.catalog import default_catalog
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.store import write_profile
from sailplan.planner.profiles.types import BandwidthCurve, NetworkProfile, Provenance

ZA, ZB, ZC = "us-central1-a", "us-central1-b", "us-central1-c"
runner = CliRunner()


def plan_file(tmp_path: Path, second_zone: str) -> Path:
    model = default_catalog().model("OPT-350M")
    half = model.num_layers // 2
    stages = (
        Stage(
            layer_start=0,
            layer_end=half,
            replicas=(Replica(pool="a", gpu_type="A100-40", zone=ZA),),
        ),
        Stage(
            layer_start=half,
            layer_end=model.num_layers,
            replicas=(Replica(pool=f"p-{second_zone}", gpu_type="A100-40", zone=second_zone),),
        ),
    )
    plan = Plan(
        model=model, global_batch_size=8, micro_batch_size=1, num_micro_batches=8, stages=stages
    )
    path = tmp_path / f"plan-{second_zone}.json"
    path.write_text(plan.to_json())
    return path


def measured_pairs(tmp_path: Path) -> Path:
    """A <-> B measured slow, A <-> C fast (both directions of each pair)."""
    directory = tmp_path / "profiles"
    for zone, peer_zone, rate in ((ZA, ZB, 2e7), (ZB, ZA, 2e7), (ZA, ZC, 2e8), (ZC, ZA, 2e8)):
        write_profile(
            directory,
            NetworkProfile(
                link="inter-zone",
                gpu_type="A100-40",
                peer_gpu_type="A100-40",
                zone=zone,
                peer_zone=peer_zone,
                gpus_per_node=1,
                curve=BandwidthCurve(
                    coefficients=(0.0, 0.0, rate / 1e9), max_bytes_per_s=rate, min_bytes_per_s=rate
                ),
                provenance=Provenance(source="measured", tool="test", date="2026-11-25"),
            ),
        )
    return directory


def simulate(*args: str) -> str:
    result = runner.invoke(app, ["simulate", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_measured_zone_pairs_price_their_own_links(tmp_path: Path) -> None:
    profiles = str(measured_pairs(tmp_path))
    to_b = json.loads(
        simulate("--plan", str(plan_file(tmp_path, ZB)), "--profiles", profiles, "--json")
    )
    to_c = json.loads(
        simulate("--plan", str(plan_file(tmp_path, ZC)), "--profiles", profiles, "--json")
    )
    # the same plan shape and compute; only the measured link between the zones differs
    assert to_b["iteration_seconds"] > to_c["iteration_seconds"]
    out = simulate("--plan", str(plan_file(tmp_path, ZB)), "--profiles", profiles)
    assert f"network/inter-zone/{ZA}" not in out  # measured: not an estimated input


def test_an_unmeasured_zone_pair_is_named_with_its_fallback(tmp_path: Path) -> None:
    out = " ".join(simulate("--plan", str(plan_file(tmp_path, ZB))).split())  # unwrapped
    assert (
        "estimated input: network/inter-zone/us-central1-a/A100-40/us-central1-b/A100-40/n1" in out
    )
    assert "not measured: priced from the inter-zone class estimate (catalog)" in out
