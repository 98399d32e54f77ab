"""ZeRO's optimizer state is an even share per replica, also on an embedding-heavy stage.

A stage of two layers (a 1024-token embedding and one block) where the embedding holds
most of the parameters: giving whole tensors to replicas (the trainer's former ZeRO-1) had
to leave one replica with the embedding's moments, more than half of the stage's. DeepSpeed
partitions the flattened parameters, so each of two replicas holds half, up to the
alignment padding DeepSpeed adds so the partitions divide evenly. Two gloo processes on the
CPU, one optimizer step each.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sailplan.planner.modelspec import ModelSpec
from sailplan.trainer.model import StageModel
from sailplan.trainer.optimizer import make_optimizer
from sailplan.trainer.tp import TPGroup

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
REPLICAS = 2
ADAM_MOMENTS = 2
FP32 = 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _replica(rank: int, port: int, zero_stage: int, out: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=REPLICAS
    )
    try:
        model = StageModel(EMBEDDING_HEAVY, 0, 2, TPGroup(rank=0, size=1, group=None))
        model.initialise(seed=1)
        params = list(model.parameters())
        optimizer = make_optimizer(
            params,
            kind="adam",
            lr=1e-3,
            zero_stage=zero_stage,
            dp_group=dist.new_group(list(range(REPLICAS))),
            dp_size=REPLICAS,
            tp_group=None,
            num_micro_batches=1,
        )
        tokens = torch.randint(
            0, EMBEDDING_HEAVY.vocab_size, (2, 16), generator=torch.Generator().manual_seed(rank)
        )
        (hidden,) = model(None, {"inputs": tokens})
        hidden.square().mean().backward()
        optimizer.after_backward(0)
        optimizer.step()
        report = {
            "type": type(optimizer).__name__,
            "state_bytes": optimizer.state_bytes(),
            "param_numels": [p.numel() for p in params],
        }
        (out / f"rank-{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def _run(zero_stage: int, tmp_path: Path) -> list[dict[str, object]]:
    mp.start_processes(
        _replica,
        args=(_free_port(), zero_stage, tmp_path),
        nprocs=REPLICAS,
        start_method="spawn",
    )
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(REPLICAS)]


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
