"""Repairs physically impossible points in measured compute profiles before planning.

A layer cannot take longer on fewer samples: at one GPU type and TP degree, forward and
backward time are non-decreasing in the micro-batch size. Single measurements break that
when a small, launch-bound micro-batch catches a clock ramp or a cold cache (the Sailor
artifact's GH200 OPT-350M profile at TP=4 has micro-batch 1 slower than micro-batch 2 by
23%, and the real runs at micro-batch 1 are faster than either). Left alone, such a point
makes the simulator and the search avoid a configuration for no reason.

`monotone_in_micro_batch` replaces each point by the smallest time measured at any larger
micro-batch when that is lower (a running minimum from the largest size down), per layer,
separately for forward and backward. Points that are consistent are untouched, and a
repaired profile says so in its provenance note. Called by the planner's profile
preparation (complete_profiles) and by the accuracy benchmark.
"""

from __future__ import annotations

from collections import defaultdict

from sailplan.planner.profiles.types import ComputeProfile, ProfileSet


def _running_min_from_top(series: list[tuple[float, ...]]) -> list[tuple[float, ...]]:
    out = list(series)
    for i in range(len(out) - 2, -1, -1):
        out[i] = tuple(min(x, y) for x, y in zip(out[i], out[i + 1], strict=True))
    return out


def monotone_in_micro_batch(profiles: ProfileSet) -> ProfileSet:
    """The same profiles with forward/backward made non-decreasing in micro-batch size."""
    groups: dict[tuple[str, str, int, str], list[ComputeProfile]] = defaultdict(list)
    untouched: list[ComputeProfile] = []
    for profile in profiles.compute:
        if profile.oom or not profile.forward_s:
            untouched.append(profile)
            continue
        groups[
            (
                profile.model,
                profile.gpu_type,
                profile.tensor_parallel,
                profile.provenance.source,
            )
        ].append(profile)
    repaired: list[ComputeProfile] = []
    for members in groups.values():
        members.sort(key=lambda p: p.micro_batch_size)
        lengths = {len(p.forward_s) for p in members}
        if len(lengths) != 1:
            repaired.extend(members)
            continue
        forward = _running_min_from_top([p.forward_s for p in members])
        backward = _running_min_from_top([p.backward_s for p in members])
        for profile, fwd, bwd in zip(members, forward, backward, strict=True):
            if fwd == profile.forward_s and bwd == profile.backward_s:
                repaired.append(profile)
                continue
            note = (profile.provenance.note + "; " if profile.provenance.note else "") + (
                "clamped to be non-decreasing in micro-batch size"
            )
            repaired.append(
                profile.model_copy(
                    update={
                        "forward_s": fwd,
                        "backward_s": bwd,
                        "provenance": profile.provenance.model_copy(update={"note": note}),
                    }
                )
            )
    return ProfileSet(
        compute=tuple(untouched + repaired), network=profiles.network, power=profiles.power
    )
