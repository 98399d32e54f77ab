"""Trainer worker processes forked from one server that has imported torch and DeepSpeed.

A fresh `python -m sailplan.trainer.train` spends about 3.5 CPU s importing torch and
DeepSpeed, more than it then spends training the tests' tiny models, and the trainer tests
start a few hundred workers on CI's two cores. Here multiprocessing's forkserver imports
the trainer once (PRELOADED) and forks every worker from it. The worker then runs the same
entry point (`sailplan.trainer.train.main`) under the same environment (the pod contract),
with its stdout a pipe and its stderr a file, as the subprocess did: only the imports are
already done. A worker that fails prints its traceback to that file and exits with 1, as
Python does.

Fresh interpreters are still what the CLI's own tests start (test_train_cli.py,
test_fast_exit.py, test_uneven_split.py's bad-input case), what the e2e tests' pods run
(the local cluster's pod runner), and what the trainer spawns for a TP worker's ranks.

Used by trainer_harness.start_workers and rank_memory.spawn.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import IO

# What a worker imports before it trains: all of it, so that a fork has nothing left to load.
PRELOADED = [
    "torch",
    "torch.distributed",
    "deepspeed",
    "sailplan.trainer.train",
    "sailplan.trainer.engine",
    "sailplan.trainer.zero",
]


def forkserver_context() -> ForkServerContext:
    """multiprocessing's forkserver context, its server preloading PRELOADED (the server is
    one per test process and starts on first use)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    return context


class WorkerProcess:
    """The part of subprocess.Popen's interface that the trainer tests use, over a worker
    forked by the forkserver (not a child of this process: its exit status comes through
    multiprocessing's sentinel)."""

    def __init__(self, process: BaseProcess, stdout: IO[str]) -> None:
        self._process = process
        self.stdout: IO[str] | None = stdout
        self.args = ["sailplan.trainer.train.main"]

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        """All of stdout to its end and the exit status, as Popen.communicate."""
        assert self.stdout is not None
        stdout = self.stdout
        chunks: list[str] = []
        # a thread, so that what readline() has already buffered is read too
        reader = threading.Thread(target=lambda: chunks.append(stdout.read()), daemon=True)
        reader.start()
        reader.join(timeout)
        if reader.is_alive():
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        stdout.close()
        self.wait(timeout)
        return "".join(chunks), None

    def send_signal(self, signum: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_worker(environment: dict[str, str], stderr_path: Path) -> WorkerProcess:
    """Fork one `sailplan-train` worker under `environment` (its whole environment, as
    Popen's env=), stdout a pipe to the returned handle, stderr written to `stderr_path`."""
    context = forkserver_context()
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(
        target=_run_worker, args=(environment, writer, str(stderr_path)), name="sailplan-train"
    )
    process.start()
    writer.close()  # the worker holds its own copy: EOF comes when it (and its children) exit
    stdout = os.fdopen(os.dup(reader.fileno()), "r")
    reader.close()
    return WorkerProcess(process, stdout)


def _run_worker(environment: dict[str, str], stdout: Connection, stderr_path: str) -> None:
    """In the forked worker: the fds and environment a fresh process would have had, then
    the trainer's entry point."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(stdout.fileno(), 1)
    stdout.close()
    errors = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(errors, 2)
    os.close(errors)
    os.environ.clear()
    os.environ.update(environment)
    sys.argv = ["sailplan-train"]
    import torch

    # OpenMP read OMP_NUM_THREADS when the server imported torch, before this environment
    threads = environment.get("OMP_NUM_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    from sailplan.trainer import train

    train.main()
