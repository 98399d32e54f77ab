"""The modules' parameter counts against ModelSpec, and the TP pieces against plain torch.

ModelSpec.layer_parameters is the planner's count (written from Megatron's layout and
checked against Sailor's llm_info for OPT-350M); the module count comes from the actual
torch modules. Agreement per layer and per TP rank, for every decoder of the catalog and
some local shapes, checks both.
"""

from __future__ import annotations

import pytest
import torch
from trainer_harness import TINY, TINY_LLAMA, TINY_T5, TINY_TIED, TINY_WRN

from sailplan.planner.catalog import default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.simulator.ties import shared_users
from sailplan.trainer.model import (
    StageModel,
    build_layer,
    build_shared,
    local_shard,
    param_splits,
)
from sailplan.trainer.tp import TPGroup, shard_range, vocab_parallel_cross_entropy

OPT_350M = ModelSpec(
    name="OPT-350M",
    family="opt",
    hidden_size=1024,
    num_blocks=24,
    num_heads=16,
    vocab_size=50272,
    sequence_length=2048,
)
LLAMA_GQA = ModelSpec(
    name="llama-gqa",
    family="llama",
    hidden_size=2048,
    num_blocks=2,
    num_heads=16,
    num_kv_heads=4,
    ffn_hidden_size=5504,
    vocab_size=32000,
    sequence_length=1024,
    position_embedding="rotary",
    mlp="swiglu",
    norm="rmsnorm",
)


def _decoders() -> list[ModelSpec]:
    catalog = default_catalog()
    named = [catalog.model(name) for name in catalog.model_names()]
    return [s for s in named if s.architecture == "decoder"] + [
        TINY,
        TINY_LLAMA,
        TINY_TIED,
        LLAMA_GQA,
    ]


SHAPES = [
    pytest.param(spec, tp, id=f"{spec.name}-tp{tp}")
    for spec in _decoders()
    for tp in (1, 2, 4, 8)
    if spec.supports_tensor_parallel(tp)
]


@pytest.mark.parametrize(("spec", "tp"), SHAPES)
def test_parameters_per_layer_and_tp_rank_match_the_modelspec(spec: ModelSpec, tp: int) -> None:
    # all blocks have one shape: the embedding, the first block and the head cover every kind
    rows_per_rank = []
    with torch.device("meta"):
        for index in (0, 1, spec.num_layers - 1):
            for rank in range(tp):
                group = TPGroup(rank=rank, size=tp)
                counted = sum(p.numel() for p in build_layer(spec, index, group).parameters())
                expected = spec.layer_parameters(index, tp)
                kind = spec.layer_kind(index)
                vocab_sharded = kind == "embedding" or (kind == "head" and not spec.tied_embeddings)
                if not vocab_sharded or spec.vocab_size % tp == 0:
                    assert counted == expected, (index, rank)
                else:
                    # ModelSpec floors vocab * hidden / tp; a rank really holds the floor or
                    # the ceiling of vocab / tp rows, and all ranks together hold the vocabulary
                    start, end = shard_range(spec.vocab_size, group)
                    exact = (end - start) * spec.hidden_size
                    assert counted - expected == exact - spec.vocab_size * spec.hidden_size // tp
                    if index == 0:
                        rows_per_rank.append(end - start)
    if rows_per_rank:
        assert sum(rows_per_rank) == spec.vocab_size
        assert max(rows_per_rank) - min(rows_per_rank) == 1


def test_vocab_parallel_cross_entropy_matches_torch_on_one_rank() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=generator, requires_grad=True)
    targets = torch.randint(11, (3, 5), generator=generator)
    ours = vocab_parallel_cross_entropy(logits, targets, 0, TPGroup())
    (ours_grad,) = torch.autograd.grad(ours, logits)
    reference = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))
    (reference_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(ours_grad, reference_grad)


def test_initialisation_is_the_same_logical_model_under_any_tp_degree() -> None:
    whole = StageModel(TINY_LLAMA, 1, 2)
    whole.initialise(seed=7)
    for rank in range(2):
        shard = StageModel(TINY_LLAMA, 1, 2, TPGroup(rank=rank, size=2))
        shard.initialise(seed=7)
        splits = param_splits(shard.layers[0])
        full = dict(whole.layers[0].named_parameters())
        for name, param in shard.layers[0].named_parameters():
            expected = local_shard(full[name].detach(), splits[name], TPGroup(rank=rank, size=2))
            assert torch.equal(param.detach(), expected), name
    other_seed = StageModel(TINY_LLAMA, 1, 2)
    other_seed.initialise(seed=8)
    assert not torch.equal(
        other_seed.layers[0].attn.q_proj.weight, whole.layers[0].attn.q_proj.weight
    )


ZOO = [
    pytest.param(spec, tp, id=f"{spec.name}-tp{tp}")
    for spec in (
        TINY_T5,
        TINY_WRN,
        default_catalog().model("T5-Small"),
        default_catalog().model("WideResNet-50-2"),
    )
    for tp in (1, 2)
    if spec.supports_tensor_parallel(tp)
]


@pytest.mark.parametrize(("spec", "tp"), ZOO)
def test_zoo_layers_hold_the_modelspec_s_parameters(spec: ModelSpec, tp: int) -> None:
    # every layer (T5's blocks differ: bias tables, the encoder's final norm, decoder
    # blocks); shared modules a layer only uses are passed in, not counted
    with torch.device("meta"):
        for rank in range(tp):
            group = TPGroup(rank=rank, size=tp)
            shared = {name: build_shared(spec, name, group) for name in shared_users(spec)}
            for index in range(spec.num_layers):
                users = {n for n, u in shared_users(spec).items() if index in u and u[0] != index}
                layer = build_layer(spec, index, group, {n: shared[n] for n in users})
                counted = sum(p.numel() for p in layer.parameters())
                assert counted == spec.layer_parameters(index, tp), (index, rank)


def test_a_t5_stage_copies_the_shared_tables_it_uses_but_does_not_own() -> None:
    # layers 4-5 of TINY_T5: the second decoder block and the head (tied)
    stage = StageModel(TINY_T5, 4, 6)
    assert sorted(stage.copies) == ["decoder_bias", "tokens"]
    stage.initialise(seed=3)
    owner = StageModel(TINY_T5, 0, 4)
    owner.initialise(seed=3)
    assert sorted(owner.copies) == []
    assert torch.equal(stage.copies["tokens"].weight, owner.layers[0].tokens.weight)
    assert torch.equal(stage.copies["decoder_bias"].weight, owner.layers[3].relative_bias.weight)
    # both stages take part in the sums of the two tables they share; the encoder's table
    # is used only by stage 0's layers
    assert [name for name, _ in stage.shared_across_stages()] == ["decoder_bias", "tokens"]
    assert [name for name, _ in owner.shared_across_stages()] == ["decoder_bias", "tokens"]
