"""The simulator's picture of the trainer's shared parameters and gradient buckets is the
trainer's own.

The planner cannot import the trainer, so planner/simulator/ties.py mirrors which layers
share a parameter and which stage keeps a copy, and simulator/memory.py mirrors the
trainer's bucket sizes; these tests build the trainer's real modules (on the meta device,
no memory) and its real bucketing, and check the mirrors agree.
"""

from __future__ import annotations

import pytest
import torch
from trainer_harness import TINY, TINY_T5, TINY_TIED

from sailplan.planner.catalog import default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.simulator import ties
from sailplan.planner.simulator.collectives import bucket_count
from sailplan.planner.simulator.memory import REPLICATED_BUCKET_BYTES, TRAINER_BUCKET_ELEMENTS
from sailplan.trainer import grads, zero
from sailplan.trainer.model import StageModel
from sailplan.trainer.tp import TPGroup

CATALOG = default_catalog()


def _splits(spec: ModelSpec) -> list[tuple[int, int]]:
    n = spec.num_layers
    return [(a, b) for a in range(n) for b in range(a + 1, n + 1)]


@pytest.mark.parametrize(("spec", "tp"), [(TINY, 1), (TINY_TIED, 1), (TINY_T5, 1), (TINY_T5, 2)])
def test_a_stage_s_copies_are_the_parameters_the_simulator_adds_to_it(
    spec: ModelSpec, tp: int
) -> None:
    # every layer range a stage can hold: the trainer's copies of shared modules (their
    # parameters on one TP rank) against ties.copy_parameters and the search's matrix
    matrix = ties.copy_parameter_matrix(spec, tp)
    with torch.device("meta"):
        for a, b in _splits(spec):
            stage = StageModel(spec, a, b, TPGroup(rank=0, size=tp))
            held = sum(p.numel() for p in stage.copies.parameters())
            assert held == ties.copy_parameters(spec, a, b, tp), (a, b)
            assert matrix[a, b] == held, (a, b)
            # the stages the trainer syncs a shared gradient with are the ones that use it
            synced = {name for name, _ in stage.shared_across_stages()}
            for name, users in ties.shared_users(spec).items():
                if name in synced:
                    assert any(a <= u < b for u in users)


def test_the_simulator_s_buckets_are_the_trainer_s() -> None:
    assert grads.DEFAULT_BUCKET_BYTES == REPLICATED_BUCKET_BYTES
    assert zero.BUCKET_ELEMENTS == TRAINER_BUCKET_ELEMENTS


@pytest.mark.parametrize(("tensors", "mib"), [(40, 1), (25, 1), (26, 1), (7, 3), (1, 2)])
def test_the_trainer_issues_as_many_collectives_as_the_simulator_prices(
    tensors: int, mib: int
) -> None:
    # tensors small against the 25 MiB bucket: grads.buckets packs them greedily
    with torch.device("meta"):
        params = [
            torch.nn.Parameter(torch.empty(mib * 2**18, dtype=torch.float32))
            for _ in range(tensors)
        ]
    trainer = len(grads.buckets(params, grads.DEFAULT_BUCKET_BYTES))
    nbytes = tensors * mib * 2**20
    assert bucket_count(nbytes, REPLICATED_BUCKET_BYTES) == trainer
