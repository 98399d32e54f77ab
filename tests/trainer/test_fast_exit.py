"""A finished rank exits without interpreter finalization, yet loses none of its output.

`exit_without_finalizing` is how `sailplan-train` ends a rank once its last checkpoint is
complete (the seconds of torch/DeepSpeed teardown it skips are in
benchmarks/trainer_stop.py). Here a child process writes to a piped, block-buffered stdout
and registers an atexit handler: the line must arrive, the exit status must be the one
given, and the handler must not run (finalization was skipped).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = """
import atexit, pathlib, sys
from sailplan.trainer.train import exit_without_finalizing
atexit.register(lambda: pathlib.Path(sys.argv[1]).write_text("finalized"))
sys.stdout.write("last progress line")
exit_without_finalizing(3)
"""


def test_output_is_flushed_and_finalization_skipped(tmp_path: Path) -> None:
    marker = tmp_path / "atexit-ran"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 3, child.stderr
    assert child.stdout == "last progress line"
    assert not marker.exists()
