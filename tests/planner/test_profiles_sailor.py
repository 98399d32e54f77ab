"""The Sailor artifact importer: profiles, network fits and plans in the project's own types."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.profiles.sailor import (
    SailorFormatError,
    SailorImport,
    import_artifact,
    plan_from_sailor,
)

ARTIFACT = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "sailor-artifact"


@pytest.fixture(scope="module")
def imported() -> SailorImport:
    if not (ARTIFACT / "profiles").is_dir():
        pytest.skip(f"the Sailor artifact is not at {ARTIFACT}")
    return import_artifact(ARTIFACT, default_catalog())


def test_compute_profiles_keep_the_measured_numbers_under_catalog_names(
    imported: SailorImport,
) -> None:
    raw = json.loads((ARTIFACT / "profiles" / "OPT-350" / "GH-96" / "profile.json").read_text())
    profile = imported.profiles.compute_profile("OPT-350M", "GH200-96", 4, 8)
    assert profile is not None
    assert profile.forward_s[1] == raw["8"]["4"]["1"][0]
    assert profile.backward_s[25] == raw["8"]["4"]["25"][1]
    # the optimizer-step column is one layer's step on every layer: kept as measured
    assert profile.update_s == tuple(raw["8"]["4"][str(i)][2] for i in range(26))
    assert profile.provenance.source == "measured"
    assert profile.provenance.tool == "sailor-import"
    assert "OPT-350/GH-96/profile.json" in profile.provenance.note
    # every (tp, mbs) point of the file is there
    grid = {(int(tp), int(mbs)) for mbs, by_tp in raw.items() for tp in by_tp}
    assert set(imported.profiles.compute_grid("OPT-350M", "GH200-96")) == grid


def test_no_imported_optimizer_step_is_faster_than_memory_can_stream_it(
    imported: SailorImport,
) -> None:
    """Adam in fp32 reads weights, gradients and two moments and writes weights and
    moments: 28 bytes per parameter at the datasheet memory bandwidth is the least a
    whole-model step takes. Every imported profile that recorded a step must reach it."""
    catalog = default_catalog()
    checked = 0
    for profile in imported.profiles.compute:
        if not any(profile.update_s):
            continue  # A100-80's files record no step
        model, gpu = catalog.model(profile.model), catalog.gpu(profile.gpu_type)
        parameters = sum(
            model.layer_parameters(i, profile.tensor_parallel) for i in range(model.num_layers)
        )
        floor = parameters * 28 / gpu.memory_bandwidth_bytes_per_s
        assert sum(profile.update_s) >= floor, (profile.model, profile.gpu_type)
        checked += 1
    assert checked > 50


def test_profiles_whose_layer_count_disagrees_with_the_model_are_reported(
    imported: SailorImport,
) -> None:
    # the artifact's GPT-Neo-2.7/GH-96 file has 26 layers (an OPT-350 profile under the
    # wrong name); GPT-Neo-2.7B has 34, so it is skipped with a reason, not imported
    assert any("GPT-Neo-2.7/GH-96" in line and "34" in line for line in imported.skipped)
    assert imported.profiles.compute_profile("GPT-Neo-2.7B", "GH200-96", 1, 1) is None


def test_network_fits_become_link_classes(imported: SailorImport) -> None:
    het = json.loads((ARTIFACT / "network" / "multizone_bandwidths_het.json").read_text())
    profiles = imported.profiles
    same_zone = profiles.network_profile("intra-zone", "A100-40", "A100-40", 1)
    assert same_zone is not None
    coefficients, max_bps = het["us-central1-a"]["A100-40"]["1"]["us-central1-a"]["A100-40"]["1"]
    assert same_zone.curve.coefficients == tuple(coefficients)
    assert same_zone.curve.max_bytes_per_s == max_bps
    # us-central1-a -> us-west1-b is another region
    cross_region = profiles.network_profile("inter-region", "A100-40", "A100-40", 1)
    assert cross_region is not None
    assert cross_region.curve.bytes_per_second(64e6) < same_zone.curve.bytes_per_second(64e6)
    assert profiles.network_profile("inter-zone", "V100-16", "A100-40", 1) is not None
    intra = profiles.network_profile("intra-node", "GH200-96", "", 4)
    assert intra is not None and intra.gpus_per_node == 4


def test_plan_from_sailor_keeps_layers_replicas_and_batch_split() -> None:
    doc = {
        "pipeline_list": [
            {
                "num_stages": 2,
                "layers_per_stage": [list(range(12)), list(range(12, 26))],
                "tmp_per_stage": [
                    [[[["GH-96", 4, "us-central1-a"]], 4], [[["GH-96", 4, "us-central1-a"]], 4]],
                    [[[["GH-96", 4, "us-central1-a"]], 4], [[["GH-96", 4, "us-central1-b"]], 4]],
                ],
                "dp": [2, 2],
            }
        ],
        "mbs": 8,
        "gbs": 1024,
        "real": 2.5,
        "max_mem": 27_000_000_000,
    }
    converted = plan_from_sailor(doc, default_catalog().model("OPT-350"), default_catalog())
    plan = converted.plan
    assert [(s.layer_start, s.layer_end) for s in plan.stages] == [(0, 12), (12, 26)]
    assert plan.data_parallel == 2 and plan.stages[0].tensor_parallel == 4
    assert plan.num_micro_batches == 1024 // (8 * 2)
    assert plan.stages[1].replicas[1].zone == "us-central1-b"
    assert plan.stages[1].replicas[1].gpu_type == "GH200-96"
    # 4 TP groups of 4 GPUs on 4-GPU nodes: 3 nodes in zone a, 1 in zone b
    nodes = {p.zone: p.nodes for p in converted.cluster.pools}
    assert nodes == {"us-central1-a": 3, "us-central1-b": 1}
    assert converted.measured_iteration_seconds == 2.5


def test_plan_from_sailor_rejects_what_it_cannot_represent() -> None:
    with pytest.raises(SailorFormatError, match="not a Sailor plan"):
        plan_from_sailor({"mbs": 1}, default_catalog().model("OPT-350"), default_catalog())


def _pipeline(split: list[list[int]], gpu: str, zone: str) -> dict[str, object]:
    return {
        "num_stages": len(split),
        "layers_per_stage": split,
        "tmp_per_stage": [[[[[gpu, 1, zone]], 1]] for _ in split],
        "dp": [1] * len(split),
    }


def test_pipelines_with_the_same_boundaries_are_data_parallel_replicas_of_one_plan() -> None:
    split = [list(range(13)), list(range(13, 26))]
    doc = {
        "pipeline_list": [
            _pipeline(split, "Titan-RTX", "us-central1-a"),
            _pipeline(split, "RTX-3090", "us-central1-a"),
        ],
        "mbs": 2,
        "gbs": 16,
    }
    plan = plan_from_sailor(doc, default_catalog().model("OPT-350"), default_catalog()).plan
    assert plan.data_parallel == 2
    assert plan.num_micro_batches == 16 // (2 * 2)
    # replica r of every stage belongs to pipeline r
    assert [[r.gpu_type for r in s.replicas] for s in plan.stages] == [
        ["Titan-RTX", "RTX-3090"],
        ["Titan-RTX", "RTX-3090"],
    ]


def test_pipelines_with_different_boundaries_are_refused_naming_both_splits() -> None:
    doc = {
        "pipeline_list": [
            _pipeline([list(range(13)), list(range(13, 26))], "Titan-RTX", "us-central1-a"),
            _pipeline([list(range(10)), list(range(10, 26))], "RTX-3090", "us-central1-a"),
        ],
        "mbs": 1,
        "gbs": 4,
    }
    with pytest.raises(SailorFormatError, match=r"0-9, 10-25.*0-12, 13-25"):
        plan_from_sailor(doc, default_catalog().model("OPT-350"), default_catalog())
