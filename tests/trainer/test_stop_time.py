"""A stopped trainer's processes are gone within seconds of their final checkpoint.

A replan starts the new plan's pods only once every old worker has exited, so the time from
the final checkpoint's completion marker to the last process exit is added to every replan.
Here SIGTERM goes to both workers of a DP 2 plan under ZeRO-1 (DeepSpeed imported in every
rank, as in production) and the test measures from outside (trainer_harness.time_stop, the
measurement of benchmarks/trainer_stop.py) the marker to the last exit, and the CPU time
each rank spends after the marker.

What it guards against is interpreter finalization after the checkpoint, which tore down
torch's and DeepSpeed's module graph with no system call in between. Measured on this plan
on the shared 2-core machine at load average 9-10, with `exit_without_finalizing` replaced
by a plain `sys.exit` (3 runs) and with it (5 runs):

                           marker -> last exit    CPU per rank after the marker
  interpreter finalization      3.4-6.2 s               1.6-1.9 s
  exit_without_finalizing      0.14-1.2 s              0.03-0.07 s

(the benchmark's 8 ranks: 10.1 s against 0.57 s). Two bounds:

- CPU_BOUND_S = 0.5 s per rank does not depend on the machine's load: 7x what the fast exit
  used, under a third of the teardown's CPU, which no scheduling can shrink;
- WALL_BOUND_S = 5 s is the replan budget this is about; it catches waits that use no CPU
  (a thread joined, a collective left hanging), and is 4x the slowest fast exit seen at
  load 10 so a loaded CI machine does not trip it. On an idle machine the teardown would
  pass it (its 1.8 CPU s per rank run in parallel on two cores): the CPU bound catches that.

The issue's 2 s target is what the benchmark shows on 8 ranks, not asserted under CI load.
The test takes 15-35 s at load 9-10, nearly all of it the two ranks starting (torch and
DeepSpeed imports, rendezvous) and reaching step 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_harness import TINY, make_plan, time_stop

from sailplan.planner.workerenv import TrainerConfig

pytestmark = pytest.mark.trainer

WALL_BOUND_S = 5.0
CPU_BOUND_S = 0.5


def test_last_process_exits_within_seconds_of_the_final_checkpoint(tmp_path: Path) -> None:
    plan = make_plan(TINY, [(0, 6, 1)], data_parallel=2, micro_batch_size=1, global_batch_size=8)
    config = TrainerConfig(
        steps=10_000,
        learning_rate=1e-3,
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_interval_steps=10_000,
        zero_stage=1,
    )
    timing = time_stop(plan, config, tmp_path, after=1)
    assert timing.returncodes == [0, 0]
    assert timing.marker_to_exit_s < WALL_BOUND_S, timing
    if timing.cpu_after_marker_s is None:
        pytest.skip("no /proc to read the ranks' CPU time from (Linux only); wall time checked")
    assert max(timing.cpu_after_marker_s) < CPU_BOUND_S, timing
