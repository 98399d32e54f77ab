"""Parameters several pipeline stages use (tied embeddings), as the trainer runs them.

A model whose output head multiplies by the token embedding (`ModelSpec.tied_embeddings`:
GPT-2/GPT-3, GPT-Neo, T5 in the catalog; not OPT, whose Megatron-DeepSpeed layout the
Sailor runs used keeps a separate head), and T5's position-bias tables, have parameters
that layers on different stages use. The trainer (sailplan.trainer.model) gives each such
parameter to its first user and every other stage that uses it keeps a copy; every step,
after the pipeline flush and before the optimizer step, `engine.sync_shared_gradients`
sums the copies' gradients: TP rank 0 of each user stage gathers the full gradient from
its TP group, the TP roots of one pipeline all-reduce it, and each broadcasts it back into
its TP group (Megatron's embedding all-reduce, DeepSpeed's tied layers).

This module says which parameters are shared, how large each is, and which layer ranges
hold a copy; costs.CostModel prices the copies' memory and gradients (a copy is a
parameter of its stage: weights, gradients, optimizer states, and in the data-parallel
all-reduce) and the cross-stage all-reduce; simulate() puts that all-reduce in the tail of
the stages that take part. `shared_users` is the rule the trainer's StageModel follows too
(it imports it from here), so the two cannot disagree; tests/trainer/
test_shared_gradient_cost.py checks the copies the trainer builds against this module's
counts. Pure.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sailplan.planner.modelspec import ModelSpec

FloatMatrix = npt.NDArray[np.float64]


def shared_users(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Shared parameter -> the layers that use it, owner first (sailplan.trainer.model
    builds its stages by it)."""
    last = spec.num_layers - 1
    if spec.architecture == "encoder-decoder":
        decoder = spec.first_decoder_layer
        tokens = (0, decoder, last) if spec.tied_embeddings else (0, decoder)
        return {
            "tokens": tokens,
            "encoder_bias": tuple(range(1, decoder)),
            "decoder_bias": tuple(range(decoder, last)),
        }
    if spec.is_transformer and spec.tied_embeddings:
        return {"tokens": (0, last)}
    return {}


def shared_elements(spec: ModelSpec, name: str, tp: int = 1) -> int:
    """Elements of a shared parameter on one rank of a TP group (tp=1: the whole tensor,
    what the cross-stage all-reduce moves): the token matrix is vocabulary-parallel, a
    position-bias table is split over heads."""
    if name == "tokens":
        return spec.vocab_size * spec.hidden_size // tp
    return spec.relative_attention_buckets * spec.num_heads // tp


def copy_parameters(spec: ModelSpec, a: int, b: int, tp: int) -> int:
    """Parameters per TP rank of the copies a stage holding layers [a, b) keeps: each
    shared parameter one of its layers uses whose owner (first user) is outside it."""
    total = 0
    for name, users in shared_users(spec).items():
        if not a <= users[0] < b and any(a <= u < b for u in users):
            total += shared_elements(spec, name, tp)
    return total


def copy_parameter_matrix(spec: ModelSpec, tp: int) -> FloatMatrix:
    """copy_parameters for every layer range at once: M[a, b] for a < b (the search's form)."""
    n = spec.num_layers + 1
    a = np.arange(n)[:, None]
    b = np.arange(n)[None, :]
    matrix = np.zeros((n, n), dtype=np.float64)
    for name, users in shared_users(spec).items():
        owner = users[0]
        holds_owner = (a <= owner) & (owner < b)
        uses = np.zeros((n, n), dtype=bool)
        for u in users:
            uses |= (a <= u) & (u < b)
        matrix += np.where(uses & ~holds_owner, float(shared_elements(spec, name, tp)), 0.0)
    return matrix


def sharing_stages(spec: ModelSpec, ranges: list[tuple[int, int]]) -> list[tuple[str, list[int]]]:
    """Per shared parameter used on two or more stages (given as their layer ranges), in
    name order as the trainer syncs them: the indices of the stages that use it."""
    found: list[tuple[str, list[int]]] = []
    for name, users in sorted(shared_users(spec).items()):
        stages = [i for i, (a, b) in enumerate(ranges) if any(a <= u < b for u in users)]
        if len(stages) >= 2:
            found.append((name, stages))
    return found
