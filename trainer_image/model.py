"""The decoder-only transformer, built layer by layer from a ModelSpec.

The trainer builds exactly the layers of its stage (`[layer_start, layer_end)` in the
planner's numbering: 0 = embedding, 1..num_blocks = blocks, last = head), each split over the
stage's TP group. One code path covers the catalog's decoder families: learned positions or
rotary, LayerNorm or RMSNorm, GELU MLP or SwiGLU, grouped-query attention, biases except for
the LLaMA family (the same rule ModelSpec.block_parameters counts with).

Initialisation is a pure function of (seed, logical layer, parameter name): each rank draws
the full logical tensor and keeps its shard, so every plan starts from the same model and
the single-process run is a valid reference. `param_splits` tells the checkpoint code how each
local parameter maps onto its logical tensor. Called by the engine and by the profilers.
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn

from sailplan.planner.modelspec import ModelSpec
from sailplan.trainer.tp import (
    SINGLE,
    ColumnParallelLinear,
    RowParallelLinear,
    Split,
    TPGroup,
    VocabParallelEmbedding,
    copy_to_tp,
    shard_range,
    vocab_parallel_cross_entropy,
)

INIT_STD = 0.02


def _uses_bias(spec: ModelSpec) -> bool:
    # Mirrors ModelSpec.block_parameters; tests/trainer/test_trainer_model.py checks the two agree.
    return spec.family != "llama"


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden_size, eps=1e-5)
    return nn.LayerNorm(spec.hidden_size, eps=1e-5)


def _rotary_tables(spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    half = spec.head_dim // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(spec.sequence_length, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [batch, heads, seq, head_dim]; rotate the two halves of each head (GPT-NeoX layout).
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    seq = x.shape[-2]
    c, s = cos[:seq].to(x.dtype), sin[:seq].to(x.dtype)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class Attention(nn.Module):
    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, spec: ModelSpec, tp: TPGroup) -> None:
        super().__init__()
        bias = _uses_bias(spec)
        h, d = spec.hidden_size, spec.head_dim
        self.tp = tp
        self.heads = spec.num_heads // tp.size
        self.kv_heads = spec.kv_heads // tp.size
        self.head_dim = d
        self.q_proj = ColumnParallelLinear(h, spec.num_heads * d, bias, tp)
        self.k_proj = ColumnParallelLinear(h, spec.kv_heads * d, bias, tp)
        self.v_proj = ColumnParallelLinear(h, spec.kv_heads * d, bias, tp)
        self.o_proj = RowParallelLinear(spec.num_heads * d, h, bias, tp)
        self.rotary = spec.position_embedding == "rotary"
        if self.rotary:
            cos, sin = _rotary_tables(spec)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        x = copy_to_tp(x, self.tp)
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary:
            q = _apply_rotary(q, self.cos, self.sin)
            k = _apply_rotary(k, self.cos, self.sin)
        if self.kv_heads != self.heads:
            group = self.heads // self.kv_heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)
        out: torch.Tensor = self.o_proj(y)
        return out


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TPGroup) -> None:
        super().__init__()
        bias = _uses_bias(spec)
        h, f = spec.hidden_size, spec.ffn_size
        self.tp = tp
        self.swiglu = spec.mlp == "swiglu"
        self.up_proj = ColumnParallelLinear(h, f, bias, tp)
        self.gate_proj = ColumnParallelLinear(h, f, bias, tp) if self.swiglu else None
        self.down_proj = RowParallelLinear(f, h, bias, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(x, self.tp)
        if self.gate_proj is not None:
            hidden = nn.functional.silu(self.gate_proj(x)) * self.up_proj(x)
        else:
            hidden = nn.functional.gelu(self.up_proj(x))
        out: torch.Tensor = self.down_proj(hidden)
        return out


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, spec: ModelSpec, tp: TPGroup) -> None:
        super().__init__()
        self.attn_norm = _norm(spec)
        self.attn = Attention(spec, tp)
        self.mlp_norm = _norm(spec)
        self.mlp = MLP(spec, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        out: torch.Tensor = x + self.mlp(self.mlp_norm(x))
        return out


class Embedding(nn.Module):
    """Token embedding (vocabulary-parallel) plus learned positions (replicated)."""

    def __init__(self, spec: ModelSpec, tp: TPGroup) -> None:
        super().__init__()
        self.tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, tp)
        self.positions = (
            nn.Embedding(spec.sequence_length, spec.hidden_size)
            if spec.position_embedding == "learned"
            else None
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.tokens(tokens)
        if self.positions is not None:
            x = x + self.positions.weight[: tokens.shape[1]]
        return x


class Head(nn.Module):
    """Final norm and vocabulary-parallel LM head; returns the mean token cross-entropy.

    A tied head multiplies by the token embedding (`tied`), which is not registered here: on
    the embedding's own stage it is layer 0's parameter, on a later stage the StageModel's
    copy. Either way the head's own parameters are what ModelSpec.head_parameters counts.
    """

    def __init__(
        self, spec: ModelSpec, tp: TPGroup, tied: VocabParallelEmbedding | None = None
    ) -> None:
        super().__init__()
        self.tp = tp
        self.norm = _norm(spec)
        self.projection = (
            None
            if spec.tied_embeddings
            else ColumnParallelLinear(spec.hidden_size, spec.vocab_size, False, tp)
        )
        self._tied = [tied] if tied is not None else []
        self.vocab_start = shard_range(spec.vocab_size, tp)[0]

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(self.norm(x), self.tp)
        if self.projection is not None:
            logits = self.projection(x)
        else:
            logits = nn.functional.linear(x, self._tied[0].weight)
        return vocab_parallel_cross_entropy(logits, targets, self.vocab_start, self.tp)


def build_layer(
    spec: ModelSpec, index: int, tp: TPGroup = SINGLE, tied: VocabParallelEmbedding | None = None
) -> nn.Module:
    kind = spec.layer_kind(index)
    if kind == "embedding":
        return Embedding(spec, tp)
    if kind == "head":
        return Head(spec, tp, tied)
    if spec.architecture != "decoder":
        raise ValueError(f"{spec.name}: only decoder-only models are trained by sailplan-train")
    return Block(spec, tp)


def param_splits(module: nn.Module) -> dict[str, Split | None]:
    """Parameter name -> how it is split across the TP group (None: replicated)."""
    splits: dict[str, Split | None] = {}
    for module_name, sub in module.named_modules():
        declared: dict[str, Split] = getattr(sub, "splits", {})
        for param_name, _ in sub.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            splits[full] = declared.get(param_name)
    return splits


def logical_shape(local: torch.Size, split: Split | None) -> tuple[int, ...]:
    shape = list(local)
    if split is not None:
        shape[split.dim] = split.full
    return tuple(shape)


def local_shard(full: torch.Tensor, split: Split | None, tp: TPGroup) -> torch.Tensor:
    if split is None or tp.size == 1:
        return full
    start, end = shard_range(split.full, tp)
    return full.narrow(split.dim, start, end - start)


def _init_value(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    leaf = name.rsplit(".", 1)[-1]
    owner = name.rsplit(".", 1)[0] if "." in name else ""
    if owner.endswith("norm"):
        return torch.ones(shape) if leaf == "weight" else torch.zeros(shape)
    if leaf == "bias":
        return torch.zeros(shape)
    std = INIT_STD
    if owner.endswith(("o_proj", "down_proj")):
        std = INIT_STD / math.sqrt(2.0)  # residual projections, scaled as in GPT-2
    return torch.randn(shape, generator=generator) * std


def initialise_parameter(
    param: torch.nn.Parameter, *, index: int, name: str, split: Split | None, seed: int, tp: TPGroup
) -> None:
    """Fill a shard from the logical tensor determined by (seed, layer index, name)."""
    generator = torch.Generator().manual_seed(
        (seed * 1_000_003 + index * 7919 + zlib.crc32(name.encode())) % 2**63
    )
    full = _init_value(name, logical_shape(param.shape, split), generator)
    with torch.no_grad():
        param.copy_(local_shard(full, split, tp))


def initialise_layer(layer: nn.Module, index: int, seed: int, tp: TPGroup) -> None:
    splits = param_splits(layer)
    for name, param in layer.named_parameters():
        initialise_parameter(param, index=index, name=name, split=splits[name], seed=seed, tp=tp)


TIED_KEY = "tokens.weight"  # layer 0's parameter that a tied head multiplies by


class StageModel(nn.Module):
    """The layers `[layer_start, layer_end)` of one pipeline stage, on one TP rank.

    With tied embeddings and the head on a later stage than the embedding, the stage keeps
    `tied_copy`, a replica of layer 0's token embedding (Megatron's approach): it starts equal
    and gets the same summed gradient every step (engine.sync_tied_gradients), so it stays
    equal; checkpoints store layer 0's tensor only.
    """

    def __init__(
        self, spec: ModelSpec, layer_start: int, layer_end: int, tp: TPGroup = SINGLE
    ) -> None:
        super().__init__()
        self.spec = spec
        self.tp = tp
        self.layer_indices = list(range(layer_start, layer_end))
        self.tied_copy: VocabParallelEmbedding | None = None
        layers: list[nn.Module] = []
        for index in self.layer_indices:
            tied = None
            if spec.tied_embeddings and index == spec.num_layers - 1:
                if layer_start == 0:
                    first = layers[0]
                    assert isinstance(first, Embedding)
                    tied = first.tokens
                else:
                    self.tied_copy = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, tp)
                    tied = self.tied_copy
            layers.append(build_layer(spec, index, tp, tied))
        self.layers = nn.ModuleList(layers)

    @property
    def has_head(self) -> bool:
        return self.layer_indices[-1] == self.spec.num_layers - 1

    @property
    def has_embedding(self) -> bool:
        return self.layer_indices[0] == 0

    def initialise(self, seed: int) -> None:
        for index, layer in zip(self.layer_indices, self.layers, strict=True):
            initialise_layer(layer, index, seed, self.tp)
        if self.tied_copy is not None:
            split = self.tied_copy.splits["weight"]
            initialise_parameter(
                self.tied_copy.weight, index=0, name=TIED_KEY, split=split, seed=seed, tp=self.tp
            )

    def tied_embedding(self) -> VocabParallelEmbedding | None:
        """The token embedding a tied head uses, if this stage takes part in a tie across
        stages (it holds layer 0 or the copy, and the other end is on another stage)."""
        if not self.spec.tied_embeddings or (self.has_embedding and self.has_head):
            return None
        if self.tied_copy is not None:
            return self.tied_copy
        if self.has_embedding:
            first = self.layers[0]
            assert isinstance(first, Embedding)
            return first.tokens
        return None

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            if isinstance(layer, Head):
                if targets is None:
                    raise ValueError("the head needs targets")
                loss: torch.Tensor = layer(x, targets)
                return loss
            x = layer(x)
        return x

    def named_layers(self) -> list[tuple[int, nn.Module]]:
        return list(zip(self.layer_indices, self.layers, strict=True))
