"""Measured profiles are made non-decreasing in micro-batch size, and only where they are not."""

from __future__ import annotations

from sailplan.planner.profiles.cleaning import monotone_in_micro_batch
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance


def profile(mbs: int, fwd: float, bwd: float) -> ComputeProfile:
    return ComputeProfile(
        model="m",
        gpu_type="A100-40",
        tensor_parallel=1,
        micro_batch_size=mbs,
        forward_s=(fwd, fwd),
        backward_s=(bwd, bwd),
        update_s=(0.1, 0.1),
        provenance=Provenance(source="measured", tool="t"),
    )


def test_a_point_slower_than_a_larger_micro_batch_is_clamped() -> None:
    cleaned = monotone_in_micro_batch(
        ProfileSet(compute=(profile(1, 5.0, 1.0), profile(2, 3.0, 2.0), profile(4, 4.0, 4.0)))
    )
    by_mbs = {p.micro_batch_size: p for p in cleaned.compute}
    assert by_mbs[1].forward_s == (3.0, 3.0)  # 5 > 3 at mbs 2: impossible, clamped
    assert by_mbs[1].backward_s == (1.0, 1.0)  # consistent: untouched
    assert "clamped" in by_mbs[1].provenance.note
    assert by_mbs[2] == profile(2, 3.0, 2.0)  # consistent points are left as they are
    assert by_mbs[4] == profile(4, 4.0, 4.0)
