"""benchmarks/gpu_check.py refuses to run where it cannot, in one line with exit status 2.

The check itself needs an NVIDIA GPU (docs/architecture/trainer.md, "On a GPU"); what runs
here is its refusal: with CUDA hidden (CUDA_VISIBLE_DEVICES empty, so this holds on a GPU
machine too) it must say so in one line on stderr, print nothing else, and write no table
file that could be taken for a result; a bad argument is refused the same way before
anything is imported or measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )


def test_without_a_cuda_device_it_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "table.md"
    done = _run(tmp_path, "--out", str(out))
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("gpu_check: no CUDA device")
    assert not out.exists()


def test_a_bad_argument_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _run(tmp_path, "--out", str(tmp_path / "t.md"), "--micro-batches", "1")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "gpu_check: --micro-batches must be at least 2 (several micro-batches per step)"
    ]
