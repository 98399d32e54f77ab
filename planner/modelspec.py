"""The shape of a model, layer by layer.

One description serves both sides of the system: the planner prices each layer from it
(parameters, activation sizes, FLOPs) and the trainer builds its modules from it, so a plan's
layer ranges mean the same thing everywhere. Three families of layer lists:

- decoder and encoder transformers (OPT, GPT, LLaMA, BERT): layer 0 is the embedding,
  layers 1..num_blocks are transformer blocks, the last layer is the head (LM head or
  pooler), which is also the Sailor artifact's numbering (OPT-350M: 26 layers = 1 + 24 + 1);
- encoder-decoder transformers (T5): layer 0 embeds the encoder's tokens, then
  num_blocks - decoder_blocks encoder blocks (the last one ends with the encoder's final
  norm), then decoder_blocks decoder blocks (self-attention, cross-attention to the
  encoder output, MLP; the first one embeds the decoder's tokens), then the head. The
  encoder output is an input of every decoder block, so a boundary inside the decoder
  carries it next to the decoder's hidden state (boundary_shapes);
- convolutional networks (wide-ResNet): layer 0 is the stem (7x7 convolution, batch norm,
  max-pool), layers 1..num_blocks are bottleneck blocks grouped in stages (stage_blocks),
  the last layer is the pooled classifier.

Called by the catalog (named models), the simulator and estimator, the operator (custom
shapes in a TrainingJob) and the trainer (module construction).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LayerKind = Literal["embedding", "block", "decoder-block", "head", "stem", "conv-block"]
Shape = tuple[int, ...]

TRANSFORMERS = ("decoder", "encoder", "encoder-decoder")
# He et al. 2016, Table 1 and torchvision's Bottleneck: the last 1x1 convolution of a
# bottleneck widens its planes 4 times; stage i has stem_channels * 2^i planes.
BOTTLENECK_EXPANSION = 4


@dataclass(frozen=True)
class ConvBlock:
    """One bottleneck block of a convnet: 1x1 (in -> width), 3x3 (width -> width, stride),
    1x1 (width -> out); a 1x1 projection of the input when stride or channels change."""

    in_channels: int
    width: int
    out_channels: int
    stride: int
    in_side: int  # input height = width in pixels
    out_side: int

    @property
    def downsample(self) -> bool:
        return self.stride != 1 or self.in_channels != self.out_channels


def _halved(side: int) -> int:
    """Side after a stride-2 convolution or pooling with 'same' padding (torchvision's
    7x7/pad 3, 3x3/pad 1 and 1x1/pad 0 layers all give ceil(side / 2))."""
    return -(-side // 2)


class ModelSpec(BaseModel):
    """A model described by its hyper-parameters; every per-layer quantity derives from it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=63)
    family: Literal["opt", "gpt-neo", "llama", "gpt3", "bert", "t5", "wide-resnet", "custom"] = (
        "custom"
    )
    architecture: Literal["decoder", "encoder", "encoder-decoder", "convnet"] = "decoder"
    hidden_size: int = Field(default=0, ge=0, description="transformer width (a convnet: unset)")
    num_blocks: int = Field(
        gt=0,
        description="the layers between the first layer and the head: transformer blocks "
        "(encoder then decoder blocks for an encoder-decoder), or a convnet's bottleneck blocks",
    )
    num_heads: int = Field(default=0, ge=0, description="attention heads (a convnet: unset)")
    num_kv_heads: int | None = Field(
        default=None, gt=0, description="grouped-query heads; None = num_heads"
    )
    ffn_hidden_size: int | None = Field(default=None, gt=0, description="None = 4 * hidden_size")
    vocab_size: int = Field(default=0, ge=0, description="vocabulary (a convnet: unset)")
    sequence_length: int = Field(
        default=0,
        ge=0,
        description="tokens per sample; an encoder-decoder's encoder input (a convnet: unset)",
    )
    position_embedding: Literal["learned", "rotary", "relative"] = "learned"
    mlp: Literal["gelu", "swiglu", "relu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    tied_embeddings: bool = False
    # -- encoder-decoder (T5) ---------------------------------------------------------------
    decoder_blocks: int = Field(
        default=0,
        ge=0,
        description="encoder-decoder: how many of the num_blocks (the last ones) are decoder "
        "blocks with cross-attention",
    )
    decoder_sequence_length: int | None = Field(
        default=None,
        gt=0,
        description="encoder-decoder: target tokens per sample; None = sequence_length",
    )
    relative_attention_buckets: int = Field(
        default=32,
        gt=0,
        description="relative positions: buckets of T5's position bias, a buckets x heads table "
        "in the first block of each stack (Raffel et al. 2020 use 32)",
    )
    # -- convnet (wide-ResNet) ------------------------------------------------------------
    stage_blocks: tuple[int, ...] = Field(
        default=(),
        description="convnet: bottleneck blocks per stage (ResNet-50: 3, 4, 6, 3); they sum to num_blocks",
    )
    width_factor: int = Field(
        default=1, gt=0, description="convnet: bottleneck width multiplier (wide-ResNet-50-2: 2)"
    )
    stem_channels: int = Field(default=64, gt=0, description="convnet: the stem's output channels")
    image_channels: int = Field(default=3, gt=0, description="convnet: input channels")
    image_size: int = Field(default=0, ge=0, description="convnet: input height = width in pixels")
    num_classes: int = Field(default=0, ge=0, description="convnet: classifier outputs")

    @model_validator(mode="before")
    @classmethod
    def _convnet_block_count(cls, data: Any) -> Any:
        # a convnet's block count is the sum of its stages': let the catalog omit it
        if (
            isinstance(data, dict)
            and data.get("architecture") == "convnet"
            and "num_blocks" not in data
            and data.get("stage_blocks")
        ):
            data = {**data, "num_blocks": sum(data["stage_blocks"])}
        return data

    @model_validator(mode="after")
    def _consistent_shape(self) -> ModelSpec:
        transformer_fields = {
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "vocab_size": self.vocab_size,
            "sequence_length": self.sequence_length,
        }
        if self.architecture == "convnet":
            given = [name for name, value in transformer_fields.items() if value]
            if given:
                raise ValueError(f"a convnet has no {', '.join(given)}")
            if not self.stage_blocks or min(self.stage_blocks) < 1:
                raise ValueError("a convnet needs stage_blocks, one or more blocks per stage")
            if sum(self.stage_blocks) != self.num_blocks:
                raise ValueError(
                    f"num_blocks {self.num_blocks} is not the sum of stage_blocks {self.stage_blocks}"
                )
            if not self.image_size or not self.num_classes:
                raise ValueError("a convnet needs image_size and num_classes")
            return self
        missing = [name for name, value in transformer_fields.items() if not value]
        if missing:
            raise ValueError(f"a transformer needs {', '.join(missing)} (greater than 0)")
        if self.stage_blocks:
            raise ValueError("stage_blocks is for convnets")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        if self.num_heads % self.kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.kv_heads}"
            )
        encoder_decoder = self.architecture == "encoder-decoder"
        if encoder_decoder and not 0 < self.decoder_blocks < self.num_blocks:
            raise ValueError(
                f"an encoder-decoder needs 0 < decoder_blocks < num_blocks ({self.num_blocks})"
            )
        if not encoder_decoder and (self.decoder_blocks or self.decoder_sequence_length):
            raise ValueError("decoder_blocks and decoder_sequence_length are for encoder-decoders")
        # the trainer implements relative position buckets in T5's blocks only, and T5's
        # blocks with nothing else
        if encoder_decoder != (self.position_embedding == "relative"):
            raise ValueError("relative position embeddings go with the encoder-decoder (T5) only")
        return self

    # -- derived shape -------------------------------------------------------------------

    @property
    def is_transformer(self) -> bool:
        return self.architecture in TRANSFORMERS

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def uses_bias(self) -> bool:
        """Linear layers of the blocks have biases (LLaMA and T5 have none)."""
        return self.family not in ("llama", "t5")

    @property
    def encoder_blocks(self) -> int:
        """Blocks of the encoder stack (all blocks of an encoder, none of a decoder-only)."""
        if self.architecture == "encoder-decoder":
            return self.num_blocks - self.decoder_blocks
        return self.num_blocks if self.architecture == "encoder" else 0

    @property
    def first_decoder_layer(self) -> int:
        """An encoder-decoder's first decoder block (it embeds the decoder's tokens)."""
        return self.encoder_blocks + 1

    @property
    def target_length(self) -> int:
        """Tokens the head predicts per sample (an encoder-decoder's decoder length)."""
        return self.decoder_sequence_length or self.sequence_length

    @property
    def num_layers(self) -> int:
        """Layers as the planner and the plan count them: first layer + blocks + head."""
        return self.num_blocks + 2

    def layer_kind(self, index: int) -> LayerKind:
        if not 0 <= index < self.num_layers:
            raise IndexError(f"layer {index} outside 0..{self.num_layers - 1}")
        convnet = self.architecture == "convnet"
        if index == 0:
            return "stem" if convnet else "embedding"
        if index == self.num_layers - 1:
            return "head"
        if convnet:
            return "conv-block"
        if self.architecture == "encoder-decoder" and index >= self.first_decoder_layer:
            return "decoder-block"
        return "block"

    def max_tensor_parallel(self) -> int:
        """Largest TP degree the shape allows (heads and kv heads must split evenly; a
        convnet is not split: its channels are not sharded by the trainer)."""
        return 1 if self.architecture == "convnet" else self.kv_heads

    def supports_tensor_parallel(self, tp: int) -> bool:
        if self.architecture == "convnet":
            return tp == 1
        return (
            tp >= 1
            and self.num_heads % tp == 0
            and self.kv_heads % tp == 0
            and (self.ffn_size % tp == 0)
        )

    def tensor_parallel_problem(self, tp: int) -> str | None:
        """Why `tp` cannot split this model (one line), or None when it can."""
        if self.supports_tensor_parallel(tp):
            return None
        if self.architecture == "convnet":
            return (
                f"{self.name} is a convnet: the trainer does not split its channels, so "
                "tensor parallelism is 1"
            )
        return (
            f"tensor parallelism {tp} does not divide the model's heads "
            f"({self.num_heads}, kv {self.kv_heads}) and MLP width ({self.ffn_size})"
        )

    # -- convnet geometry ----------------------------------------------------------------

    def stem_side(self) -> int:
        """Side of the stem's output: stride-2 convolution then stride-2 max-pool."""
        return _halved(_halved(self.image_size))

    def conv_blocks(self) -> tuple[ConvBlock, ...]:
        """The bottleneck blocks in layer order (torchvision's ResNet v1.5: the stride is on
        the 3x3 convolution of a stage's first block, stages 2-4 halve the side)."""
        blocks: list[ConvBlock] = []
        channels, side = self.stem_channels, self.stem_side()
        for stage, count in enumerate(self.stage_blocks):
            planes = self.stem_channels * 2**stage
            width = planes * self.width_factor
            out = planes * BOTTLENECK_EXPANSION
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                out_side = _halved(side) if stride == 2 else side
                blocks.append(ConvBlock(channels, width, out, stride, side, out_side))
                channels, side = out, out_side
        return tuple(blocks)

    def conv_block(self, index: int) -> ConvBlock:
        if self.layer_kind(index) != "conv-block":
            raise ValueError(f"layer {index} of {self.name} is not a bottleneck block")
        return self.conv_blocks()[index - 1]

    # -- parameters ----------------------------------------------------------------------

    def _norm_parameters(self) -> int:
        return 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size

    def _attention_parameters(self, tp: int) -> int:
        """Q, K, V (column-parallel: weights and biases split) and the output projection
        (row-parallel: weight split, bias replicated) on one TP rank."""
        h = self.hidden_size
        kv = self.kv_heads * self.head_dim
        bias = self.uses_bias
        qkv = h * (h + 2 * kv) + ((h + 2 * kv) if bias else 0)
        return (qkv + h * h) // tp + (h if bias else 0)

    def _mlp_parameters(self, tp: int) -> int:
        """Up (and SwiGLU's gate) column-parallel, down row-parallel, on one TP rank."""
        h, f = self.hidden_size, self.ffn_size
        bias = self.uses_bias
        if self.mlp == "swiglu":
            up = 2 * h * f + (2 * f if bias else 0)
        else:
            up = h * f + (f if bias else 0)
        return (up + f * h) // tp + (h if bias else 0)

    def _relative_bias_parameters(self, tp: int) -> int:
        """T5's position bias table (buckets x heads, split over heads by TP)."""
        return self.relative_attention_buckets * self.num_heads // tp

    def block_parameters(self, tp: int = 1, index: int | None = None) -> int:
        """Parameters of one transformer block held by one rank of a TP group.

        Megatron layout: QKV and the MLP up-projection are column-parallel (weights and
        biases split), the attention output and MLP down-projection are row-parallel
        (weights split, bias replicated), norms replicated. A T5 decoder block has a second
        attention (cross-attention: Q from the decoder, K and V from the encoder output)
        and a third norm. With `index`, the block's extras count too: T5's position bias
        table in the first block of each stack and the encoder's final norm in its last.
        """
        kind = "block" if index is None else self.layer_kind(index)
        attentions, norms = (2, 3) if kind == "decoder-block" else (1, 2)
        count = (
            attentions * self._attention_parameters(tp)
            + self._mlp_parameters(tp)
            + norms * self._norm_parameters()
        )
        if index is not None and self.architecture == "encoder-decoder":
            if index in (1, self.first_decoder_layer):
                count += self._relative_bias_parameters(tp)
            if index == self.encoder_blocks:
                count += self._norm_parameters()  # the encoder's final norm
        return count

    def embedding_parameters(self, tp: int = 1) -> int:
        """Token (vocab-parallel) plus learned position embeddings on one TP rank."""
        tokens = self.vocab_size * self.hidden_size // tp
        positions = (
            self.sequence_length * self.hidden_size if self.position_embedding == "learned" else 0
        )
        return tokens + positions

    def head_parameters(self, tp: int = 1) -> int:
        """Final norm plus output projection (absent when tied to the embedding); a
        convnet's classifier (weights and bias)."""
        if self.architecture == "convnet":
            features = self.conv_blocks()[-1].out_channels
            return features * self.num_classes + self.num_classes
        projection = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size // tp
        return self._norm_parameters() + projection

    def stem_parameters(self) -> int:
        """7x7 convolution without bias, then batch norm (scale and shift per channel)."""
        c = self.stem_channels
        return 7 * 7 * self.image_channels * c + 2 * c

    def conv_block_parameters(self, index: int) -> int:
        """Three convolutions without bias, each with batch norm, plus the projection."""
        b = self.conv_block(index)
        count = b.in_channels * b.width + 9 * b.width * b.width + b.width * b.out_channels
        count += 2 * (b.width + b.width + b.out_channels)
        if b.downsample:
            count += b.in_channels * b.out_channels + 2 * b.out_channels
        return count

    def layer_parameters(self, index: int, tp: int = 1) -> int:
        kind = self.layer_kind(index)
        if kind == "embedding":
            return self.embedding_parameters(tp)
        if kind == "head":
            return self.head_parameters(tp)
        if kind == "stem":
            return self.stem_parameters()
        if kind == "conv-block":
            return self.conv_block_parameters(index)
        return self.block_parameters(tp, index)

    def total_parameters(self) -> int:
        return sum(self.layer_parameters(i) for i in range(self.num_layers))

    # -- activations -----------------------------------------------------------------------

    def boundary_shapes(self, micro_batch_size: int, layer: int) -> tuple[Shape, ...]:
        """Shapes of the tensors layer `layer` receives from layer `layer - 1` for one
        micro-batch: what a pipeline stage starting at `layer` receives (and sends back as
        gradients). Transformers: the hidden state; inside an encoder-decoder's decoder,
        the decoder's hidden state and the encoder output that every decoder block attends
        to; a convnet: the feature map [batch, channels, side, side]."""
        if not 1 <= layer < self.num_layers:
            raise IndexError(f"no stage boundary before layer {layer} of {self.name}")
        b = micro_batch_size
        if self.architecture == "convnet":
            if layer == 1:
                side = self.stem_side()
                return ((b, self.stem_channels, side, side),)
            block = self.conv_blocks()[layer - 2]
            return ((b, block.out_channels, block.out_side, block.out_side),)
        encoder = (b, self.sequence_length, self.hidden_size)
        if self.architecture == "encoder-decoder" and layer > self.first_decoder_layer:
            return ((b, self.target_length, self.hidden_size), encoder)
        return (encoder,)

    def boundary_activation_elements(self, micro_batch_size: int, layer: int) -> int:
        """Elements passed between pipeline stages at the boundary before `layer`."""
        return sum(math.prod(shape) for shape in self.boundary_shapes(micro_batch_size, layer))
