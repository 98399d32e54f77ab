"""Estimated compute profiles never split a layer better than perfectly across TP degrees.

time x TP (the per-GPU work) must be non-decreasing in TP degree for every estimated
profile against every other profile of its (model, GPU, micro-batch) group, measured
profiles stay as they were, and the OPT-30B estimate on A100-80 (nothing measured there;
before the repair its block was 2.4x faster at TP 4 than at TP 2) obeys it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.sailor import import_artifact
from sailplan.planner.profiles.tp_consistency import NOTE, consistent_in_tensor_parallel
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance, Source

ARTIFACT = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "sailor-artifact"
COLUMNS = ("forward_s", "backward_s", "update_s")


def point(tp: int, times: tuple[float, float], source: Source = "estimated") -> ComputeProfile:
    return ComputeProfile(
        model="m",
        gpu_type="A100-80",
        tensor_parallel=tp,
        micro_batch_size=2,
        forward_s=times,
        backward_s=tuple(2 * t for t in times),
        update_s=(0.0, 0.0),
        provenance=Provenance(source=source, tool="t"),
    )


def violations(profiles: ProfileSet) -> list[str]:
    """Every (estimated profile at t, profile at t' < t, layer, column) with
    time(t) x t < time(t') x t'."""
    groups: dict[tuple[str, str, int], dict[int, ComputeProfile]] = defaultdict(dict)
    for p in profiles.compute:
        winner = profiles.compute_profile(
            p.model, p.gpu_type, p.tensor_parallel, p.micro_batch_size
        )
        if winner is p and not p.oom:
            groups[(p.model, p.gpu_type, p.micro_batch_size)][p.tensor_parallel] = p
    found = []
    for key, by_tp in groups.items():
        for t, high in by_tp.items():
            if high.provenance.source != "estimated":
                continue
            for t_low, low in by_tp.items():
                if t_low >= t:
                    continue
                for name in COLUMNS:
                    for layer, (a, b) in enumerate(
                        zip(getattr(low, name), getattr(high, name), strict=True)
                    ):
                        if a > 0 and b > 0 and b * t < a * t_low * (1 - 1e-9):
                            found.append(f"{key} tp{t_low}->tp{t} layer {layer} {name}")
    return found


def test_a_tp_split_better_than_perfect_is_repaired_and_consistent_points_kept() -> None:
    profiles = ProfileSet(
        compute=(
            point(1, (2.0, 1.0)),
            point(2, (2.5, 0.6)),  # work 5.0 (up from 2: fine), 1.2
            point(4, (0.5, 0.3)),  # work 2.0 < 5.0: impossible; 1.2: fine
        )
    )
    repaired = consistent_in_tensor_parallel(profiles)
    assert violations(profiles)  # the input breaks the rule
    assert violations(repaired) == []
    by_tp = {p.tensor_parallel: p for p in repaired.compute}
    assert by_tp[1] == profiles.compute[0]  # consistent: untouched
    # layer 1 was consistent everywhere: the same floats
    assert [by_tp[t].forward_s[1] for t in (1, 2, 4)] == [1.0, 0.6, 0.3]
    # the violating pair meets at the geometric mean of its works, sqrt(5 x 2)
    assert by_tp[4].forward_s[0] * 4 == pytest.approx(10**0.5)
    assert by_tp[2].forward_s[0] * 2 == pytest.approx(10**0.5)
    assert NOTE in by_tp[4].provenance.note
    assert by_tp[4].update_s == (0.0, 0.0)  # zeros are left alone


def test_measured_points_are_untouched_and_bound_the_estimates() -> None:
    measured_low = point(2, (2.5, 0.6), source="measured")
    measured_high = point(8, (0.5, 0.2), source="measured")  # work 4.0, 1.6
    profiles = ProfileSet(
        compute=(measured_low, point(4, (0.5, 0.5)), measured_high)  # tp4 work 2.0, 2.0
    )
    repaired = consistent_in_tensor_parallel(profiles)
    by_tp = {p.tensor_parallel: p for p in repaired.compute}
    assert by_tp[2] is measured_low and by_tp[8] is measured_high
    # raised to the measured work below it (5.0), which wins over the one above (4.0)
    assert by_tp[4].forward_s[0] * 4 == pytest.approx(5.0)
    # layer 1: work 2.0 lies between 1.2 (below) and 1.6 (above)... capped by the one above
    assert by_tp[4].forward_s[1] * 4 == pytest.approx(1.6)
    assert violations(repaired) == []


def test_a_measured_profile_shadowing_an_estimate_is_what_counts() -> None:
    measured = point(4, (1.5, 0.3), source="measured")  # work 6.0
    shadowed = point(4, (0.1, 0.1))
    estimate = point(8, (0.5, 0.2))  # work 4.0 < 6.0
    repaired = consistent_in_tensor_parallel(ProfileSet(compute=(measured, shadowed, estimate)))
    by_key = {(p.tensor_parallel, p.provenance.source): p for p in repaired.compute}
    assert by_key[(4, "estimated")] is shadowed
    assert by_key[(8, "estimated")].forward_s[0] * 8 == pytest.approx(6.0)


@pytest.fixture(scope="module")
def artifact() -> ProfileSet:
    if not (ARTIFACT / "profiles").is_dir():
        pytest.skip(f"the Sailor artifact is not at {ARTIFACT}")
    return import_artifact(ARTIFACT, default_catalog()).profiles


@pytest.mark.parametrize(
    ("model", "gpus"),
    [
        ("OPT-30B", ("A100-80", "H100-80", "A100-40", "V100-16")),
        ("GPT-Neo-2.7B", ("GH200-96", "H100-80", "A100-40")),
        ("OPT-350M", ("A100-40", "V100-16", "L4")),
    ],
)
def test_every_estimated_profile_is_consistent_in_tp(
    artifact: ProfileSet, model: str, gpus: tuple[str, ...]
) -> None:
    catalog = default_catalog()
    spec = catalog.model(model)
    completed = complete_profiles(
        spec, gpus, [1, 2, 4, 8], [1, 2, 4, 8, 16], measured=artifact, catalog=catalog
    )
    estimated = [p for p in completed.compute if p.provenance.source == "estimated"]
    assert estimated
    assert violations(completed) == []
    # every measured profile comes back unchanged (after the micro-batch cleaning, which
    # complete_profiles applies to measurements first)
    kept = {p.key: p for p in completed.compute if p.provenance.source == "measured"}
    for p in artifact.compute:
        if p.model == model and p.gpu_type in gpus and not p.oom:
            assert kept[p.key].forward_s[1:-1] == p.forward_s[1:-1] or "clamped" in (
                kept[p.key].provenance.note
            )


def test_opt_30b_on_a100_80_no_longer_splits_better_than_perfectly(artifact: ProfileSet) -> None:
    catalog = default_catalog()
    model = catalog.model("OPT-30B")
    assert not artifact.compute_grid("OPT-30B", "A100-80")  # all estimated
    completed = complete_profiles(
        model, ["A100-80"], [1, 2, 4, 8], [1, 2, 4, 8, 16, 32], measured=artifact, catalog=catalog
    )
    block = 1
    for mbs in (1, 2, 4, 8, 16, 32):
        works = []
        for tp in (1, 2, 4, 8):
            p = completed.compute_profile("OPT-30B", "A100-80", tp, mbs)
            assert p is not None and p.provenance.source == "estimated"
            works.append((p.forward_s[block] + p.backward_s[block]) * tp)
        assert works == sorted(works), (mbs, works)
        # never faster than a perfect split of the TP-1 estimate
        assert all(w >= works[0] * (1 - 1e-9) for w in works)
