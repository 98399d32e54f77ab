"""Makes estimated compute profiles physically consistent across tensor-parallel degrees.

Tensor parallelism splits a layer's work over the TP group: at best, TP t runs a layer in
t'/t of the time TP t' < t takes, and the all-reduces it adds only make it slower. So the
per-GPU work, time x TP, cannot fall as TP grows. Estimates made one grid point at a time
break that when neighbouring TP degrees come from different references or methods: the
OPT-30B estimate for A100-80 (nothing measured) took TP 1, 2 and 4 from the cross-GPU
transfer and rescale (each TP from whichever reference models the artifact measured at
that TP) and TP 8 from the roofline, and came out with a block 2.4x faster at TP 4 than at
TP 2 for micro-batch 2 and 8 (per-GPU work down 17%), and an optimizer step 9x faster at
TP 4 than at TP 2 for micro-batch 8. Such a point makes the planner prefer a TP degree for
no physical reason and loosens the search's optimistic bounds.

`consistent_in_tensor_parallel` repairs, per (model, GPU type, micro-batch size), layer and
column (forward, backward, optimizer update), the per-GPU work W(t) = time x t of the
estimated points so that it is non-decreasing in t: the least-squares fit of log W under
that order (pool-adjacent-violators, a geometric mean of each violating run, so neither
side of a disagreement is trusted over the other), then clipped to the measured points of
the same group, which stay untouched: an estimate is at least every measured W below it
(this wins where measurements themselves disagree) and at most every measured W above it.
Points already consistent are left as they are, and a repaired profile says so in its
provenance note. Zero times (the artifact's A100-80 optimizer step was not recorded) are
neither repaired nor used as constraints.

Only the lower bound is enforced. A TP degree slower than a lower one is physical: the
measured profiles have it wherever the all-reduces outweigh the split work (OPT-350M's
embedding and blocks on PCIe GPUs: RTX-3090 at TP 8 is up to 18x slower than at TP 1 plus
the modelled all-reduce), so an upper bound such as "no slower than TP 1" would contradict
measurements. Measured profiles show the lower bound within noise (time x TP falls by at
most 9% between TP degrees, one RTX-3090 point excepted, whose profile is erratic).

Called by estimate.complete_profiles after the estimates are made; pure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from sailplan.planner.profiles.types import ComputeProfile, ProfileSet

_COLUMNS = ("forward_s", "backward_s", "update_s")
NOTE = "per-GPU work made non-decreasing in TP degree"


def _isotonic(values: Sequence[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators, equal weights)."""
    blocks: list[tuple[float, int]] = []  # (mean, count)
    for value in values:
        blocks.append((value, 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (a, n), (b, m) = blocks[-2], blocks[-1]
            blocks[-2:] = [((a * n + b * m) / (n + m), n + m)]
    out: list[float] = []
    for mean, count in blocks:
        out.extend([mean] * count)
    return out


def _repair_column(
    tps: Sequence[int], times: Sequence[float], measured: Sequence[bool]
) -> list[float]:
    """One layer's column across TP degrees (ascending): the estimated times repaired."""
    out = list(times)
    free = [i for i, t in enumerate(times) if not measured[i] and t > 0]
    if not free:
        return out
    fitted = _isotonic([math.log(times[i] * tps[i]) for i in free])
    fixed = [(tps[i], times[i] * tps[i]) for i in range(len(tps)) if measured[i] and times[i] > 0]
    for i, log_work in zip(free, fitted, strict=True):
        work = math.exp(log_work)
        # at most every measured work above, at least every one below (this wins)
        work = min([work] + [w for t, w in fixed if t > tps[i]])
        work = max([work] + [w for t, w in fixed if t < tps[i]])
        repaired = work / tps[i]
        # keep a consistent point bit-for-bit (the log/exp round trip is not exact)
        if not math.isclose(repaired, times[i], rel_tol=1e-12):
            out[i] = repaired
    return out


def consistent_in_tensor_parallel(profiles: ProfileSet) -> ProfileSet:
    """`profiles` with every estimated compute profile's time x TP made non-decreasing in
    TP degree (see the module docstring); measured profiles are returned as they are."""
    groups: dict[tuple[str, str, int], list[ComputeProfile]] = defaultdict(list)
    for profile in profiles.compute:
        winner = profiles.compute_profile(
            profile.model, profile.gpu_type, profile.tensor_parallel, profile.micro_batch_size
        )
        if winner is profile and not profile.oom and profile.forward_s:
            groups[(profile.model, profile.gpu_type, profile.micro_batch_size)].append(profile)
    replaced: dict[int, ComputeProfile] = {}
    for members in groups.values():
        if all(p.provenance.source == "measured" for p in members):
            continue
        members.sort(key=lambda p: p.tensor_parallel)
        if len({len(p.forward_s) for p in members}) != 1:
            continue
        tps = [p.tensor_parallel for p in members]
        measured = [p.provenance.source == "measured" for p in members]
        columns: dict[str, list[list[float]]] = {}
        for name in _COLUMNS:
            series = [getattr(p, name) for p in members]
            if len({len(s) for s in series}) != 1:
                columns[name] = [list(s) for s in series]
                continue
            per_layer = [
                _repair_column(tps, [s[layer] for s in series], measured)
                for layer in range(len(series[0]))
            ]
            columns[name] = [[row[k] for row in per_layer] for k in range(len(members))]
        for k, profile in enumerate(members):
            if measured[k]:
                continue
            update = {name: tuple(columns[name][k]) for name in _COLUMNS}
            if all(update[name] == getattr(profile, name) for name in _COLUMNS):
                continue
            note = (profile.provenance.note + "; " if profile.provenance.note else "") + NOTE
            update_fields: dict[str, object] = dict(update)
            update_fields["provenance"] = profile.provenance.model_copy(update={"note": note})
            replaced[id(profile)] = profile.model_copy(update=update_fields)
    if not replaced:
        return profiles
    return ProfileSet(
        compute=tuple(replaced.get(id(p), p) for p in profiles.compute),
        network=profiles.network,
        power=profiles.power,
    )
