"""Estimate a model's compute profile on a GPU from another model measured on that GPU.

A model nobody measured on GPU G (the artifact's GPT-Neo-2.7B on GH200, whose file is a
mislabelled copy) can borrow G's level from a model of the same family (architecture and
MLP) measured on G at the same TP degree and micro-batch size: the FLOP roofline says how
the two models' layers compare, the measurement how fast G really runs that kind of layer:

    t_model(layer) = roofline_model(layer) x sum(measured_ref, kind) / sum(roofline_ref, kind)

per layer kind (embedding, block, head) and direction (forward, backward, optimizer
update). With several references the median one by whole-model time decides (the
geometric mean of the two middle ones), as in transfer.py.

This and the cross-GPU transfer (transfer.py: the same model on another GPU, scaled by a
reference model's GPU ratio) err differently: the transfer inherits the other GPU's
profile quirks, this the roofline's view of how layer sizes compare. complete_profiles
takes the geometric mean of the two where both reach (`combine`), which predicts the
artifact's hidden profiles better than either alone when each (model, GPU) is left out
(benchmarks/profile_transfer.py prints the table). Pure; called by
estimate.complete_profiles, which passes the roofline (estimate.py imports this module).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.transfer import Columns, kind_ratios, median_estimate
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance

RESCALE_TOOL = "sailplan-model-rescale"
COMBINED_TOOL = "sailplan-transfer-rescale"
TOOL_VERSION = "1"

# roofline(model, tp, micro_batch_size) on the GPU being estimated
Roofline = Callable[[ModelSpec, int, int], ComputeProfile]


def same_family(a: ModelSpec, b: ModelSpec) -> bool:
    """Layers the roofline compares fairly: same architecture and MLP kind."""
    return a.architecture == b.architecture and a.mlp == b.mlp


def rescale_profile(
    model: ModelSpec,
    gpu_type: str,
    tp: int,
    micro_batch_size: int,
    *,
    measured: ProfileSet,
    models: Mapping[str, ModelSpec],
    roofline: Roofline,
) -> ComputeProfile | None:
    """`model` on `gpu_type` at (tp, micro-batch) from other models of its family measured
    there, scaled per layer kind and direction by the roofline; None when none was."""
    kinds = [model.layer_kind(i) for i in range(model.num_layers)]
    target = roofline(model, tp, micro_batch_size)
    estimates: list[Columns] = []
    labels: list[str] = []
    for reference in sorted(measured.compute, key=lambda p: p.key):
        spec = models.get(reference.model)
        if (
            spec is None
            or reference.model == model.name
            or reference.gpu_type != gpu_type
            or reference.tensor_parallel != tp
            or reference.micro_batch_size != micro_batch_size
            or reference.oom
            or reference.provenance.source != "measured"
            or len(reference.forward_s) != spec.num_layers
            or not same_family(spec, model)
        ):
            continue
        ref_roof = roofline(spec, tp, micro_batch_size)
        ref_kinds = [spec.layer_kind(i) for i in range(spec.num_layers)]
        columns: list[tuple[float, ...]] = []
        for meas, ref_r, own_r in (
            (reference.forward_s, ref_roof.forward_s, target.forward_s),
            (reference.backward_s, ref_roof.backward_s, target.backward_s),
            (reference.update_s, ref_roof.update_s, target.update_s),
        ):
            levels = kind_ratios(meas, ref_r, ref_kinds)
            overall = levels.get("all")
            if overall is None:
                # nothing measured in this column (the artifact's A100-80 optimizer step
                # is 0): the roofline alone
                columns.append(tuple(own_r))
                continue
            columns.append(
                tuple(t * levels.get(kind, overall) for t, kind in zip(own_r, kinds, strict=True))
            )
        estimates.append((columns[0], columns[1], columns[2]))
        labels.append(reference.model)
    if not estimates:
        return None
    (forward, backward, update), used = median_estimate(estimates, labels)
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
            tool=RESCALE_TOOL,
            tool_version=TOOL_VERSION,
            gpu_name=gpu_type,
            note="roofline scaled by what this GPU measured for: " + ", ".join(used),
        ),
    )


def combine(moved: ComputeProfile, rescaled: ComputeProfile) -> ComputeProfile:
    """Geometric mean, layer by layer and column by column, of the cross-GPU transfer and
    the same-GPU rescale of one grid point."""

    def mean(a: Sequence[float], b: Sequence[float]) -> tuple[float, ...]:
        return tuple(
            math.sqrt(x * y) if x > 0 and y > 0 else max(x, y) for x, y in zip(a, b, strict=True)
        )

    return moved.model_copy(
        update={
            "forward_s": mean(moved.forward_s, rescaled.forward_s),
            "backward_s": mean(moved.backward_s, rescaled.backward_s),
            "update_s": mean(moved.update_s, rescaled.update_s),
            "provenance": Provenance(
                source="estimated",
                tool=COMBINED_TOOL,
                tool_version=TOOL_VERSION,
                gpu_name=moved.gpu_type,
                note=(
                    "geometric mean of the cross-GPU transfer ("
                    + moved.provenance.note
                    + ") and the same-GPU rescale ("
                    + rescaled.provenance.note
                    + ")"
                ),
            ),
        }
    )
