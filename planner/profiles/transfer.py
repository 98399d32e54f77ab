"""Estimate a model's compute profile on a GPU from its measurement on another GPU.

A model measured on GPU S but not on GPU G (a mislabelled file rejected by the Sailor
importer, a pool whose profiling Job has not run) can borrow G's speed from another model
measured on both: t_model(G, layer) = t_model(S, layer) x t_ref(G) / t_ref(S), the ratio
taken per layer kind (embedding, block, head, ...) and per direction (forward, backward,
optimizer update) at the same TP degree. Every reference model and source GPU that
qualifies gives one estimate; the median one decides (median_estimate), so no single pair
does.

The reference's ratio is taken at its micro-batch size whose per-block work is nearest the
model's (_matched_references): a GPU ratio depends on how large the kernels are (small
ones are launch-bound and run alike on both GPUs), and a GPT-Neo-2.7B block at
micro-batch 1 does the work of an OPT-350M block at about 5.

A pair qualifies only where the ratio can carry over from the reference to the model:

- S and G run the same kind of tensor-core math (GPUSpec.bf16: Ampere and later have bf16
  and TF32, Volta and Turing neither). An fp32 model runs its matmuls on TF32 tensor cores
  on one and on the CUDA cores on the other, or not, as its framework chose: the artifact's
  fp32 OPT-30B reaches 18 TFLOP/s on A100-40 (the CUDA-core rate) where GPT-Neo-2.7B
  reaches 66, so their V100 / A100 ratios are 0.71 and 0.20.
- The reference's speed ratio t_ref(S) / t_ref(G) lies within what the datasheets explain:
  between the smaller and the larger of 1, the GPUs' peak FLOP/s ratio and their memory
  bandwidth ratio (launch-, compute- and memory-bound work), widened by
  PLAUSIBLE_RATIO_MARGIN for measurement noise. A ratio beyond it means the two profiles
  did not run the same work (the artifact's OPT-30B is 10x faster on GH200 than on A100-40,
  whose peak ratio is 3.2): no model's ratio should be taken from it.

Leaving each of the artifact's (model, GPU) out, the qualified transfer predicts
GPT-Neo-2.7B on A100-40 and A100-80 and OPT-350M on A100-40 within 5.5-6.6% on average
where it reaches, and the GH200 profile of GPT-Neo-2.7B published in Sailor's repository
(which the artifact's mislabelled copy stands for) within 3.7%; OPT-350M on A100-80 is 23%
off, moved by GPT-Neo-2.7B's noisy micro-batch-1 points (benchmarks/profile_transfer.py;
docs/benchmarks.md). profiles.estimate.complete_profiles prefers it to the same-GPU rescale
and the roofline. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sailplan.planner.catalog import Catalog, CatalogError, GPUSpec
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.flops import block_forward_flops
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance

TRANSFER_TOOL = "sailplan-gpu-transfer"
TRANSFER_VERSION = "2"

# How far beyond the datasheet interval a reference's GPU speed ratio may lie and still be
# taken as the same work: repeated profiles of one point differ by up to ~25% at small
# micro-batches (the artifact's A100-80 / A100-40 ratios run 0.94-1.23 where the interval
# is [1, 1.31]), different math is 3x and more beyond it. The leave-one-out table is the
# same for any margin from 1.1 to 2 (benchmarks/profile_transfer.py --margin).
PLAUSIBLE_RATIO_MARGIN = 1.5

Direction = tuple[float, ...]
Columns = tuple[Direction, Direction, Direction]  # forward, backward, update


def _usable(profile: ComputeProfile | None, layers: int | None = None) -> bool:
    return (
        profile is not None
        and not profile.oom
        and profile.provenance.source == "measured"
        and (layers is None or len(profile.forward_s) == layers)
    )


def same_math(a: GPUSpec, b: GPUSpec) -> bool:
    """Whether fp32 and mixed-precision matmuls take the same kind of path on both GPUs:
    tensor cores with bf16 and TF32 (Ampere and later) or without (Volta, Turing)."""
    return a.bf16 == b.bf16


def plausible_speed_ratio(
    target: GPUSpec, source: GPUSpec, speedup: float, margin: float = PLAUSIBLE_RATIO_MARGIN
) -> bool:
    """Whether `speedup` = t(source) / t(target) of one workload is what the datasheets
    explain: within [min, max] of 1 (launch-bound), the peak FLOP/s ratio (compute-bound)
    and the memory bandwidth ratio (memory-bound), each bound widened by `margin`."""
    ratios = (
        1.0,
        target.peak_flops / source.peak_flops,
        target.memory_bandwidth_bytes_per_s / source.memory_bandwidth_bytes_per_s,
    )
    return min(ratios) / margin <= speedup <= max(ratios) * margin


def _total(profile: ComputeProfile) -> float:
    return sum(profile.forward_s) + sum(profile.backward_s)


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


def _reference_kinds(reference: ComputeProfile, models: Mapping[str, ModelSpec]) -> list[str]:
    spec = models.get(reference.model)
    layers = len(reference.forward_s)
    if spec is not None and spec.num_layers == layers:
        return [spec.layer_kind(i) for i in range(layers)]
    # a reference whose shape is unknown: first layer embedding, last head, blocks between
    return ["embedding"] + ["block"] * (layers - 2) + ["head"]


def _matched_references(
    model: ModelSpec,
    target: GPUSpec,
    source: GPUSpec,
    tp: int,
    micro_batch_size: int,
    *,
    measured: ProfileSet,
    models: Mapping[str, ModelSpec],
    margin: float,
) -> list[tuple[ComputeProfile, ComputeProfile]]:
    """Per reference model: its (target GPU, source GPU) profiles at TP `tp` and at the
    micro-batch size whose per-block work is nearest the estimated model's at
    `micro_batch_size` (log scale; ties: the larger), among the pairs measured on both
    GPUs with a plausible ratio. A GPU ratio depends on how large the kernels are (small
    ones are launch-bound and run alike on both GPUs), and GPT-Neo-2.7B's blocks do 6x the
    work of OPT-350M's at the same micro-batch size. A reference whose shape the catalog
    does not know is matched at the same micro-batch size."""
    work = block_forward_flops(model, tp, micro_batch_size)
    best: dict[str, tuple[tuple[float, int], ComputeProfile, ComputeProfile]] = {}
    for reference in sorted(measured.compute, key=lambda p: p.key):
        if (
            reference.model == model.name
            or reference.gpu_type != target.name
            or reference.tensor_parallel != tp
            or not _usable(reference)
        ):
            continue
        spec = models.get(reference.model)
        if spec is None and reference.micro_batch_size != micro_batch_size:
            continue
        ref_source = measured.compute_profile(
            reference.model, source.name, tp, reference.micro_batch_size
        )
        if ref_source is None or not _usable(ref_source, len(reference.forward_s)):
            continue
        if _total(reference) <= 0 or not plausible_speed_ratio(
            target, source, _total(ref_source) / _total(reference), margin
        ):
            continue
        ref_work = block_forward_flops(spec, tp, reference.micro_batch_size) if spec else work
        distance = (
            abs(math.log(ref_work / work)) if ref_work > 0 and work > 0 else 0.0,
            -reference.micro_batch_size,
        )
        if reference.model not in best or distance < best[reference.model][0]:
            best[reference.model] = (distance, reference, ref_source)
    return [(ref, src) for _, ref, src in (best[name] for name in sorted(best))]


def transfer_profile(
    model: ModelSpec,
    gpu_type: str,
    tp: int,
    micro_batch_size: int,
    *,
    measured: ProfileSet,
    models: Mapping[str, ModelSpec],
    catalog: Catalog,
    margin: float = PLAUSIBLE_RATIO_MARGIN,
) -> ComputeProfile | None:
    """`model` on `gpu_type` at (tp, micro-batch) from its measurements on other GPUs,
    scaled by the GPU ratio of every other model measured on both; None when no qualified
    (source GPU, reference model) pair (same math, plausible ratio: module docstring) has
    all three measurements at this point. GPU types the catalog does not know qualify
    nowhere."""
    try:
        target = catalog.gpu(gpu_type)
    except CatalogError:
        return None
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
        try:
            source_gpu = catalog.gpu(source.gpu_type)
        except CatalogError:
            continue
        if not same_math(target, source_gpu):
            continue
        for reference, ref_source in _matched_references(
            model,
            target,
            source_gpu,
            tp,
            micro_batch_size,
            measured=measured,
            models=models,
            margin=margin,
        ):
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
                at = (
                    f" mbs{reference.micro_batch_size}"
                    if reference.micro_batch_size != micro_batch_size
                    else ""
                )
                sources.append(f"{source.gpu_type} x {reference.model}{at}")
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
