"""The models, built layer by layer from a ModelSpec.

The trainer builds exactly the layers of its stage (`[layer_start, layer_end)` in the
planner's numbering: 0 = embedding, 1..num_blocks = blocks, last = head), each split over the
stage's TP group. One code path covers the catalog's decoder families: learned positions or
rotary, LayerNorm or RMSNorm, GELU MLP or SwiGLU, grouped-query attention, biases except for
the LLaMA family (the same rule ModelSpec.block_parameters counts with). T5 and wide-ResNet
layers are in sailplan.trainer.zoo.

A stage passes the next one a tuple of tensors (ModelSpec.boundary_shapes): the hidden
state, or inside T5's decoder the hidden state and the encoder output. Parameters that
layers on several stages use (a token matrix shared by the embedding and a tied head or
T5's decoder, T5's position bias tables: `shared_users`) belong to their first user; any
other stage that uses one keeps a copy, kept equal by summing the gradients of all copies
every step (engine.sync_shared_gradients), DeepSpeed's tied layers.

Initialisation is a pure function of (seed, logical layer, parameter name): each rank draws
the full logical tensor and keeps its shard, so every plan starts from the same model and
the single-process run is a valid reference. `param_splits` tells the checkpoint code how each
local parameter maps onto its logical tensor. Called by the engine and by the profilers.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.simulator.ties import shared_users
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

Batch = Mapping[str, torch.Tensor]  # one micro-batch's data: inputs, targets, ...
State = tuple[torch.Tensor, ...]  # what crosses a stage boundary


class StageLayer(nn.Module):
    """A layer that takes the boundary state and the micro-batch (the zoo's layers); the
    decoder's layers keep their own signatures (StageModel.forward calls both)."""

    def forward(self, state: State, batch: Batch) -> State | torch.Tensor:
        raise NotImplementedError


def _uses_bias(spec: ModelSpec) -> bool:
    # ModelSpec.block_parameters counts with the same rule; tests/trainer/test_trainer_model.py
    # checks the two agree.
    return spec.uses_bias


# A shared parameter is its owner layer's module at this attribute (the owner is the first
# user); its logical checkpoint key is `layers.<owner>.<attribute>.weight`.
SHARED_ATTRIBUTE = {
    "tokens": "tokens",
    "encoder_bias": "relative_bias",
    "decoder_bias": "relative_bias",
}


def data_layers(spec: ModelSpec) -> frozenset[int]:
    """Layers that read the micro-batch: the first (inputs), the head (targets) and T5's
    first decoder block (the decoder's input tokens)."""
    layers = {0, spec.num_layers - 1}
    if spec.architecture == "encoder-decoder":
        layers.add(spec.first_decoder_layer)
    return frozenset(layers)


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


def attention_core(recompute: bool, core: Any, *args: object) -> torch.Tensor:
    """An attention module's core (QK^T, softmax, attention over V: the scaled dot product
    and, with grouped-query attention, the K/V heads it repeats). Under selective
    recomputation (Stage.recompute == "selective", the module's `recompute_core`) it runs
    through torch.utils.checkpoint: the backward keeps only the core's inputs (Q, K, V, the
    mask) and runs the core again; the projections around it keep their activations
    (Megatron-LM's selective recomputation; the simulator prices it:
    planner/profiles/selective.py)."""
    if recompute and torch.is_grad_enabled():
        out: torch.Tensor = checkpoint(core, *args, use_reentrant=False)
        return out
    result: torch.Tensor = core(*args)
    return result


class RecomputableAttention(nn.Module):
    """An attention module whose core selective recomputation can checkpoint
    (StageModel.set_recompute sets `recompute_core`; the module calls attention_core)."""

    recompute_core: bool = False


class Attention(RecomputableAttention):
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
        y = attention_core(self.recompute_core, self._core, q, k, v)
        y = y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)
        out: torch.Tensor = self.o_proj(y)
        return out

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.kv_heads != self.heads:
            group = self.heads // self.kv_heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TPGroup) -> None:
        super().__init__()
        bias = _uses_bias(spec)
        h, f = spec.hidden_size, spec.ffn_size
        self.tp = tp
        self.swiglu = spec.mlp == "swiglu"
        self.relu = spec.mlp == "relu"
        self.up_proj = ColumnParallelLinear(h, f, bias, tp)
        self.gate_proj = ColumnParallelLinear(h, f, bias, tp) if self.swiglu else None
        self.down_proj = RowParallelLinear(f, h, bias, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(x, self.tp)
        if self.gate_proj is not None:
            hidden = nn.functional.silu(self.gate_proj(x)) * self.up_proj(x)
        elif self.relu:
            hidden = nn.functional.relu(self.up_proj(x))
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
        # T5 scales the decoder output by d_model^-0.5 before a tied LM head (Mesh
        # TensorFlow's and Hugging Face's T5ForConditionalGeneration)
        self.scale = spec.hidden_size**-0.5 if spec.family == "t5" and spec.tied_embeddings else 1.0

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(self.norm(x) * self.scale, self.tp)
        if self.projection is not None:
            logits = self.projection(x)
        else:
            logits = nn.functional.linear(x, self._tied[0].weight)
        return vocab_parallel_cross_entropy(logits, targets, self.vocab_start, self.tp)


def build_layer(
    spec: ModelSpec,
    index: int,
    tp: TPGroup = SINGLE,
    shared: Mapping[str, nn.Module] | None = None,
) -> nn.Module:
    """Layer `index` on one TP rank; `shared`: the shared modules it uses but does not own."""
    shared = shared or {}
    problem = spec.tensor_parallel_problem(tp.size)
    if problem is not None:
        raise ValueError(problem)
    if spec.architecture in ("encoder-decoder", "convnet"):
        from sailplan.trainer import zoo  # here: zoo imports this module

        return zoo.build_layer(spec, index, tp, shared)
    if spec.architecture != "decoder":
        raise ValueError(
            f"{spec.name}: sailplan-train trains decoders, T5 and convnets, not encoders"
        )
    kind = spec.layer_kind(index)
    if kind == "embedding":
        return Embedding(spec, tp)
    if kind == "head":
        tied = shared.get("tokens")
        assert tied is None or isinstance(tied, VocabParallelEmbedding)
        return Head(spec, tp, tied)
    return Block(spec, tp)


def shared_weight(module: nn.Module) -> tuple[nn.Parameter, Split]:
    """A shared module's one parameter (token matrix or position bias table) and its split."""
    weight = module.weight
    splits: dict[str, Split] = module.splits  # type: ignore[assignment]
    assert isinstance(weight, nn.Parameter)
    return weight, splits["weight"]


def build_shared(spec: ModelSpec, name: str, tp: TPGroup) -> nn.Module:
    """A stage's copy of a shared module it uses but whose owner is on another stage."""
    if name == "tokens":
        return VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, tp)
    from sailplan.trainer import zoo

    return zoo.RelativePositionBias(spec, tp, bidirectional=name == "encoder_bias")


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
    if owner.endswith("norm"):  # layer, RMS and batch norms: the identity
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


class StageModel(nn.Module):
    """The layers `[layer_start, layer_end)` of one pipeline stage, on one TP rank.

    `copies` holds this stage's copies of shared modules whose owner layer is on another
    stage (see the module docstring): they start equal to the owner's and get the same
    summed gradient every step, so they stay equal; checkpoints store the owner's only.
    """

    def __init__(
        self, spec: ModelSpec, layer_start: int, layer_end: int, tp: TPGroup = SINGLE
    ) -> None:
        super().__init__()
        self.spec = spec
        self.tp = tp
        self.layer_indices = list(range(layer_start, layer_end))
        self.users = shared_users(spec)
        self.copies = nn.ModuleDict()
        available: dict[str, nn.Module] = {}
        layers: list[nn.Module] = []
        for index in self.layer_indices:
            refs: dict[str, nn.Module] = {}
            for name, users in self.users.items():
                if index not in users or users[0] == index:
                    continue  # not a user, or the owner (it builds the module)
                if name not in available:  # the owner is on an earlier stage
                    self.copies[name] = build_shared(spec, name, tp)
                    available[name] = self.copies[name]
                refs[name] = available[name]
            layer = build_layer(spec, index, tp, refs)
            for name, users in self.users.items():
                if users[0] == index:
                    available[name] = getattr(layer, SHARED_ATTRIBUTE[name])
            layers.append(layer)
        self.layers = nn.ModuleList(layers)
        self.reads_data = bool(data_layers(spec) & set(self.layer_indices))
        # Stage.recompute == "full": each layer keeps only its input for the backward and
        # runs its forward again there (the simulator prices this: CostModel.stage_seconds);
        # "selective": the attention modules' cores only (set_recompute)
        self.recompute = False

    def set_recompute(self, mode: str) -> None:
        """Stage.recompute: "full" checkpoints every layer, "selective" only the attention
        cores of the stage's attention modules (their `recompute_core`), "none" neither."""
        self.recompute = mode == "full"
        for module in self.modules():
            if isinstance(module, RecomputableAttention):
                module.recompute_core = mode == "selective"

    @property
    def has_head(self) -> bool:
        return self.layer_indices[-1] == self.spec.num_layers - 1

    @property
    def has_embedding(self) -> bool:
        return self.layer_indices[0] == 0

    def initialise(self, seed: int) -> None:
        for index, layer in zip(self.layer_indices, self.layers, strict=True):
            initialise_layer(layer, index, seed, self.tp)
        for name, copy in self.copies.items():
            owner, key = self.shared_key(name)
            weight, split = shared_weight(copy)
            initialise_parameter(
                weight,
                index=owner,
                name=key,
                split=split,
                seed=seed,
                tp=self.tp,
            )

    def shared_key(self, name: str) -> tuple[int, str]:
        """(owner layer, parameter name inside it) of a shared module's weight."""
        return self.users[name][0], f"{SHARED_ATTRIBUTE[name]}.weight"

    def shared_across_stages(self) -> list[tuple[str, nn.Module]]:
        """The shared modules this stage uses (owned or copied) that layers of other stages
        use too, in name order: their gradients are summed across stages every step."""
        mine = set(self.layer_indices)
        found: list[tuple[str, nn.Module]] = []
        for name, users in sorted(self.users.items()):
            if not mine & set(users) or set(users) <= mine:
                continue
            if name in self.copies:
                found.append((name, self.copies[name]))
            else:
                owner = self.layers[self.layer_indices.index(users[0])]
                found.append((name, getattr(owner, SHARED_ATTRIBUTE[name])))
        return found

    def forward(self, state: State | None, batch: Batch | None = None) -> State | torch.Tensor:
        """The stage's layers on what it received (None on the first stage) and the
        micro-batch (for the layers that read it); the loss on the last stage."""
        data: Batch = batch or {}
        current: State = state or ()
        for index, layer in zip(self.layer_indices, self.layers, strict=True):
            if isinstance(layer, StageLayer):
                out = self._run(layer, current, data)
            elif isinstance(layer, Head):
                if "targets" not in data:
                    raise ValueError("the head needs targets")
                out = self._run(layer, current[0], data["targets"])
            elif index == 0:
                out = (self._run(layer, data["inputs"]),)
            else:
                out = (self._run(layer, current[0]),)
            if isinstance(out, torch.Tensor):
                return out  # the loss
            current = out
        return current

    def _run(self, layer: nn.Module, *args: object) -> Any:
        """One layer's forward; under recomputation through torch.utils.checkpoint
        (non-reentrant: autocast and the TP collectives run again in the backward the same
        way on every rank, and gradients reach inputs that are not the first argument)."""
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def named_layers(self) -> list[tuple[int, nn.Module]]:
        return list(zip(self.layer_indices, self.layers, strict=True))
