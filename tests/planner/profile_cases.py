"""Synthetic measured compute profiles for the planner's profile tests: one time per layer,
backward twice the forward, a 1 ms optimizer step, provenance `measured`."""

from __future__ import annotations

from sailplan.planner.profiles.types import ComputeProfile, Provenance

MEASURED = Provenance(source="measured", tool="test")


def profile(model: str, gpu: str, layers: list[float], tp: int = 1, mbs: int = 1) -> ComputeProfile:
    return ComputeProfile(
        model=model,
        gpu_type=gpu,
        tensor_parallel=tp,
        micro_batch_size=mbs,
        forward_s=tuple(layers),
        backward_s=tuple(2 * t for t in layers),
        update_s=tuple(0.001 for _ in layers),
        provenance=MEASURED,
    )
