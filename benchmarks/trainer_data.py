"""Data path throughput (token file over fsspec) against the trainer's step rate (CPU).

Rows: one replica's StepBatches reading the global batch of benchmarks/trainer_step.py's
model (seq 128, vocab 4096 -> uint16 tokens, 16 samples per step) from a 64 MB token file,
on a local path, on memory:// and, with --gcs, at a gs:// URL served by a GCS emulator on
loopback (fake-gcs-server, sailplan_dev.gcs_emulator: real gcsfs ranged HTTP requests, no
network latency), with prefetch 0 (reads on the consumer's thread) and 2 (the default). A
consumer that does no compute measures how fast the data path alone can
feed steps; the last row is the plain-torch single-process step rate of the same model
(the fastest consumer trainer_step.py measures), so a data row far above it means data
loading is not the bottleneck.

    python benchmarks/trainer_data.py [--steps 400] [--gcs]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import fsspec
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "trainer"))

from trainer_harness import make_plan  # noqa: E402
from trainer_step import GLOBAL_BATCH, MICRO, SPEC, plain_torch  # noqa: E402

from sailplan.planner.workerenv import DataConfig  # noqa: E402
from sailplan.trainer.data import StepBatches, make_source  # noqa: E402
from sailplan_dev import gcs_emulator  # noqa: E402

TOKENS = 32 << 20  # 64 MB of uint16: far more windows than the steps read, so no cache reuse


def data_rate(url: str, depth: int, steps: int) -> float:
    plan = make_plan(
        SPEC,
        [(0, SPEC.num_layers, 1)],
        data_parallel=1,
        micro_batch_size=MICRO,
        global_batch_size=GLOBAL_BATCH,
    )
    source = make_source(
        DataConfig(kind="token-file", path=url, seed=0), SPEC.vocab_size, SPEC.sequence_length
    )
    began = time.perf_counter()
    batches = StepBatches(source, plan, 0, first=0, last=steps, depth=depth)
    for step in range(steps):
        batches.step(step)
    batches.close()
    return steps * GLOBAL_BATCH / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument(
        "--gcs", action="store_true", help="also read gs:// from a local GCS emulator"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokens = np.random.Generator(np.random.PCG64(0)).integers(
        SPEC.vocab_size, size=TOKENS, dtype=np.uint16
    )
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        local = f"{tmp}/tokens.bin"
        tokens.tofile(local)
        fsspec.filesystem("memory").pipe("/bench/tokens.bin", tokens.tobytes())
        urls = [("local file", local), ("memory://", "memory:///bench/tokens.bin")]
        if args.gcs:
            emulator = stack.enter_context(gcs_emulator.running(Path(tmp) / "gcs.log"))
            # what a worker's environment carries (gcsfs is imported after this), and
            # fsspec's gs:// defaults, which it read from the environment at import
            os.environ.update(emulator.env())
            fsspec.config.conf["gcs"] = emulator.storage_options()
            fs = emulator.filesystem()
            fs.mkdir("bench")
            fs.pipe("bench/tokens.bin", tokens.tobytes())
            urls.append(("gs:// (emulator on loopback)", "gs://bench/tokens.bin"))
        for name, url in urls:
            for depth in (0, 2):
                rows.append((f"{name}, prefetch {depth}", data_rate(url, depth, args.steps)))
    step_s = plain_torch(12)
    rows.append(("trainer step rate (plain torch, 1 process)", GLOBAL_BATCH / step_s))
    trainer = rows[-1][1]
    print(
        f"model {SPEC.name}: seq={SPEC.sequence_length} vocab={SPEC.vocab_size}; "
        f"{GLOBAL_BATCH} samples per step; {args.steps} steps of data"
    )
    print(f"{'data path':<44} {'samples/s':>10} {'vs trainer':>11}")
    for name, rate in rows:
        print(f"{name:<44} {rate:>10.0f} {rate / trainer:>10.1f}x")


if __name__ == "__main__":
    main()
