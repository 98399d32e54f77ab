"""`sailplan-train`: the worker pod's entry point.

One pod is one worker of the Plan: one TP group of `tensor_parallel` consecutive global
ranks (Plan.workers()). This reads the pod's contract (sailplan.planner.workerenv: the
mounted Plan and TrainerConfig, the worker index, the plan generation, the rendezvous
address), then runs one process per local rank: in this process when the worker has a
single rank, otherwise as spawned children, with SIGTERM forwarded to every child so that a
preemption notice reaches all ranks. The exit status is the worst of the children's.

Mistakes in the pod's configuration end with a one-line message and exit status 2.

A rank that trained to the end exits with `exit_without_finalizing`: by then its last
checkpoint is complete and its process groups are destroyed, and what normal interpreter
shutdown would still do is tear down torch's and DeepSpeed's module graph, which took
about 5 s of pure CPU after the atexit handlers on 8 ranks sharing 2 cores (strace: no
system call in between), time every replan waited for (benchmarks/trainer_stop.py).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from pydantic import ValidationError

from sailplan.planner import workerenv as env
from sailplan.planner.plan import Plan
from sailplan.planner.workerenv import TrainerConfig

TIMEOUT_ENV = "SAILPLAN_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0


class ConfigError(Exception):
    """A mistake in the pod's environment or mounted files (reported in one line)."""


@dataclass(frozen=True)
class WorkerSettings:
    plan_json: str
    config_json: str
    worker_index: int
    generation: int
    master_addr: str
    master_port: int
    podinfo_dir: str | None
    timeout_s: float


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as error:
        raise ConfigError(f"cannot read the {what} at {path}: {error.strerror}") from error


def _int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ConfigError(f"environment variable {name} is not set")
        return default
    try:
        return int(raw)
    except ValueError as error:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from error


def settings_from_environment() -> WorkerSettings:
    plan_path = os.environ.get(env.PLAN_PATH, env.DEFAULT_PLAN_PATH)
    config_path = os.environ.get(env.TRAINER_CONFIG_PATH, env.DEFAULT_TRAINER_CONFIG_PATH)
    plan_json, config_json = _read(plan_path, "plan"), _read(config_path, "trainer config")
    try:
        plan = Plan.from_json(plan_json)
    except ValidationError as error:
        raise ConfigError(f"invalid plan {plan_path}: {error.errors()[0]['msg']}") from error
    try:
        config = TrainerConfig.model_validate_json(config_json)
    except ValidationError as error:
        raise ConfigError(
            f"invalid trainer config {config_path}: {error.errors()[0]['msg']}"
        ) from error
    if config.zero_stage == 2 and plan.pipeline_micro_batches is not None:
        # ZeRO-2 reduces over the DP group after every micro-batch's backward, so replicas
        # running different micro-batch counts would issue different collectives
        raise ConfigError(
            f"plan {plan_path} has an uneven data split (pipeline_micro_batches "
            f"{list(plan.pipeline_micro_batches)}), which zero_stage 2 cannot run: set "
            "zero_stage 0 or 1, or plan with zero_stage 2 (the planner then keeps the split even)"
        )
    index = _int(env.WORKER_INDEX)
    workers = plan.workers()
    if not 0 <= index < len(workers):
        raise ConfigError(f"{env.WORKER_INDEX}={index} but the plan has {len(workers)} workers")
    world = _int(env.WORLD_SIZE, plan.world_size)
    if world != plan.world_size:
        raise ConfigError(f"{env.WORLD_SIZE}={world} but the plan needs {plan.world_size} ranks")
    return WorkerSettings(
        plan_json=plan_json,
        config_json=config_json,
        worker_index=index,
        generation=_int(env.PLAN_GENERATION, 0),
        master_addr=os.environ.get(env.MASTER_ADDR, "127.0.0.1"),
        master_port=_int(env.MASTER_PORT, env.DEFAULT_MASTER_PORT),
        podinfo_dir=os.environ.get(env.PODINFO_DIR),
        timeout_s=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)),
    )


def run_rank(settings: WorkerSettings, local_rank: int) -> int:
    """Run one global rank to the end; returns the process exit status."""
    import torch.distributed as dist

    from sailplan.trainer.engine import Trainer, init_world
    from sailplan.trainer.stopping import StopSignal

    stop = StopSignal(settings.podinfo_dir, settings.generation)
    stop.install()
    plan = Plan.from_json(settings.plan_json)
    config = TrainerConfig.model_validate_json(settings.config_json)
    worker = plan.workers()[settings.worker_index]
    rank = worker.first_rank + local_rank
    device = init_world(
        rank=rank,
        local_rank=local_rank,
        world_size=plan.world_size,
        master_addr=settings.master_addr,
        master_port=settings.master_port,
        timeout_s=settings.timeout_s,
    )
    try:
        Trainer(
            plan,
            config,
            rank=rank,
            local_rank=local_rank,
            device=device,
            generation=settings.generation,
            stop=stop,
        ).run()
    finally:
        dist.destroy_process_group()
    return 0


def exit_without_finalizing(code: int) -> None:
    """Flush what this process wrote and exit at once, skipping interpreter finalization
    (and so atexit handlers and object destructors: call only when nothing is left to do)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _child(settings: WorkerSettings, local_rank: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    exit_without_finalizing(run_rank(settings, local_rank))


def launch(settings: WorkerSettings, tensor_parallel: int) -> int:
    """Spawn one process per local rank and forward SIGTERM to them."""
    context = multiprocessing.get_context("spawn")
    children = [
        context.Process(target=_child, args=(settings, local), name=f"rank-{local}")
        for local in range(tensor_parallel)
    ]
    for child in children:
        child.start()

    def forward(signum: int, frame: FrameType | None) -> None:
        for child in children:
            if child.pid is not None and child.is_alive():
                os.kill(child.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    while True:
        codes = [child.exitcode for child in children]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            # A rank that died leaves its peers blocked in collectives: end them.
            for child in children:
                if child.is_alive():
                    child.kill()
            for child in children:
                child.join()
            return failed[0] if failed[0] > 0 else 1
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.2)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    try:
        settings = settings_from_environment()
    except ConfigError as error:
        print(f"sailplan-train: {error}", file=sys.stderr)
        sys.exit(2)
    worker = Plan.from_json(settings.plan_json).workers()[settings.worker_index]
    if worker.tensor_parallel == 1:
        exit_without_finalizing(run_rank(settings, 0))
    sys.exit(launch(settings, worker.tensor_parallel))


if __name__ == "__main__":
    main()
