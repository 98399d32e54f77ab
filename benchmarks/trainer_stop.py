"""How long a stopping trainer takes to exit once its final checkpoint is complete.

A replan waits for every old worker to exit before the new plan's pods start, so the time
between the final checkpoint's completion marker and the last process exit is added to
every replan. This runs a tiny GPT on 8 local ranks (`sailplan-train` processes, gloo, the
trainer tests' harness), sends SIGTERM to every worker after step `--after`, and measures
from the test's side (polling every 10 ms):

  SIGTERM -> marker     SIGTERM to the final checkpoint's `sailplan-complete.json` existing
  marker -> all exited  the marker to the last worker's exit
  CPU after marker      the most CPU seconds one worker used after the marker (from
                        /proc; what the exit costs without the machine's load)

Medians over `--runs` runs.

    python benchmarks/trainer_stop.py [--runs 3] [--after 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "trainer"))

from trainer_harness import TINY, make_plan, time_stop  # noqa: E402

from sailplan.planner.workerenv import TrainerConfig  # noqa: E402


def one_run(workdir: Path, after: int) -> tuple[float, float, float]:
    plan = make_plan(
        TINY, [(0, 3, 1), (3, 6, 1)], data_parallel=4, micro_batch_size=1, global_batch_size=8
    )
    config = TrainerConfig(
        steps=10_000,
        learning_rate=1e-3,
        checkpoint_dir=str(workdir / "ckpt"),
        checkpoint_interval_steps=10_000,
    )
    timing = time_stop(plan, config, workdir, after)
    if any(timing.returncodes):
        raise SystemExit(f"workers exited with {timing.returncodes}")
    cpu = max(timing.cpu_after_marker_s) if timing.cpu_after_marker_s else float("nan")
    return timing.to_marker_s, timing.marker_to_exit_s, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--after", type=int, default=2, help="SIGTERM after this step")
    args = parser.parse_args()
    results = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="sailplan-stop-") as directory:
            results.append(one_run(Path(directory) / f"run-{run}", args.after))
    table = Table(title=f"trainer stop, 8 ranks (PP 2 x DP 4), median of {args.runs}")
    table.add_column("SIGTERM -> marker (s)", justify="right")
    table.add_column("marker -> all exited (s)", justify="right")
    table.add_column("CPU per rank after marker, max (s)", justify="right")
    table.add_column("runs (marker -> exited)", justify="right")
    table.add_row(
        f"{statistics.median(r[0] for r in results):.2f}",
        f"{statistics.median(r[1] for r in results):.2f}",
        f"{statistics.median(r[2] for r in results):.2f}",
        ", ".join(f"{r[1]:.2f}" for r in results),
    )
    Console().print(table)


if __name__ == "__main__":
    main()
