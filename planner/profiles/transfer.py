"""Estimate a model's compute profile on a GPU from its measurement on another GPU.

A model measured on GPU S but not on GPU G (a mislabelled file rejected by the Sailor
importer, a pool whose profiling Job has not run) can borrow G's speed from another model
measured on both: t_model(G, layer) = t_model(S, layer) x t_ref(G) / t_ref(S), the ratio
taken per layer kind (embedding, block, head, ...) and per direction (forward, backward,
optimizer update) at the same TP degree and micro-batch size. Every reference model and
source GPU that qualifies gives one estimate; their geometric mean is the answer, so no
single pair decides.

profiles.estimate.complete_profiles prefers this to the FLOP roofline because it predicts
the artifact's measured profiles better when each is left out
(benchmarks/profile_transfer.py prints the leave-one-out table). Called by
complete_profiles; pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance

TRANSFER_TOOL = "sailplan-gpu-transfer"
TRANSFER_VERSION = "1"

Direction = tuple[float, ...]
Columns = tuple[Direction, Direction, Direction]  # forward, backward, update


def _usable(profile: ComputeProfile | None, layers: int | None = None) -> bool:
    return (
        profile is not None
        and not profile.oom
        and profile.provenance.source == "measured"
        and (layers is None or len(profile.forward_s) == layers)
    )


def kind_ratios(
    numerator: Sequence[float], denominator: Sequence[float], kinds: Sequence[str]
) -> dict[str, float]:
    """numerator / denominator time summed per layer kind; 'all' over every layer (also
    rescale.py's measured / roofline levels)."""
    sums: dict[str, list[float]] = {}
    for n, d, kind in zip(numerator, denominator, kinds, strict=True):
        for key in (kind, "all"):
            entry = sums.setdefault(key, [0.0, 0.0])
            entry[0] += n
            entry[1] += d
    return {k: n / d for k, (n, d) in sums.items() if n > 0 and d > 0}


def median_estimate(
    estimates: Sequence[Columns], labels: Sequence[str]
) -> tuple[Columns, list[str]]:
    """The median estimate by whole-model forward + backward (geometric mean of the two
    middle ones, ties by label), and the labels of those two: one inconsistent reference (a
    profile taken under memory pressure, a partial measurement) cannot drag the answer, as
    it would a mean. Also rescale.py's."""
    ranked = sorted(
        range(len(estimates)),
        key=lambda i: (sum(estimates[i][0]) + sum(estimates[i][1]), labels[i]),
    )
    lower, upper = ranked[(len(ranked) - 1) // 2], ranked[len(ranked) // 2]

    def geometric_mean(index: int) -> Direction:
        columns = zip(estimates[lower][index], estimates[upper][index], strict=True)
        return tuple(math.sqrt(a * b) if a > 0 and b > 0 else (a + b) / 2 for a, b in columns)

    return (
        (geometric_mean(0), geometric_mean(1), geometric_mean(2)),
        sorted({labels[lower], labels[upper]}),
    )


def _reference_kinds(reference: ComputeProfile, models: dict[str, ModelSpec]) -> list[str]:
    spec = models.get(reference.model)
    layers = len(reference.forward_s)
    if spec is not None and spec.num_layers == layers:
        return [spec.layer_kind(i) for i in range(layers)]
    # a reference whose shape is unknown: first layer embedding, last head, blocks between
    return ["embedding"] + ["block"] * (layers - 2) + ["head"]


def transfer_profile(
    model: ModelSpec,
    gpu_type: str,
    tp: int,
    micro_batch_size: int,
    *,
    measured: ProfileSet,
    models: dict[str, ModelSpec],
) -> ComputeProfile | None:
    """`model` on `gpu_type` at (tp, micro-batch) from its measurements on other GPUs,
    scaled by the GPU ratio of every other model measured on both; None when no
    (source GPU, reference model) pair has all three measurements at this point."""
    kinds = [model.layer_kind(i) for i in range(model.num_layers)]
    estimates: list[Columns] = []
    sources: list[str] = []
    own = [
        p
        for p in measured.compute
        if p.model == model.name
        and p.gpu_type != gpu_type
        and p.tensor_parallel == tp
        and p.micro_batch_size == micro_batch_size
        and _usable(p, model.num_layers)
    ]
    for source in sorted(own, key=lambda p: p.gpu_type):
        for reference in sorted(measured.compute, key=lambda p: p.key):
            if (
                reference.model == model.name
                or reference.gpu_type != gpu_type
                or reference.tensor_parallel != tp
                or reference.micro_batch_size != micro_batch_size
                or not _usable(reference)
            ):
                continue
            ref_source = measured.compute_profile(
                reference.model, source.gpu_type, tp, micro_batch_size
            )
            if ref_source is None or not _usable(ref_source, len(reference.forward_s)):
                continue
            ref_kinds = _reference_kinds(reference, models)
            directions: list[Direction] = []
            for target_t, source_t, own_t in (
                (reference.forward_s, ref_source.forward_s, source.forward_s),
                (reference.backward_s, ref_source.backward_s, source.backward_s),
                (reference.update_s, ref_source.update_s, source.update_s),
            ):
                ratios = kind_ratios(target_t, source_t, ref_kinds)
                overall = ratios.get("all")
                if overall is None and directions:
                    # no optimizer step measured on one side (the artifact's A100-80 has 0):
                    # the step scales like the rest of the work
                    ratios = kind_ratios(
                        [
                            sum(x)
                            for x in zip(reference.forward_s, reference.backward_s, strict=True)
                        ],
                        [
                            sum(x)
                            for x in zip(ref_source.forward_s, ref_source.backward_s, strict=True)
                        ],
                        ref_kinds,
                    )
                    overall = ratios.get("all")
                if overall is None:
                    break
                directions.append(
                    tuple(
                        t * ratios.get(kind, overall) for t, kind in zip(own_t, kinds, strict=True)
                    )
                )
            if len(directions) == 3:
                estimates.append((directions[0], directions[1], directions[2]))
                sources.append(f"{source.gpu_type} x {reference.model}")
    if not estimates:
        return None

    (forward, backward, update), _ = median_estimate(estimates, sources)
    return ComputeProfile(
        model=model.name,
        gpu_type=gpu_type,
        tensor_parallel=tp,
        micro_batch_size=micro_batch_size,
        forward_s=forward,
        backward_s=backward,
        update_s=update,
        provenance=Provenance(
            source="estimated",
            tool=TRANSFER_TOOL,
            tool_version=TRANSFER_VERSION,
            gpu_name=gpu_type,
            note="measured on another GPU, scaled by the GPU ratio of: " + ", ".join(sources),
        ),
    )
