"""T5 and wide-ResNet layers, built from a ModelSpec in the planner's layer numbering.

T5 (Raffel et al. 2020, v1.0 as Hugging Face's T5ForConditionalGeneration): layer 0 embeds
the encoder's tokens; encoder blocks (self-attention with a bidirectional relative position
bias, ReLU MLP, RMS norms, no biases; the last ends with the encoder's final norm); decoder
blocks (the first embeds the decoder's input tokens with the same token matrix; causal
self-attention with a unidirectional position bias, cross-attention to the encoder output,
MLP); the head (final norm, LM head). Attention is unscaled (T5 folds 1/sqrt(d) into its
initialisation). The position bias tables live in the first block of each stack and are
used by every block of it, so a stage without that block keeps a synchronised copy
(model.StageModel). Tensor parallelism is Megatron's: Q, K, V and the MLP's input
projection column-parallel, the outputs row-parallel, the bias tables split by heads; the
encoder output enters the cross-attention through copy_to_tp, so its gradient is summed
over the TP group like any column-parallel input.

Wide-ResNet (torchvision's wide_resnet50_2, ResNet v1.5): the stem (7x7 convolution, batch
norm, ReLU, 3x3 max-pool), bottleneck blocks, the classifier (global average pool, linear).
Batch norm normalises with each micro-batch's statistics and keeps no running statistics:
the trainer never evaluates, and running statistics would be state outside the
checkpoint's parameters. A plan's micro-batch size is therefore part of the model's
arithmetic: plans train the same model only at the same micro-batch size. Convnets are not
tensor parallel (ModelSpec.supports_tensor_parallel).

Called by model.build_layer and model.build_shared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from sailplan.planner.modelspec import ModelSpec
from sailplan.trainer.model import (
    MLP,
    Batch,
    Head,
    RecomputableAttention,
    StageLayer,
    State,
    _norm,
    attention_core,
)
from sailplan.trainer.tp import (
    ColumnParallelLinear,
    RowParallelLinear,
    Split,
    TPGroup,
    VocabParallelEmbedding,
    copy_to_tp,
    shard_range,
)

# Hugging Face T5Config.relative_attention_max_distance: distances beyond share a bucket.
RELATIVE_MAX_DISTANCE = 128


def relative_buckets(queries: int, keys: int, buckets: int, bidirectional: bool) -> torch.Tensor:
    """[queries, keys] bucket of each relative position (T5's _relative_position_bucket):
    half the buckets exact, the rest logarithmic up to RELATIVE_MAX_DISTANCE."""
    relative = torch.arange(keys)[None, :] - torch.arange(queries)[:, None]
    bucket = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        bucket += (relative > 0).long() * buckets
        relative = relative.abs()
    else:
        relative = -torch.clamp(relative, max=0)
    exact = buckets // 2
    scaled = torch.log(relative.clamp(min=1).float() / exact) / math.log(
        RELATIVE_MAX_DISTANCE / exact
    )
    large = (exact + scaled * (buckets - exact)).long().clamp(max=buckets - 1)
    return bucket + torch.where(relative < exact, relative, large)


class RelativePositionBias(nn.Module):
    """T5's position bias: a [buckets, heads] table, this rank's heads."""

    def __init__(self, spec: ModelSpec, tp: TPGroup, *, bidirectional: bool) -> None:
        super().__init__()
        start, end = shard_range(spec.num_heads, tp)
        self.weight = nn.Parameter(torch.empty(spec.relative_attention_buckets, end - start))
        self.splits = {"weight": Split(1, spec.num_heads)}
        self.bidirectional = bidirectional

    def forward(self, queries: int, keys: int) -> torch.Tensor:
        """[1, heads, queries, keys] additive attention bias."""
        index = relative_buckets(queries, keys, self.weight.shape[0], self.bidirectional)
        return self.weight[index.to(self.weight.device)].permute(2, 0, 1).unsqueeze(0)


class T5Attention(RecomputableAttention):
    """Self-attention (source = x) or cross-attention (source = the encoder output)."""

    def __init__(self, spec: ModelSpec, tp: TPGroup) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.tp = tp
        self.heads = spec.num_heads // tp.size
        self.head_dim = d
        self.q_proj = ColumnParallelLinear(h, spec.num_heads * d, False, tp)
        self.k_proj = ColumnParallelLinear(h, spec.num_heads * d, False, tp)
        self.v_proj = ColumnParallelLinear(h, spec.num_heads * d, False, tp)
        self.o_proj = RowParallelLinear(spec.num_heads * d, h, False, tp)

    def forward(
        self, x: torch.Tensor, source: torch.Tensor | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        b, s, _ = x.shape
        x = copy_to_tp(x, self.tp)
        kv = x if source is None else copy_to_tp(source, self.tp)
        k_len = kv.shape[1]
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(kv).view(b, k_len, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(kv).view(b, k_len, self.heads, self.head_dim).transpose(1, 2)
        y = attention_core(self.recompute_core, _core, q, k, v, bias)
        out: torch.Tensor = self.o_proj(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))
        return out


def _core(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """T5's attention core: unscaled, with the position bias (and mask) added to the scores."""
    return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)


def _causal(bias: torch.Tensor) -> torch.Tensor:
    """The bias with -inf above the diagonal (a decoder position sees only its past)."""
    queries, keys = bias.shape[-2:]
    future = torch.ones(queries, keys, dtype=torch.bool, device=bias.device).triu(1)
    return bias.masked_fill(future, float("-inf"))


class _UsesBias(StageLayer):
    """A block whose stack's position bias is its own (first block) or another's."""

    relative_bias: RelativePositionBias | None

    def _init_bias(
        self,
        spec: ModelSpec,
        tp: TPGroup,
        *,
        owner: bool,
        shared: nn.Module | None,
        bidirectional: bool,
    ) -> None:
        self.relative_bias = (
            RelativePositionBias(spec, tp, bidirectional=bidirectional) if owner else None
        )
        self._shared_bias = [] if owner else [shared]

    def position_bias(self, queries: int, keys: int) -> torch.Tensor:
        table = self.relative_bias if self.relative_bias is not None else self._shared_bias[0]
        assert isinstance(table, RelativePositionBias)
        out: torch.Tensor = table(queries, keys)
        return out


class T5Embedding(StageLayer):
    def __init__(self, spec: ModelSpec, tp: TPGroup) -> None:
        super().__init__()
        self.tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, tp)

    def forward(self, state: State, batch: Batch) -> State:
        return (self.tokens(batch["inputs"]),)


class T5EncoderBlock(_UsesBias):
    def __init__(
        self, spec: ModelSpec, index: int, tp: TPGroup, shared: Mapping[str, nn.Module]
    ) -> None:
        super().__init__()
        self.attn_norm = _norm(spec)
        self.attn = T5Attention(spec, tp)
        self.mlp_norm = _norm(spec)
        self.mlp = MLP(spec, tp)
        self._init_bias(
            spec, tp, owner=index == 1, shared=shared.get("encoder_bias"), bidirectional=True
        )
        self.final_norm = _norm(spec) if index == spec.encoder_blocks else None

    def forward(self, state: State, batch: Batch) -> State:
        (x,) = state
        s = x.shape[1]
        x = x + self.attn(self.attn_norm(x), None, self.position_bias(s, s))
        x = x + self.mlp(self.mlp_norm(x))
        if self.final_norm is not None:
            x = self.final_norm(x)
        return (x,)


class T5DecoderBlock(_UsesBias):
    def __init__(
        self, spec: ModelSpec, index: int, tp: TPGroup, shared: Mapping[str, nn.Module]
    ) -> None:
        super().__init__()
        first = index == spec.first_decoder_layer
        self.embeds = first
        self._tokens = [shared["tokens"]] if first else []
        self.self_norm = _norm(spec)
        self.self_attn = T5Attention(spec, tp)
        self.cross_norm = _norm(spec)
        self.cross_attn = T5Attention(spec, tp)
        self.mlp_norm = _norm(spec)
        self.mlp = MLP(spec, tp)
        self._init_bias(
            spec, tp, owner=first, shared=shared.get("decoder_bias"), bidirectional=False
        )

    def forward(self, state: State, batch: Batch) -> State:
        if self.embeds:
            (encoder,) = state
            y: torch.Tensor = self._tokens[0](batch["decoder_inputs"])
        else:
            y, encoder = state
        t = y.shape[1]
        y = y + self.self_attn(self.self_norm(y), None, _causal(self.position_bias(t, t)))
        y = y + self.cross_attn(self.cross_norm(y), encoder, None)
        y = y + self.mlp(self.mlp_norm(y))
        return (y, encoder)


# -- wide-ResNet -----------------------------------------------------------------------------


def _batch_norm(channels: int) -> nn.BatchNorm2d:
    # micro-batch statistics only (see the module docstring)
    return nn.BatchNorm2d(channels, track_running_stats=False)


class Stem(StageLayer):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            spec.image_channels, spec.stem_channels, 7, stride=2, padding=3, bias=False
        )
        self.norm = _batch_norm(spec.stem_channels)

    def forward(self, state: State, batch: Batch) -> State:
        x = nn.functional.relu(self.norm(self.conv(batch["inputs"])))
        return (nn.functional.max_pool2d(x, 3, stride=2, padding=1),)


class Bottleneck(StageLayer):
    def __init__(self, spec: ModelSpec, index: int) -> None:
        super().__init__()
        block = spec.conv_block(index)
        w, out = block.width, block.out_channels
        self.conv1 = nn.Conv2d(block.in_channels, w, 1, bias=False)
        self.conv1_norm = _batch_norm(w)
        self.conv2 = nn.Conv2d(w, w, 3, stride=block.stride, padding=1, bias=False)
        self.conv2_norm = _batch_norm(w)
        self.conv3 = nn.Conv2d(w, out, 1, bias=False)
        self.conv3_norm = _batch_norm(out)
        self.projection: nn.Conv2d | None = None
        self.projection_norm: nn.BatchNorm2d | None = None
        if block.downsample:
            self.projection = nn.Conv2d(block.in_channels, out, 1, stride=block.stride, bias=False)
            self.projection_norm = _batch_norm(out)

    def forward(self, state: State, batch: Batch) -> State:
        (x,) = state
        y = nn.functional.relu(self.conv1_norm(self.conv1(x)))
        y = nn.functional.relu(self.conv2_norm(self.conv2(y)))
        y = self.conv3_norm(self.conv3(y))
        if self.projection is not None and self.projection_norm is not None:
            x = self.projection_norm(self.projection(x))
        return (nn.functional.relu(x + y),)


class Classifier(StageLayer):
    """Global average pool, linear classifier, mean cross-entropy against the labels."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.fc = nn.Linear(spec.conv_blocks()[-1].out_channels, spec.num_classes)

    def forward(self, state: State, batch: Batch) -> torch.Tensor:
        (x,) = state
        logits = self.fc(x.mean(dim=(2, 3)))
        return nn.functional.cross_entropy(logits.float(), batch["targets"])


def build_layer(
    spec: ModelSpec, index: int, tp: TPGroup, shared: Mapping[str, nn.Module]
) -> nn.Module:
    kind = spec.layer_kind(index)
    if spec.architecture == "convnet":
        if kind == "stem":
            return Stem(spec)
        if kind == "head":
            return Classifier(spec)
        return Bottleneck(spec, index)
    if kind == "embedding":
        return T5Embedding(spec, tp)
    if kind == "head":
        tied = shared.get("tokens")
        assert tied is None or isinstance(tied, VocabParallelEmbedding)
        return Head(spec, tp, tied)
    if kind == "decoder-block":
        return T5DecoderBlock(spec, index, tp, shared)
    return T5EncoderBlock(spec, index, tp, shared)
