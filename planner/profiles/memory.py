"""Per-layer memory of a transformer derived from its shape: what the simulator needs to price memory.

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
default.

Called by the simulator's cost tables and the roofline estimator; the Sailor importer's
test compares these numbers with the artifact's llm_info.json.
"""

from __future__ import annotations

from sailplan.planner.modelspec import ModelSpec

ACTIVATION_BYTES = 2  # fp16/bf16 activations
MASK_BYTES = 1  # dropout masks
SOFTMAX_BYTES = 4  # the vocab-parallel cross-entropy keeps fp32 softmax of the logits


def block_activation_bytes(
    model: ModelSpec, tp: int, micro_batch_size: int = 1, flash_attention: bool = False
) -> float:
    """Bytes one transformer block keeps for backward on one TP rank for one micro-batch."""
    s, b, h = model.sequence_length, micro_batch_size, model.hidden_size
    sbh = s * b * h
    kv = model.kv_heads * model.head_dim
    f = model.ffn_size
    # Replicated on every TP rank: LayerNorm inputs (2 x 2sbh), QKV input (2sbh), MLP
    # input (2sbh), the two residual dropout masks (2 x sbh).
    replicated = 4 * sbh + 2 * sbh + 2 * sbh + 2 * MASK_BYTES * sbh
    # Split across TP: Q, K, V (2 bytes each), attention-over-V output = dense input (2sbh);
    # MLP: GeLU input and down-projection input (2sbf each), SwiGLU one more (gate, up, product).
    attention = ACTIVATION_BYTES * (s * b * (h + 2 * kv) + sbh)
    mlp_tensors = 3 if model.mlp == "swiglu" else 2
    mlp = ACTIVATION_BYTES * mlp_tensors * s * b * f
    scores = 0.0
    if not flash_attention:
        # softmax input is not kept, softmax output (2 bytes), dropout mask (1), dropout output (2)
        scores = 5 * model.num_heads * s * s * b
    return replicated + (attention + mlp + scores) / tp


def embedding_activation_bytes(model: ModelSpec, tp: int, micro_batch_size: int = 1) -> float:
    """The embedding keeps only its dropout mask (token ids are negligible)."""
    del tp  # the embedding output is all-reduced, so every rank holds the full mask
    return float(MASK_BYTES * model.sequence_length * micro_batch_size * model.hidden_size)


def head_activation_bytes(model: ModelSpec, tp: int, micro_batch_size: int = 1) -> float:
    """Final norm input and output plus the vocab-parallel logits and their fp32 softmax."""
    s, b, h = model.sequence_length, micro_batch_size, model.hidden_size
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
    return block_activation_bytes(model, tp, micro_batch_size, flash_attention)


def boundary_activation_bytes(model: ModelSpec, micro_batch_size: int) -> int:
    """Bytes of the hidden state one stage sends the next (and the gradient sent back)."""
    return ACTIVATION_BYTES * model.boundary_activation_elements(micro_batch_size)
