"""Run a plan the way the e2e harness runs pods: one `sailplan-train` process per worker.

The workers are forked from a server that has imported the trainer once (forked_workers.py:
the same entry point and environment as `python -m sailplan.trainer.train`, without its
3.5 CPU s of imports per process). Each worker gets its own environment (the operator's pod
contract from sailplan.planner.workerenv), the world rendezvous is on 127.0.0.1 at a free port, and rank
0's stdout JSON lines are parsed into per-step losses. Shared by the trainer tests and the
trainer benchmarks.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from forked_workers import WorkerProcess, start_worker

from sailplan.planner import workerenv as env
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.workerenv import TrainerConfig

# a worker process: forked (forked_workers.py) or a fresh interpreter
Worker = WorkerProcess | subprocess.Popen[str]

# what a pod runs: the trainer's entry point in a fresh interpreter
FRESH_TRAINER = [sys.executable, "-m", "sailplan.trainer.train"]


def run_fresh(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """FRESH_TRAINER under `environment` (all of it, as Popen's env=) to its exit within
    120 s, stdout and stderr captured: how the CLI's tests run one worker."""
    return subprocess.run(
        FRESH_TRAINER, env=environment, capture_output=True, text=True, timeout=120, check=False
    )


TINY = ModelSpec(
    name="tiny-gpt",
    family="opt",
    hidden_size=32,
    num_blocks=4,
    num_heads=4,
    vocab_size=64,
    sequence_length=16,
)

# GPT-3 style: tied input/output embeddings, and a vocabulary (63) that TP 2 cannot split
# evenly, like GPT-2's 50257
TINY_TIED = ModelSpec(
    name="tiny-tied",
    family="gpt3",
    hidden_size=32,
    num_blocks=3,
    num_heads=4,
    vocab_size=63,
    sequence_length=16,
    tied_embeddings=True,
)

TINY_LLAMA = ModelSpec(
    name="tiny-llama",
    family="llama",
    hidden_size=32,
    num_blocks=2,
    num_heads=4,
    num_kv_heads=2,
    ffn_hidden_size=48,
    vocab_size=64,
    sequence_length=16,
    position_embedding="rotary",
    mlp="swiglu",
    norm="rmsnorm",
)


def make_plan(
    model: ModelSpec,
    splits: list[tuple[int, int, int]],
    data_parallel: int,
    micro_batch_size: int,
    global_batch_size: int,
) -> Plan:
    """Stages from (layer_start, layer_end, tensor_parallel) with `data_parallel` replicas each."""
    micro = global_batch_size // (micro_batch_size * data_parallel)
    replicas = tuple(
        Replica(pool=f"pool-{r}", gpu_type="CPU", zone="local-a") for r in range(data_parallel)
    )
    return Plan(
        model=model,
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        num_micro_batches=micro,
        stages=tuple(
            Stage(layer_start=a, layer_end=b, tensor_parallel=tp, replicas=replicas)
            for a, b, tp in splits
        ),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Run:
    returncodes: list[int]
    events: list[dict[str, Any]]

    @property
    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.events if e["event"] == "step"}

    def event(self, kind: str) -> dict[str, Any]:
        return next(e for e in self.events if e["event"] == kind)


def start_workers(
    plan: Plan,
    config: TrainerConfig,
    workdir: Path,
    generation: int = 0,
    podinfo_dir: Path | None = None,
    *,
    fresh_interpreters: bool = False,
) -> list[Worker]:
    """One process per worker of `plan`: forked from the preloaded server, or with
    `fresh_interpreters` a new `python -m sailplan.trainer.train` each (on a GPU: the
    server's imports may have initialised CUDA, which a forked child cannot use)."""
    workdir.mkdir(parents=True, exist_ok=True)
    plan_path = workdir / f"plan-{generation}.json"
    config_path = workdir / f"trainer-{generation}.json"
    plan_path.write_text(plan.to_json())
    config_path.write_text(config.model_dump_json())
    port = free_port()
    processes: list[Worker] = []
    for worker in plan.workers():
        worker_env = {
            **os.environ,
            env.PLAN_PATH: str(plan_path),
            env.TRAINER_CONFIG_PATH: str(config_path),
            env.WORKER_INDEX: str(worker.index),
            env.PLAN_GENERATION: str(generation),
            env.MASTER_ADDR: "127.0.0.1",
            env.MASTER_PORT: str(port),
            env.WORLD_SIZE: str(plan.world_size),
            "SAILPLAN_METRICS_PORT": "0",
            "SAILPLAN_COLLECTIVE_TIMEOUT_S": "120",
            "OMP_NUM_THREADS": "1",
        }
        if podinfo_dir is not None:
            worker_env[env.PODINFO_DIR] = str(podinfo_dir)
        # stderr goes to a file: a pipe nobody drains while another worker is being waited
        # for could fill up and block that worker inside a collective
        errors_path = workdir / f"worker-{generation}-{worker.index}.err"
        if not fresh_interpreters:
            processes.append(start_worker(worker_env, errors_path))
            continue
        with errors_path.open("w") as errors:
            processes.append(
                subprocess.Popen(
                    FRESH_TRAINER,
                    env=worker_env,
                    stdout=subprocess.PIPE,
                    stderr=errors,
                    text=True,
                )
            )
    return processes


def finish(processes: list[Worker], timeout_s: float = 240) -> Run:
    deadline = time.monotonic() + timeout_s
    outputs: list[str] = []
    for process in processes:
        try:
            out, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
        outputs.append(out)
    events = [json.loads(line) for line in outputs[0].splitlines() if line.startswith("{")]
    return Run(returncodes=[p.returncode for p in processes], events=events)


def run_plan(
    plan: Plan,
    config: TrainerConfig,
    workdir: Path,
    generation: int = 0,
    timeout_s: float = 240,
    *,
    fresh_interpreters: bool = False,
) -> Run:
    workers = start_workers(
        plan, config, workdir, generation, fresh_interpreters=fresh_interpreters
    )
    run = finish(workers, timeout_s)
    if any(run.returncodes):
        errors = [p.read_text() for p in sorted(workdir.glob(f"worker-{generation}-*.err"))]
        raise AssertionError(f"workers failed {run.returncodes}:\n" + "\n".join(errors))
    return run


def trainer_config(
    tmp: Path,
    steps: int,
    *,
    zero_stage: Literal[0, 1, 2] = 1,
    learning_rate: float = 1e-3,
) -> TrainerConfig:
    """The loss-equivalence tests' config: `steps` steps, checkpoints under `tmp` only at
    the end (interval 100)."""
    return TrainerConfig(
        steps=steps,
        learning_rate=learning_rate,
        checkpoint_dir=str(tmp / "ckpt"),
        checkpoint_interval_steps=100,
        zero_stage=zero_stage,
    )


def step_losses(plan: Plan, config: TrainerConfig, tmp: Path) -> list[float]:
    """Rank 0's loss of every step 1..config.steps of `plan`, in order (all must be there)."""
    losses = run_plan(plan, config, tmp).losses
    assert sorted(losses) == list(range(1, config.steps + 1))
    return [losses[s] for s in range(1, config.steps + 1)]


def plan_losses(
    spec: ModelSpec,
    splits: list[tuple[int, int, int]],
    *,
    dp: int,
    mbs: int,
    tmp: Path,
    steps: int,
    zero_stage: Literal[0, 1, 2] = 1,
) -> list[float]:
    """Per-step losses of `steps` steps (global batch 8, Adam at 1e-3) under the plan of
    `splits` with `dp` replicas: what the loss-equivalence tests compare."""
    plan = make_plan(spec, splits, data_parallel=dp, micro_batch_size=mbs, global_batch_size=8)
    return step_losses(plan, trainer_config(tmp, steps, zero_stage=zero_stage), tmp)


def wait_for_step(process: Worker, step: int, timeout_s: float = 120) -> list[str]:
    """Read rank 0's stdout until it reports `step`; returns the lines read."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("{"):
            event = json.loads(line)
            if event["event"] == "step" and event["step"] >= step:
                return lines
    raise AssertionError(f"rank 0 never reached step {step}: {lines}")


def sigterm(process: Worker) -> None:
    process.send_signal(signal.SIGTERM)


@dataclass
class StopTiming:
    """A stop measured from outside: seconds from SIGTERM to the final checkpoint's
    completion marker, from that marker to the last worker process's exit, and the CPU
    seconds each worker process used after the marker (None without Linux's /proc)."""

    to_marker_s: float
    marker_to_exit_s: float
    cpu_after_marker_s: list[float] | None
    returncodes: list[int]


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of a live process, from /proc (None once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # fields after the parenthesised command name: utime and stime are the 12th and 13th
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_stop(
    plan: Plan, config: TrainerConfig, workdir: Path, after: int, poll_s: float = 0.01
) -> StopTiming:
    """Start `plan`, SIGTERM every worker once rank 0 reported step `after`, and time the
    stop by polling (every `poll_s`) for the checkpoint marker under config.checkpoint_dir,
    the workers' CPU time and their exits. What a replan waits for is the marker to the
    last exit; the CPU seconds after the marker are that figure without the machine's load
    (each process's last `poll_s` before its exit is not seen)."""
    from sailplan.trainer.checkpoint import MARKER

    processes = start_workers(plan, config, workdir)
    cpu_at_marker: dict[int, float] = {}
    cpu_last: dict[int, float] = {}
    try:
        wait_for_step(processes[0], after)
        signalled = time.monotonic()
        for process in processes:
            sigterm(process)
        marker_at = None
        deadline = signalled + 120
        while any(p.poll() is None for p in processes):
            for process in processes:
                cpu = _cpu_seconds(process.pid)
                if cpu is not None and process.poll() is None:
                    cpu_last[process.pid] = cpu
            if marker_at is None and any(Path(config.checkpoint_dir).glob(f"step-*/{MARKER}")):
                marker_at = time.monotonic()
                cpu_at_marker = dict(cpu_last)
            if time.monotonic() > deadline:
                raise AssertionError("the workers did not exit within 120 s of SIGTERM")
            time.sleep(poll_s)
        exited = time.monotonic()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    if marker_at is None:
        raise AssertionError("the workers exited without a complete checkpoint")
    measured = all(p.pid in cpu_at_marker for p in processes)
    return StopTiming(
        to_marker_s=marker_at - signalled,
        marker_to_exit_s=exited - marker_at,
        cpu_after_marker_s=(
            [cpu_last[p.pid] - cpu_at_marker[p.pid] for p in processes] if measured else None
        ),
        returncodes=[p.returncode for p in processes],
    )


# T5 (encoder-decoder): 2 encoder + 2 decoder blocks, tied head, 12 encoder tokens and 8
# target tokens; the position bias tables and the token matrix are shared across stages
TINY_T5 = ModelSpec(
    name="tiny-t5",
    family="t5",
    architecture="encoder-decoder",
    hidden_size=32,
    num_blocks=4,
    decoder_blocks=2,
    num_heads=4,
    ffn_hidden_size=64,
    vocab_size=64,
    sequence_length=12,
    decoder_sequence_length=8,
    position_embedding="relative",
    relative_attention_buckets=8,
    mlp="relu",
    norm="rmsnorm",
    tied_embeddings=True,
)

# Wide-ResNet with narrow stages (stem 4 channels, widths 8..64) on 64x64 images of 4
# classes: the last stage still sees 2x2 pixels, so its batch norms (micro-batch
# statistics) average over more than a handful of values and stay well conditioned
TINY_WRN = ModelSpec(
    name="tiny-wrn",
    family="wide-resnet",
    architecture="convnet",
    stage_blocks=(2, 1, 1, 1),
    width_factor=2,
    stem_channels=4,
    image_size=64,
    num_classes=4,
)
