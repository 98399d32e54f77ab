"""Per-layer memory of a model derived from its shape: what the simulator needs to price memory.

Parameters per TP rank come from ModelSpec. Activations follow Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", Sec. 4.1): with 16-bit
activations, 1-byte dropout masks, tensor parallelism without sequence parallelism and no
recomputation, one transformer block keeps

    s*b*h * (10 + 24/t) + 5*a*s^2*b/t   bytes

for backward (s sequence, b micro-batch, h hidden, a heads, t TP degree). The expression is
rebuilt term by term below so that grouped-query attention, a non-4h MLP width and SwiGLU
change the right terms; for the GPT shape it reduces exactly to the paper's formula (a test
checks that). With flash attention the 5as^2b term (scores, softmax, its dropout) is not
stored; Megatron-DeepSpeed as profiled by the Sailor artifact does store it, so it is the
default. An encoder-decoder's decoder block adds a cross-attention sub-layer whose K and V
come from the encoder output (sequence s) and whose queries are the targets (length t):
scores 5*a*t*s*b/t_p. A convnet's layers keep what autograd saves for convolutions, batch
norms and ReLUs (below), an estimate no measurement has checked yet.

Called by the simulator's cost tables and the roofline estimator; the Sailor importer's
test compares these numbers with the artifact's llm_info.json.
"""

from __future__ import annotations

from sailplan.planner.modelspec import ModelSpec

ACTIVATION_BYTES = 2  # fp16/bf16 activations
MASK_BYTES = 1  # dropout masks
SOFTMAX_BYTES = 4  # the vocab-parallel cross-entropy keeps fp32 softmax of the logits


def _attention_activation_bytes(
    model: ModelSpec, tp: int, b: int, queries: int, keys: int, *, flash_attention: bool
) -> float:
    """One attention sub-layer over `queries` tokens attending to `keys` tokens (self- or
    cross-attention): its norm input and output (the Q/K/V input), residual dropout mask
    replicated; Q, K, V, the attention-over-V output and the scores split across TP."""
    h = model.hidden_size
    kv = model.kv_heads * model.head_dim
    replicated = 2 * ACTIVATION_BYTES * queries * b * h + MASK_BYTES * queries * b * h
    split = ACTIVATION_BYTES * (queries * b * h + 2 * keys * b * kv + queries * b * h)
    if not flash_attention:
        # softmax input is not kept, softmax output (2 bytes), dropout mask (1), dropout output (2)
        split += 5 * model.num_heads * queries * keys * b
    return replicated + split / tp


def _mlp_activation_bytes(model: ModelSpec, tp: int, b: int, tokens: int) -> float:
    """The MLP sub-layer: norm input and MLP input plus the residual mask replicated; the
    activation input and the down-projection input split (SwiGLU one more: gate, up, product)."""
    replicated = 2 * ACTIVATION_BYTES * tokens * b * model.hidden_size
    replicated += MASK_BYTES * tokens * b * model.hidden_size
    mlp_tensors = 3 if model.mlp == "swiglu" else 2
    return replicated + ACTIVATION_BYTES * mlp_tensors * tokens * b * model.ffn_size / tp


def block_activation_bytes(
    model: ModelSpec,
    tp: int,
    micro_batch_size: int = 1,
    flash_attention: bool = False,
    decoder_block: bool = False,
) -> float:
    """Bytes one transformer block keeps for backward on one TP rank for one micro-batch.

    A decoder-only or encoder block: self-attention and MLP over the sequence. An
    encoder-decoder's decoder block (`decoder_block`): self-attention over the targets,
    cross-attention from the targets to the encoder output, MLP over the targets.
    """
    b, s = micro_batch_size, model.sequence_length
    if not decoder_block:
        return _attention_activation_bytes(
            model, tp, b, s, s, flash_attention=flash_attention
        ) + _mlp_activation_bytes(model, tp, b, s)
    t = model.target_length
    return (
        _attention_activation_bytes(model, tp, b, t, t, flash_attention=flash_attention)
        + _attention_activation_bytes(model, tp, b, t, s, flash_attention=flash_attention)
        + _mlp_activation_bytes(model, tp, b, t)
    )


def embedding_activation_bytes(model: ModelSpec, tp: int, micro_batch_size: int = 1) -> float:
    """The embedding keeps only its dropout mask (token ids are negligible)."""
    del tp  # the embedding output is all-reduced, so every rank holds the full mask
    return float(MASK_BYTES * model.sequence_length * micro_batch_size * model.hidden_size)


def head_activation_bytes(model: ModelSpec, tp: int, micro_batch_size: int = 1) -> float:
    """Final norm input and output plus the vocab-parallel logits and their fp32 softmax
    (over the targets: an encoder-decoder's decoder length)."""
    if model.architecture == "convnet":
        return convnet_head_activation_bytes(model, micro_batch_size)
    s, b, h = model.target_length, micro_batch_size, model.hidden_size
    norm = 2 * ACTIVATION_BYTES * s * b * h
    logits = (ACTIVATION_BYTES + SOFTMAX_BYTES) * s * b * model.vocab_size / tp
    if model.architecture == "encoder":
        # BERT-style pooler/MLM head: the MLM transform keeps one more hidden-size tensor.
        norm += ACTIVATION_BYTES * s * b * h
    return norm + logits


def layer_activation_bytes(
    model: ModelSpec,
    layer: int,
    tp: int,
    micro_batch_size: int = 1,
    flash_attention: bool = False,
) -> float:
    kind = model.layer_kind(layer)
    if kind == "embedding":
        return embedding_activation_bytes(model, tp, micro_batch_size)
    if kind == "head":
        return head_activation_bytes(model, tp, micro_batch_size)
    if kind == "stem":
        return stem_activation_bytes(model, micro_batch_size)
    if kind == "conv-block":
        return conv_block_activation_bytes(model, layer, micro_batch_size)
    return block_activation_bytes(
        model, tp, micro_batch_size, flash_attention, decoder_block=kind == "decoder-block"
    )


def boundary_activation_bytes(model: ModelSpec, micro_batch_size: int, layer: int) -> int:
    """Bytes one stage sends the next at the boundary before `layer` (and the gradient
    sent back): the hidden state, plus the encoder output inside an encoder-decoder's
    decoder; a convnet's feature map."""
    return ACTIVATION_BYTES * model.boundary_activation_elements(micro_batch_size, layer)


# -- convnets ---------------------------------------------------------------------------
# What autograd keeps for a convolution, batch norm and ReLU chain with 16-bit activations:
# each convolution its input, each batch norm its input, each ReLU its output (the next
# convolution's input, counted once); the max-pool its int64 argmax indices. A block's
# output is the next layer's input and is counted there.
POOL_INDEX_BYTES = 8


def stem_activation_bytes(model: ModelSpec, micro_batch_size: int = 1) -> float:
    b, c = micro_batch_size, model.stem_channels
    conv_side = -(-model.image_size // 2)
    image = model.image_channels * model.image_size**2
    pooled = c * model.stem_side() ** 2
    return b * (ACTIVATION_BYTES * (image + 2 * c * conv_side**2) + POOL_INDEX_BYTES * pooled)


def conv_block_activation_bytes(model: ModelSpec, layer: int, micro_batch_size: int = 1) -> float:
    block = model.conv_block(layer)
    before, after = block.in_side**2, block.out_side**2
    elements = block.in_channels * before  # the block input (conv1 and the projection)
    elements += 2 * block.width * before  # bn1 input, relu1 output
    elements += 2 * block.width * after  # bn2 input, relu2 output
    elements += block.out_channels * after * (2 if block.downsample else 1)  # bn3 (+ projection bn)
    return float(ACTIVATION_BYTES * micro_batch_size * elements)


def convnet_head_activation_bytes(model: ModelSpec, micro_batch_size: int = 1) -> float:
    """The last block's ReLU output, the pooled features, the logits and their fp32 softmax."""
    last = model.conv_blocks()[-1]
    features = last.out_channels * (last.out_side**2 + 1)
    logits = (ACTIVATION_BYTES + SOFTMAX_BYTES) * model.num_classes
    return float(micro_batch_size * (ACTIVATION_BYTES * features + logits))
