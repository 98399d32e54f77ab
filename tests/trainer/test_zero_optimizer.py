"""ZeRO's optimizer state is an even share per replica, also on an embedding-heavy stage.

A stage of two layers (a 1024-token embedding and one block) where the embedding holds
most of the parameters: giving whole tensors to replicas (the trainer's former ZeRO-1) had
to leave one replica with the embedding's moments, more than half of the stage's. DeepSpeed
partitions the flattened parameters, so each of two replicas holds half, up to the
alignment padding DeepSpeed adds so the partitions divide evenly. Two gloo processes on the
CPU, one optimizer step each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from rank_memory import REPLICAS, join, leave, spawn, stage, write_report

from sailplan.planner.modelspec import ModelSpec

pytestmark = pytest.mark.trainer

EMBEDDING_HEAVY = ModelSpec(
    name="embedding-heavy",
    family="opt",
    hidden_size=32,
    num_blocks=2,
    num_heads=4,
    vocab_size=1024,
    sequence_length=16,
)
ADAM_MOMENTS = 2
FP32 = 4


def _replica(rank: int, port: int, zero_stage: int, out: Path) -> None:

    join(rank, port)
    try:
        model, params, optimizer = stage(
            EMBEDDING_HEAVY, (0, 2), zero_stage=zero_stage, micro_batches=1, bucket_elements=None
        )
        tokens = torch.randint(
            0, EMBEDDING_HEAVY.vocab_size, (2, 16), generator=torch.Generator().manual_seed(rank)
        )
        (hidden,) = model(None, {"inputs": tokens})
        hidden.square().mean().backward()
        optimizer.after_backward(0)
        optimizer.step()
        write_report(
            out,
            rank,
            {
                "type": type(optimizer).__name__,
                "state_bytes": optimizer.state_bytes(),
                "param_numels": [p.numel() for p in params],
            },
        )
    finally:
        leave()


def _run(zero_stage: int, tmp_path: Path) -> list[dict[str, Any]]:
    return spawn(_replica, tmp_path, zero_stage)


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_each_replica_holds_an_even_share_of_the_adam_state(
    zero_stage: int, tmp_path: Path
) -> None:
    reports = _run(zero_stage, tmp_path)
    assert {r["type"] for r in reports} == {"ZeroOptimizer"}
    numels = reports[0]["param_numels"]
    assert isinstance(numels, list)
    total = sum(numels) * ADAM_MOMENTS * FP32
    # the premise: one tensor (the embedding) holds more than half the stage's state, so
    # whole-tensor ownership could not have been even
    assert max(numels) * ADAM_MOMENTS * FP32 > total / REPLICAS
    # DeepSpeed pads the flat buffer to a multiple of 2 * replicas elements
    padding = 2 * REPLICAS * ADAM_MOMENTS * FP32
    for report in reports:
        assert total / REPLICAS <= report["state_bytes"] <= total / REPLICAS + padding


def test_zero_stage_0_keeps_the_whole_state_on_every_replica(tmp_path: Path) -> None:
    reports = _run(0, tmp_path)
    numels = reports[0]["param_numels"]
    assert isinstance(numels, list)
    assert [r["state_bytes"] for r in reports] == [sum(numels) * ADAM_MOMENTS * FP32] * REPLICAS
