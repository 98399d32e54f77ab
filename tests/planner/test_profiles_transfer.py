"""A model measured on other GPUs is estimated from them by a reference model's GPU ratio,
only where that ratio can carry over (profiles/transfer.py), and complete_profiles trusts
that move before the same-GPU rescale (profiles/estimate.py).

Each expectation follows by hand from the synthetic profiles and the catalog's datasheet
figures (GH200 / A100-40: peak FLOP/s 989 / 312 = 3.17, memory bandwidth 4000 / 1555 =
2.57).
"""

from __future__ import annotations

import math

import pytest
from profile_cases import profile

from sailplan.planner.catalog import default_catalog
from sailplan.planner.profiles.estimate import complete_profiles, estimate_compute_profile
from sailplan.planner.profiles.flops import block_forward_flops
from sailplan.planner.profiles.transfer import (
    PLAUSIBLE_RATIO_MARGIN,
    plausible_speed_ratio,
    same_math,
    transfer_profile,
)
from sailplan.planner.profiles.types import ProfileSet

CATALOG = default_catalog()
OPT = CATALOG.model("OPT-350M")
OPT30 = CATALOG.model("OPT-30B")
NEO = CATALOG.model("GPT-Neo-2.7B")
MODELS = {m.name: m for m in (OPT, OPT30, NEO)}


def layers(
    model_layers: int, block: float, embedding: float = 0.01, head: float = 0.4
) -> list[float]:
    return [embedding] + [block] * (model_layers - 2) + [head]


def test_transfer_scales_each_layer_kind_by_the_reference_models_gpu_ratio() -> None:
    # the reference (OPT-350M) runs its blocks 2x and its head 4x faster on GH200 than on
    # A100; Neo measured on A100 only must get the same per-kind ratios on GH200
    measured = ProfileSet(
        compute=(
            profile(OPT.name, "A100-40", layers(OPT.num_layers, 0.1)),
            profile(OPT.name, "GH200-96", layers(OPT.num_layers, 0.05, head=0.1)),
            profile(NEO.name, "A100-40", layers(NEO.num_layers, 0.3, 0.02, 0.8)),
        )
    )
    moved = transfer_profile(
        NEO, "GH200-96", 1, 1, measured=measured, models=MODELS, catalog=CATALOG
    )
    assert moved is not None and moved.provenance.source == "estimated"
    assert moved.forward_s[1] == pytest.approx(0.15)
    assert moved.forward_s[-1] == pytest.approx(0.2)
    assert moved.forward_s[0] == pytest.approx(0.02)  # embedding: same speed on both
    assert "A100-40 x OPT-350M" in moved.provenance.note
    # no reference measured at this point (TP 2): nothing to transfer
    assert (
        transfer_profile(NEO, "GH200-96", 2, 1, measured=measured, models=MODELS, catalog=CATALOG)
        is None
    )


def test_the_datasheet_interval_bounds_a_plausible_ratio() -> None:
    gh200, a100 = CATALOG.gpu("GH200-96"), CATALOG.gpu("A100-40")
    peak = gh200.peak_flops / a100.peak_flops
    assert peak == pytest.approx(989 / 312)
    # compute-bound work runs at most the peak ratio faster, launch-bound work as fast
    assert plausible_speed_ratio(gh200, a100, 2.1)
    assert plausible_speed_ratio(gh200, a100, peak * PLAUSIBLE_RATIO_MARGIN * 0.99)
    assert not plausible_speed_ratio(gh200, a100, peak * PLAUSIBLE_RATIO_MARGIN * 1.01)
    assert not plausible_speed_ratio(gh200, a100, 10.0)  # the artifact's OPT-30B pair
    # and never much slower on the faster GPU
    assert not plausible_speed_ratio(gh200, a100, 0.99 / PLAUSIBLE_RATIO_MARGIN)
    # seen from the other side, the interval inverts
    assert plausible_speed_ratio(a100, gh200, 1 / 2.1)
    assert not plausible_speed_ratio(a100, gh200, 1 / 10.0)


def test_a_reference_whose_gpu_ratio_no_datasheet_explains_is_not_used() -> None:
    # OPT-350M: GH200 2x faster than A100 (plausible); OPT-30B: 10x (no datasheet explains
    # it: one of its two profiles ran other math). Neo moves by the 2x alone.
    blocks30 = OPT30.num_layers
    measured = ProfileSet(
        compute=(
            profile(OPT.name, "A100-40", layers(OPT.num_layers, 0.1)),
            profile(OPT.name, "GH200-96", layers(OPT.num_layers, 0.05, 0.005, 0.2)),
            profile(OPT30.name, "A100-40", layers(blocks30, 1.0)),
            profile(OPT30.name, "GH200-96", layers(blocks30, 0.1, 0.001, 0.04)),
            profile(NEO.name, "A100-40", layers(NEO.num_layers, 0.3, 0.02, 0.8)),
        )
    )
    moved = transfer_profile(
        NEO, "GH200-96", 1, 1, measured=measured, models=MODELS, catalog=CATALOG
    )
    assert moved is not None
    assert moved.forward_s[1] == pytest.approx(0.15)
    assert "OPT-30B" not in moved.provenance.note
    # a wider margin lets it in, and the median of the two estimates moves
    loose = transfer_profile(
        NEO, "GH200-96", 1, 1, measured=measured, models=MODELS, catalog=CATALOG, margin=4.0
    )
    assert loose is not None and "OPT-30B" in loose.provenance.note
    assert loose.forward_s[1] < 0.15


def test_a_source_gpu_with_other_tensor_core_math_is_not_used() -> None:
    v100, a100, gh200 = (CATALOG.gpu(g) for g in ("V100-16", "A100-40", "GH200-96"))
    assert same_math(a100, gh200) and not same_math(v100, gh200)
    # Neo measured on V100 only: its fp32 matmuls there run on CUDA cores, on GH200 on
    # TF32 tensor cores or not; no ratio carries that over
    measured = ProfileSet(
        compute=(
            profile(OPT.name, "V100-16", layers(OPT.num_layers, 0.3)),
            profile(OPT.name, "GH200-96", layers(OPT.num_layers, 0.05)),
            profile(NEO.name, "V100-16", layers(NEO.num_layers, 0.9)),
        )
    )
    assert (
        transfer_profile(NEO, "GH200-96", 1, 1, measured=measured, models=MODELS, catalog=CATALOG)
        is None
    )
    # complete_profiles then rescales GH200's own OPT-350M level instead
    done = complete_profiles(NEO, ["GH200-96"], [1], [1], measured=measured, catalog=CATALOG)
    found = done.compute_profile(NEO.name, "GH200-96", 1, 1)
    assert found is not None and found.provenance.tool == "sailplan-model-rescale"


def test_complete_profiles_moves_the_model_before_rescaling_the_gpus_level() -> None:
    measured = ProfileSet(
        compute=(
            profile(OPT.name, "A100-40", layers(OPT.num_layers, 0.1)),
            profile(OPT.name, "GH200-96", [t / 2 for t in layers(OPT.num_layers, 0.1)]),
            profile(NEO.name, "A100-40", layers(NEO.num_layers, 0.3, 0.02, 0.8)),
        )
    )
    done = complete_profiles(NEO, ["GH200-96"], [1], [1, 4], measured=measured, catalog=CATALOG)
    found = done.compute_profile(NEO.name, "GH200-96", 1, 1)
    assert found is not None and found.provenance.tool == "sailplan-gpu-transfer"
    assert found.forward_s[1] == pytest.approx(0.15)  # Neo's A100 block at OPT's GH200 ratio
    # micro-batch 4 was measured nowhere: the roofline's mbs 4 / mbs 1 ratio on GH200,
    # layer by layer, applied to the move at mbs 1
    gh200 = CATALOG.gpu("GH200-96")
    at_4 = done.compute_profile(NEO.name, "GH200-96", 1, 4)
    assert at_4 is not None and "scaled from estimated" in at_4.provenance.note
    roof_1 = estimate_compute_profile(NEO, gh200, 1, 1)
    roof_4 = estimate_compute_profile(NEO, gh200, 1, 4)
    for layer in (0, 1, NEO.num_layers - 1):
        ratio = roof_4.backward_s[layer] / roof_1.backward_s[layer]
        assert at_4.backward_s[layer] == pytest.approx(found.backward_s[layer] * ratio)
    # no reference at TP 2 and nothing of Neo at TP 2 anywhere: the move at TP 1 anchors it
    at_tp2 = complete_profiles(NEO, ["GH200-96"], [2], [1], measured=measured, catalog=CATALOG)
    anchored = at_tp2.compute_profile(NEO.name, "GH200-96", 2, 1)
    assert anchored is not None and "tp1/mbs1" in anchored.provenance.note


def test_the_reference_ratio_is_taken_where_its_blocks_do_the_same_work() -> None:
    # OPT-350M is launch-bound at micro-batch 1 (same speed on both GPUs) and faster on
    # GH200 the larger its micro-batch. A GPT-Neo-2.7B block at micro-batch 1 does the work
    # of an OPT-350M block at micro-batch ~5.3, so its ratio comes from mbs 4, not mbs 1.
    neo_work = block_forward_flops(NEO, 1, 1)
    opt_4, opt_8 = block_forward_flops(OPT, 1, 4), block_forward_flops(OPT, 1, 8)
    assert opt_4 < neo_work < opt_8
    assert abs(math.log(opt_4 / neo_work)) < abs(math.log(opt_8 / neo_work))
    profiles = [profile(NEO.name, "A100-40", layers(NEO.num_layers, 0.3, 0.02, 0.8))]
    for mbs, gh_speedup in ((1, 1.0), (4, 1.5), (8, 2.0)):
        a100 = layers(OPT.num_layers, 0.01 * mbs)
        profiles.append(profile(OPT.name, "A100-40", a100, mbs=mbs))
        profiles.append(profile(OPT.name, "GH200-96", [t / gh_speedup for t in a100], mbs=mbs))
    measured = ProfileSet(compute=tuple(profiles))
    moved = transfer_profile(
        NEO, "GH200-96", 1, 1, measured=measured, models=MODELS, catalog=CATALOG
    )
    assert moved is not None
    assert moved.forward_s[1] == pytest.approx(0.3 / 1.5)
    assert "A100-40 x OPT-350M mbs4" in moved.provenance.note
