"""The shape of a model, layer by layer.

One description serves both sides of the system: the planner prices each layer from it
(parameters, activation sizes, FLOPs) and the trainer builds its modules from it, so a plan's
layer ranges mean the same thing everywhere. Layer 0 is the embedding, layers
1..num_blocks are transformer blocks, the last layer is the head (LM head or pooler),
which is also the Sailor artifact's numbering (OPT-350M: 26 layers = 1 + 24 + 1).

Called by the catalog (named models), the simulator and estimator, the operator (custom
shapes in a TrainingJob) and the trainer (module construction).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LayerKind = Literal["embedding", "block", "head"]


class ModelSpec(BaseModel):
    """A transformer described by its hyper-parameters; every per-layer quantity derives from it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=63)
    family: Literal["opt", "gpt-neo", "llama", "gpt3", "bert", "custom"] = "custom"
    architecture: Literal["decoder", "encoder"] = "decoder"
    hidden_size: int = Field(gt=0)
    num_blocks: int = Field(
        gt=0, description="transformer blocks (the layers between embedding and head)"
    )
    num_heads: int = Field(gt=0)
    num_kv_heads: int | None = Field(
        default=None, gt=0, description="grouped-query heads; None = num_heads"
    )
    ffn_hidden_size: int | None = Field(default=None, gt=0, description="None = 4 * hidden_size")
    vocab_size: int = Field(gt=0)
    sequence_length: int = Field(gt=0)
    position_embedding: Literal["learned", "rotary"] = "learned"
    mlp: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    tied_embeddings: bool = False

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        if self.num_heads % self.kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.kv_heads}"
            )
        return self

    # -- derived shape -------------------------------------------------------------------

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
    def num_layers(self) -> int:
        """Layers as the planner and the plan count them: embedding + blocks + head."""
        return self.num_blocks + 2

    def layer_kind(self, index: int) -> LayerKind:
        if not 0 <= index < self.num_layers:
            raise IndexError(f"layer {index} outside 0..{self.num_layers - 1}")
        if index == 0:
            return "embedding"
        if index == self.num_layers - 1:
            return "head"
        return "block"

    def max_tensor_parallel(self) -> int:
        """Largest TP degree the shape allows (heads and kv heads must split evenly)."""
        return self.kv_heads

    def supports_tensor_parallel(self, tp: int) -> bool:
        return (
            tp >= 1
            and self.num_heads % tp == 0
            and self.kv_heads % tp == 0
            and (self.ffn_size % tp == 0)
        )

    # -- parameters ----------------------------------------------------------------------

    def block_parameters(self, tp: int = 1) -> int:
        """Parameters of one transformer block held by one rank of a TP group.

        Megatron layout: QKV and the MLP up-projection are column-parallel (weights and
        biases split), the attention output and MLP down-projection are row-parallel
        (weights split, bias replicated), norms replicated.
        """
        h, f = self.hidden_size, self.ffn_size
        kv = self.kv_heads * self.head_dim
        bias = self.family not in ("llama",)
        qkv = h * (h + 2 * kv) + ((h + 2 * kv) if bias else 0)
        out = h * h
        out_bias = h if bias else 0
        if self.mlp == "swiglu":
            up = 2 * h * f + (2 * f if bias else 0)
        else:
            up = h * f + (f if bias else 0)
        down = f * h
        down_bias = h if bias else 0
        norm = (2 * h if self.norm == "layernorm" else h) * 2
        return (qkv + out + up + down) // tp + out_bias + down_bias + norm

    def embedding_parameters(self, tp: int = 1) -> int:
        """Token (vocab-parallel) plus learned position embeddings on one TP rank."""
        tokens = self.vocab_size * self.hidden_size // tp
        positions = (
            self.sequence_length * self.hidden_size if self.position_embedding == "learned" else 0
        )
        return tokens + positions

    def head_parameters(self, tp: int = 1) -> int:
        """Final norm plus output projection (absent when tied to the embedding)."""
        norm = 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size
        projection = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size // tp
        return norm + projection

    def layer_parameters(self, index: int, tp: int = 1) -> int:
        kind = self.layer_kind(index)
        if kind == "embedding":
            return self.embedding_parameters(tp)
        if kind == "head":
            return self.head_parameters(tp)
        return self.block_parameters(tp)

    def total_parameters(self) -> int:
        return sum(self.layer_parameters(i) for i in range(self.num_layers))

    # -- activations -----------------------------------------------------------------------

    def boundary_activation_elements(self, micro_batch_size: int) -> int:
        """Elements of the hidden state passed between pipeline stages for one micro-batch."""
        return micro_batch_size * self.sequence_length * self.hidden_size
