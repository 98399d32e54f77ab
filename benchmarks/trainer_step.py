"""Trainer step time against plain single-process torch for the same model (CPU, gloo).

Rows: a plain torch loop (forward/backward per micro-batch, Adam step) on the whole model in
this process; then whole `sailplan-train` worker processes under several plans, timed from
rank 0's JSON step lines (median over the steps after warm-up; the step time includes the
schedule, the DP all-reduce, the optimizer and the per-step stop/loss all-reduce). With one
thread per process on a 2-core machine the multi-process rows show overhead and the little
parallelism 2 cores allow, not what GPUs would gain.

    python benchmarks/trainer_step.py [--steps 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "trainer"))

from trainer_harness import make_plan, run_plan  # noqa: E402

from sailplan.planner.modelspec import ModelSpec  # noqa: E402
from sailplan.planner.workerenv import TrainerConfig  # noqa: E402
from sailplan.trainer.data import SyntheticTokens, micro_batch  # noqa: E402
from sailplan.trainer.model import StageModel  # noqa: E402

SPEC = ModelSpec(
    name="bench-gpt",
    family="opt",
    hidden_size=256,
    num_blocks=4,
    num_heads=8,
    vocab_size=4096,
    sequence_length=128,
)
GLOBAL_BATCH = 16
MICRO = 4
WARMUP = 2


def plain_torch(steps: int) -> float:
    torch.manual_seed(0)
    model = StageModel(SPEC, 0, SPEC.num_layers)
    model.initialise(seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    source = SyntheticTokens(SPEC.vocab_size, SPEC.sequence_length, 0)
    micros = GLOBAL_BATCH // MICRO
    times = []
    for step in range(steps):
        began = time.perf_counter()
        for m in range(micros):
            inputs, targets = micro_batch(
                source,
                step=step,
                replica=0,
                micro=m,
                micro_batch_size=MICRO,
                num_micro_batches=micros,
                global_batch_size=GLOBAL_BATCH,
            )
            loss = model(None, {"inputs": inputs, "targets": targets})
            assert isinstance(loss, torch.Tensor)
            (loss / micros).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - began)
    return statistics.median(times[WARMUP:])


def engine(splits: list[tuple[int, int, int]], dp: int, steps: int) -> tuple[int, float]:
    plan = make_plan(
        SPEC, splits, data_parallel=dp, micro_batch_size=MICRO, global_batch_size=GLOBAL_BATCH
    )
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainerConfig(
            steps=steps,
            learning_rate=1e-3,
            checkpoint_dir=f"{tmp}/ckpt",
            checkpoint_interval_steps=10_000,
        )
        run = run_plan(plan, config, Path(tmp), timeout_s=600)
    seconds = [e["step_seconds"] for e in run.events if e["event"] == "step"]
    return plan.world_size, statistics.median(seconds[WARMUP:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: list[tuple[str, int, float]] = [("plain torch, 1 process", 1, plain_torch(args.steps))]
    layers = SPEC.num_layers
    for name, splits, dp in [
        ("sailplan-train, 1 stage", [(0, layers, 1)], 1),
        ("sailplan-train, 2 stages (2|4 layers)", [(0, 2, 1), (2, layers, 1)], 1),
        ("sailplan-train, 1 stage TP 2", [(0, layers, 2)], 1),
        ("sailplan-train, 1 stage DP 2", [(0, layers, 1)], 2),
    ]:
        world, seconds = engine(splits, dp, args.steps)
        rows.append((name, world, seconds))
    base = rows[0][2]
    print(
        f"model {SPEC.name}: h={SPEC.hidden_size} blocks={SPEC.num_blocks} seq={SPEC.sequence_length} "
        f"vocab={SPEC.vocab_size}; global batch {GLOBAL_BATCH}, micro-batch {MICRO}; "
        f"1 thread per process, {torch.get_num_threads()} here"
    )
    print(f"{'configuration':<40} {'procs':>5} {'step ms':>9} {'samples/s':>10} {'vs plain':>9}")
    for name, world, seconds in rows:
        print(
            f"{name:<40} {world:>5} {seconds * 1e3:>9.1f} {GLOBAL_BATCH / seconds:>10.1f} "
            f"{seconds / base:>8.2f}x"
        )


if __name__ == "__main__":
    main()
