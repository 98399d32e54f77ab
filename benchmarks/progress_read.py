"""What one round of the operator's progress reader costs as running jobs grow.

Every `--progress-seconds` the operator GETs each running job's rank 0 metrics page
(sailplan.operator.controller.progress). This starts N of the trainer's own metrics
servers (sailplan.trainer.progress.Metrics, one per simulated rank 0) in a separate
process, lists N pods pointing at them, and times `ProgressReader.read_once` (a fetch in
one thread per pod, parse, keep) here: the wall time of a round and this process's CPU
time, i.e. the operator's. Median over `--rounds` rounds after a warm-up round (which
takes every first reading). The LIST itself is not timed (a stand-in returns the pods).

    python benchmarks/progress_read.py [--jobs 1,10,100,300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from sailplan.operator.controller.progress import ProgressReader

# The trainers' side: N metrics servers at step 1, their ports on stdout, until stdin closes.
SERVERS = """
import socket, sys
from sailplan.planner.workerenv import METRIC_LOSS, METRIC_SAMPLES_PER_SECOND, METRIC_STEP
from sailplan.trainer.progress import Metrics
ports = []
while len(ports) < int(sys.argv[1]):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        metrics = Metrics(port)
    except OSError:  # taken again meanwhile: another one
        continue
    metrics.set({METRIC_STEP: 1.0, METRIC_LOSS: 2.0, METRIC_SAMPLES_PER_SECOND: 100.0})
    ports.append(port)
print(*ports, flush=True)
sys.stdin.read()
"""


def pod(index: int, port: int) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": f"uid-{index}",
            "namespace": "bench",
            "labels": {"sailplan.dev/job": f"job-{index}"},
        },
        "spec": {
            "containers": [
                {"name": "trainer", "ports": [{"name": "metrics", "containerPort": port}]}
            ]
        },
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    }


def measure(jobs: int, rounds: int) -> tuple[float, float]:
    servers = subprocess.Popen(
        [sys.executable, "-c", SERVERS, str(jobs)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert servers.stdout is not None
    ports = [int(port) for port in servers.stdout.readline().split()]
    pods = [pod(index, port) for index, port in enumerate(ports)]
    reader = ProgressReader(
        list_pods=lambda _selector: pods,
        managed=lambda: {("bench", f"job-{i}") for i in range(jobs)},
        changed=lambda _key: None,
    )
    walls, cpus = [], []
    try:
        for round_ in range(rounds + 1):
            wall, cpu = time.perf_counter(), time.process_time()
            asyncio.run(reader.read_once())
            if round_ > 0:  # round 0 is the warm-up
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
            assert len(reader.readings) == jobs and not reader.failures, reader.failures
    finally:
        assert servers.stdin is not None
        servers.stdin.close()
        servers.wait()
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="1,10,100,300")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    table = Table(title="one progress-reading round (median)")
    for column in ("running jobs", "wall ms", "operator CPU ms", "CPU ms per job"):
        table.add_column(column, justify="right")
    for jobs in (int(n) for n in args.jobs.split(",")):
        wall, cpu = measure(jobs, args.rounds)
        table.add_row(str(jobs), f"{wall * 1e3:.1f}", f"{cpu * 1e3:.1f}", f"{cpu * 1e3 / jobs:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
