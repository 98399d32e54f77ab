"""FLOPs of each layer of a model, from its shape: what the roofline prices, what the
cross-GPU transfer matches workloads by, and what a head must at least have run.

Callers: profiles.estimate (the roofline), profiles.transfer (the reference micro-batch
whose per-layer work matches the estimated model's), profiles.head_projection (a head
faster than its projection at peak did not run it). Pure.
"""

from __future__ import annotations

from sailplan.planner.modelspec import ModelSpec


def _attention_flops(model: ModelSpec, b: int, queries: int, keys: int) -> float:
    """Q and the output projection over the queries, K and V over the keys, QK^T and
    attention-over-V (2 x 2 x b x queries x keys x h)."""
    h = model.hidden_size
    kv = model.kv_heads * model.head_dim
    projections = 2.0 * 2 * h * h * b * queries + 2.0 * 2 * h * kv * b * keys
    return projections + 4.0 * b * queries * keys * h


def _mlp_flops(model: ModelSpec, b: int, tokens: int) -> float:
    h, f = model.hidden_size, model.ffn_size
    up = 2 * h * f if model.mlp == "swiglu" else h * f
    return 2.0 * (up + f * h) * b * tokens


def _conv_flops(model: ModelSpec, layer: int, b: int) -> float:
    """2 x multiply-adds of the convolutions (batch norm, ReLU and pooling are
    element-wise and left out) or of the classifier."""
    kind = model.layer_kind(layer)
    if kind == "stem":
        side = -(-model.image_size // 2)
        return 2.0 * b * side**2 * model.stem_channels * model.image_channels * 49
    if kind == "head":
        return 2.0 * b * model.conv_blocks()[-1].out_channels * model.num_classes
    block = model.conv_block(layer)
    before, after = block.in_side**2, block.out_side**2
    macs = block.in_channels * block.width * before
    macs += 9 * block.width * block.width * after + block.width * block.out_channels * after
    if block.downsample:
        macs += block.in_channels * block.out_channels * after
    return 2.0 * b * macs


def layer_forward_flops(model: ModelSpec, layer: int, tp: int, micro_batch_size: int) -> float:
    """Forward FLOPs of one layer on one TP rank for one micro-batch."""
    b = micro_batch_size
    kind = model.layer_kind(layer)
    if model.architecture == "convnet":
        return _conv_flops(model, layer, b)
    s, t = model.sequence_length, model.target_length
    if kind == "embedding":
        return 0.0
    if kind == "head":
        projection = model.vocab_size * model.hidden_size / tp
        return 2.0 * projection * b * t
    if kind == "decoder-block":
        flops = _attention_flops(model, b, t, t) + _attention_flops(model, b, t, s)
        return (flops + _mlp_flops(model, b, t)) / tp
    return (_attention_flops(model, b, s, s) + _mlp_flops(model, b, s)) / tp


def block_forward_flops(model: ModelSpec, tp: int, micro_batch_size: int) -> float:
    """Forward FLOPs of one of the model's blocks (its first, the median kind of layer of a
    transformer) on one TP rank: the size of the kernels a micro-batch runs."""
    for layer in range(model.num_layers):
        if model.layer_kind(layer).endswith("block"):
            return layer_forward_flops(model, layer, tp, micro_batch_size)
    return max(
        layer_forward_flops(model, layer, tp, micro_batch_size) for layer in range(model.num_layers)
    )
