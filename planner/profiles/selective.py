"""Selective activation recomputation per layer: the bytes it frees and the forward it repeats.

Megatron-LM's selective recomputation (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", Sec. 5) recomputes only a block's attention core
(QK^T, softmax, softmax dropout, attention over V) in the backward; the linear layers keep
their activations. Per layer with tensor parallelism t and no sequence parallelism the paper
counts sbh(10 + 24/t + 5as/(ht)) bytes kept for backward (Sec. 4.2.1, eq. 2); selective
recomputation drops the 5as/(ht) term, leaving sbh(10 + 24/t) (Table 2, "selective
activation recomputation" row). profiles/memory.py builds that same expression term by term
(grouped-query attention, other MLP widths, cross-attention), where the dropped term is what
its flash_attention switch leaves out, so the bytes freed per layer are the difference of
its two answers: zero for layers without attention (embedding, head, a convnet's) and
whenever flash attention already does not store the scores.

Time: the backward runs the attention core's forward again. Its share of a layer's forward
is taken from FLOPs: 2 x 2 x b x queries x keys x h for QK^T and attention over V (per
attention sub-layer, split over TP) against the layer's forward FLOPs
(profiles/flops.layer_forward_flops, the roofline's count), applied to the layer's
measured or estimated forward seconds. Assumption: the layer's forward time divides among
its parts in proportion to their FLOPs; softmax, masking and dropout are element-wise and
count zero FLOPs, so where they are memory-bound the repeated time is underestimated.

Called by simulator/costs.py (StageTable's selective columns) and the search through it.
"""

from __future__ import annotations

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.flops import layer_forward_flops
from sailplan.planner.profiles.memory import layer_activation_bytes


def attention_core_bytes(model: ModelSpec, layer: int, tp: int, micro_batch_size: int) -> float:
    """Bytes one layer's attention core keeps for backward on one TP rank for one
    micro-batch (Korthikanti's 5as^2b/t per attention sub-layer): what selective
    recomputation frees, and what the backward holds again while it recomputes the layer."""
    stored = layer_activation_bytes(model, layer, tp, micro_batch_size, flash_attention=False)
    flash = layer_activation_bytes(model, layer, tp, micro_batch_size, flash_attention=True)
    return stored - flash


def attention_core_flops(model: ModelSpec, layer: int, tp: int, micro_batch_size: int) -> float:
    """Forward FLOPs of one layer's attention core on one TP rank: QK^T and attention over
    V, 2 x 2 x b x queries x keys x h per attention sub-layer, split over TP."""
    if not model.is_transformer:
        return 0.0
    kind = model.layer_kind(layer)
    b, h = micro_batch_size, model.hidden_size
    s, t = model.sequence_length, model.target_length
    if kind == "decoder-block":
        # self-attention over the targets, cross-attention from them to the encoder output
        return 4.0 * b * h * (t * t + t * s) / tp
    if kind == "block":
        return 4.0 * b * h * s * s / tp
    return 0.0


def attention_core_share(model: ModelSpec, layer: int, tp: int, micro_batch_size: int) -> float:
    """The attention core's share of the layer's forward FLOPs (0 without attention)."""
    core = attention_core_flops(model, layer, tp, micro_batch_size)
    if core <= 0.0:
        return 0.0
    return core / layer_forward_flops(model, layer, tp, micro_batch_size)
