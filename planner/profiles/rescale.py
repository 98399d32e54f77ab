"""Estimate a model's compute profile on a GPU from another model measured on that GPU.

A model nobody measured on GPU G (the artifact's GPT-Neo-2.7B on GH200, whose file is a
mislabelled copy) can borrow G's level from a model of the same family (architecture and
MLP) measured on G at the same TP degree and micro-batch size: the FLOP roofline says how
the two models' layers compare, the measurement how fast G really runs that kind of layer:

    t_model(layer) = roofline_model(layer) x sum(measured_ref, kind) / sum(roofline_ref, kind)

per layer kind (embedding, block, head) and direction (forward, backward, optimizer
update). With several references the median one by whole-model time decides (the
geometric mean of the two middle ones), as in transfer.py.

It assumes a GPU reaches the same share of the roofline on every model of the family,
which the artifact contradicts wherever it can be checked: on A100-40 and A100-80
GPT-Neo-2.7B reaches 2.3-2.6x the share OPT-350M does (larger matmuls run closer to
peak). The cross-GPU transfer (transfer.py) carries that model-size effect over from
another GPU, so complete_profiles uses this only where no qualified transfer reaches
(benchmarks/profile_transfer.py prints the leave-one-out table). Pure; called by
estimate.complete_profiles, which passes the roofline (estimate.py imports this module).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.transfer import Columns, kind_ratios, median_estimate
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance

RESCALE_TOOL = "sailplan-model-rescale"
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
