"""The simulator's model-state memory (planner/simulator/memory.py) against what a rank holds.

Two gloo processes on the CPU build the trainer's stage (StageModel + make_optimizer, i.e.
DeepSpeed's ZeRO optimizer with the trainer's arguments) and train two steps of two
micro-batches. At every point where DeepSpeed allocates or frees (after each backward,
around each bucket reduction and flatten, before the Adam update, after the step) each rank
sums the bytes of the storages it really holds, reached from the parameters (and their
.grad) and from the optimizer's attributes (DeepSpeed's flat buffers, fp32 partition,
grads_in_partition, accumulation buffers, ipg buckets, torch Adam's state), deduplicated
by storage. Meta tensors (DeepSpeed's shape records) hold no memory and are skipped.

The expected numbers are those measurements; the simulator's terms must match them:
weights, fp32 master partition and Adam state exactly up to DeepSpeed's alignment padding
(2 x DP elements per flat buffer), and the peak within what the reduction moves: a
gradient that enters a bucket, or a tensor larger than the bucket that DeepSpeed reduces on
its own, frees its own storage, so the simulator's sum (gradients + buckets) may exceed the
measured peak by the buckets plus one bucket or largest tensor of gradients, and must never
fall short of it by more than a bucket. The bucket is 2**16 elements here (the trainer's 2**24 would be 64 MiB, larger than
the whole test model) so the stage's 660k parameters dominate, as a real model's do.
"""

from __future__ import annotations

import inspect
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.simulator.memory import (
    TRAINER_BUCKET_ELEMENTS,
    TrainingSetup,
    model_state_bytes,
)

pytestmark = pytest.mark.trainer

SPEC = ModelSpec(
    name="memory-probe",
    family="opt",
    hidden_size=128,
    num_blocks=2,
    num_heads=4,
    vocab_size=1024,
    sequence_length=16,
)
REPLICAS = 2
MICRO_BATCHES = 2
BUCKET_ELEMENTS = 2**16
FP32 = 4
# DeepSpeed pads each flat buffer to a multiple of nccl_start_alignment_factor (2) x DP
PADDING_ELEMENTS = 2 * REPLICAS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _storages(obj: Any, out: dict[int, int], visited: set[int]) -> None:
    """Bytes of every storage reachable from obj, keyed by storage address."""
    if id(obj) in visited:
        return
    visited.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.is_meta:
            return
        storage = obj.untyped_storage()
        if storage.nbytes():
            out[storage.data_ptr()] = storage.nbytes()
        if obj.grad is not None:
            _storages(obj.grad, out, visited)
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            _storages(key, out, visited)
            _storages(value, out, visited)
        return
    if isinstance(obj, list | tuple | set):
        for value in obj:
            _storages(value, out, visited)
        return
    if type(obj).__module__.startswith(("deepspeed", "torch.optim", "sailplan")):
        for value in getattr(obj, "__dict__", {}).values():
            _storages(value, out, visited)


def _bytes(*objs: Any) -> int:
    out: dict[int, int] = {}
    _storages(list(objs), out, set())
    return sum(out.values())


def _loss(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """The stage's loss on `tokens` (whole model on one stage): forward(x, targets) or the
    model zoo's forward(state, batch)."""
    if "batch" in inspect.signature(model.forward).parameters:
        loss: torch.Tensor = model(None, {"inputs": tokens, "targets": tokens})
    else:
        loss = model(tokens, tokens)
    return loss


def _replica(rank: int, port: int, zero_stage: int, out: Path) -> None:
    from sailplan.trainer import zero
    from sailplan.trainer.model import StageModel
    from sailplan.trainer.optimizer import make_optimizer
    from sailplan.trainer.tp import TPGroup

    zero.BUCKET_ELEMENTS = BUCKET_ELEMENTS
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=REPLICAS
    )
    try:
        model = StageModel(SPEC, 0, SPEC.num_layers, TPGroup(rank=0, size=1, group=None))
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
            num_micro_batches=MICRO_BATCHES,
        )
        inner = getattr(optimizer, "inner")  # noqa: B009 (DeepSpeedZeroOptimizer)
        peak = {"total": 0, "optimizer_states": 0}
        temporaries: list[Any] = []

        def measure() -> None:
            peak["total"] = max(peak["total"], _bytes(params, optimizer, temporaries))
            states = _bytes(list(inner.optimizer.state.values()))
            peak["optimizer_states"] = max(peak["optimizer_states"], states)

        for name in ("flatten", "reduce_ipg_grads", "_optimizer_step", "get_flat_partition"):
            original = getattr(inner, name)

            def wrapped(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                measure()
                result = _original(*args, **kwargs)
                temporaries.append(result)
                measure()
                temporaries.pop()
                return result

            setattr(inner, name, wrapped)
        inner.optimizer.register_step_pre_hook(lambda *_: measure())
        for step in range(2):
            for micro in range(MICRO_BATCHES):
                generator = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
                tokens = torch.randint(
                    0, SPEC.vocab_size, (2, SPEC.sequence_length), generator=generator
                )
                _loss(model, tokens).backward()
                optimizer.after_backward(micro)
                measure()
            optimizer.step()
            measure()
        report = {
            "parameters": sum(p.numel() for p in params),
            "largest_tensor": max(p.numel() for p in params),
            "weights": _bytes(inner.bit16_groups_flat),
            "master_weights": _bytes([t.detach() for t in inner.single_partition_of_fp32_groups]),
            **peak,
        }
        (out / f"rank-{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def test_the_trainer_bucket_is_the_one_the_simulator_prices() -> None:
    from sailplan.trainer import zero

    assert zero.BUCKET_ELEMENTS == TRAINER_BUCKET_ELEMENTS


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_model_state_terms_match_the_tensors_a_rank_holds(zero_stage: int, tmp_path: Path) -> None:
    mp.start_processes(
        _replica,
        args=(_free_port(), zero_stage, tmp_path),
        nprocs=REPLICAS,
        start_method="spawn",
    )
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(REPLICAS)]
    parameters = reports[0]["parameters"]
    # the simulator's parameter count is the spec's, the trainer's model has exactly that
    assert parameters == sum(SPEC.layer_parameters(i, 1) for i in range(SPEC.num_layers))
    setup = TrainingSetup.trainer(
        zero_stage=1 if zero_stage == 1 else 2, bucket_elements=BUCKET_ELEMENTS
    )
    predicted = model_state_bytes(
        parameters, REPLICAS, setup, "adam", largest_tensor=reports[0]["largest_tensor"]
    )
    bucket = FP32 * BUCKET_ELEMENTS
    padding = FP32 * PADDING_ELEMENTS
    largest = FP32 * reports[0]["largest_tensor"]
    # gradients that left their own storage for a bucket, or one tensor reduced on its own
    moved = predicted.buckets + max(bucket, largest)
    # the premise: model states, not buckets, dominate the peak
    assert predicted.total > 10 * bucket
    for report in reports:
        assert abs(report["weights"] - predicted.weights) <= padding
        assert abs(report["master_weights"] - predicted.master_weights) <= padding
        assert abs(report["optimizer_states"] - predicted.optimizer_states) <= 2 * padding
        # DeepSpeed keeps whole-tensor gradients of the tensors its partition boundary cuts,
        # so one replica may hold up to a tensor less than the other
        assert predicted.total - moved - largest - padding <= report["total"]
        assert report["total"] <= predicted.total + bucket
    # the simulator predicts the stage's largest replica: within what the reduction moves
    peak = max(r["total"] for r in reports)
    assert predicted.total - moved - padding <= peak <= predicted.total + bucket
