"""On one NVIDIA GPU: profile a small model, train it, and hold both against the simulator.

The check issue 12 asks for whenever a GPU is at hand, as one prepared script that fits in
five minutes of a lent machine:

1. the compute profiler (`sailplan-profile model`, a subprocess) measures the model on
   CUDA at TP 1 for micro-batches 1, 2 and 4: per-layer forward, backward and Adam update
   seconds and per-layer peak memory;
2. the trainer (`sailplan-train`, a subprocess, NCCL world of one) runs a PP 1, TP 1, DP 1
   plan with several micro-batches per step for `--steps` steps in fp32 (the profiler
   times fp32 layers; autocast off), reporting each step's time and its peak allocated and
   reserved memory (sailplan.trainer.peak_memory) in its JSON step lines, while this
   process samples the device's used memory through NVML;
3. the simulator (`sailplan.planner.simulator.simulate`) prices the same plan from the
   profiles just measured, with the trainer's memory setup (TrainingSetup.trainer);
4. a table: measured step time and peak memory against the prediction. It is printed and
   written to `--out` (Markdown).

Every figure is of one GPU: no NVLink, no network, no collective across devices. Nothing
here changes GPU clocks or power limits. This process never creates a CUDA context (the
profiler and the trainer run as subprocesses), so NVML's used memory during the training
run is the trainer's process plus whatever else holds the device, reported as the growth
over the reading before the trainer started.

Without a CUDA device it prints one line and exits 2; a GPU name the catalog does not know
needs `--gpu-type`.

    python benchmarks/gpu_check.py --out gpu-check.md [--model OPT-350M] [--mbs 4]
        [--micro-batches 4] [--steps 20] [--gpu-type H200-141] [--profiles DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
PROFILED_MBS = (1, 2, 4)
WARMUP_STEPS = 3  # cuBLAS heuristics, allocator growth, Adam's state created at step 1
BUDGET_S = 270.0  # the whole check, inside a 5-minute device lease with room to spare
GB = 1e9


class CheckError(Exception):
    """A reason the check cannot run here, reported in one line with exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"gpu_check: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="also write the table here")
    parser.add_argument("--model", default="OPT-350M", help="catalog model (decoder-only)")
    parser.add_argument("--gpu-type", default=None, help="catalog GPU type (default: by name)")
    parser.add_argument("--mbs", type=int, default=4, choices=PROFILED_MBS)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--profiles", type=Path, default=None, help="keep the profiles here")
    args = parser.parse_args(argv)
    if args.micro_batches < 2:
        parser.error("--micro-batches must be at least 2 (several micro-batches per step)")
    if args.steps <= WARMUP_STEPS + 2:
        parser.error(f"--steps must be more than {WARMUP_STEPS + 2} (warm-up steps are dropped)")
    return args


def cuda_device_name() -> str:
    """The first CUDA device's name; CheckError without one (no context is created)."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        raise CheckError("no CUDA device (torch.cuda.is_available() is False); nothing was run")
    return str(torch.cuda.get_device_name(0))


def catalog_gpu_type(name: str, given: str | None) -> str:
    from sailplan.planner.catalog import default_catalog

    catalog = default_catalog()
    candidates = [given] if given else [name, name.removeprefix("NVIDIA ").strip()]
    for candidate in candidates:
        try:
            return catalog.resolve_gpu(candidate)
        except LookupError:
            continue
    if given:
        raise CheckError(f"--gpu-type {given!r} is not a catalog GPU type")
    raise CheckError(f"GPU {name!r} is not in the catalog by name: pass --gpu-type")


def profile(model: str, gpu_type: str, directory: Path, timeout_s: float) -> None:
    """`sailplan-profile model` at TP 1 for PROFILED_MBS, into `directory`."""
    command = [
        sys.executable,
        "-c",
        "from sailplan.trainer.profilers.cli import main; main()",
        "model",
        "--model",
        model,
        "--gpu-type",
        gpu_type,
        "--out",
        str(directory),
        "--tp",
        "1",
        "--mbs",
        ",".join(str(m) for m in PROFILED_MBS),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the profiler failed ({done.returncode}):\n{done.stderr[-4000:]}")


class UsedMemory:
    """The device's used memory through NVML, sampled on a thread every 50 ms."""

    def __init__(self) -> None:
        self.before: int | None = None
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._read = lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            self.before = self._read()
        except Exception:  # no pynvml or no driver library: the row says not measured
            self._read = None

    def __enter__(self) -> UsedMemory:
        if self._read is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        assert self._read is not None
        while not self._stop.wait(0.05):
            used = self._read()
            self.peak = used if self.peak is None else max(self.peak, used)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def growth(self) -> int | None:
        if self.peak is None or self.before is None:
            return None
        return self.peak - self.before


@dataclass(frozen=True)
class Measured:
    step_seconds: list[float]
    allocated: int | None
    reserved: int | None
    device_used: int | None


def train(plan: Any, steps: int, timeout_s: float) -> Measured:
    """Run `plan` with sailplan-train (one worker, the trainer tests' harness)."""
    sys.path.insert(0, str(ROOT / "tests" / "trainer"))
    from trainer_harness import run_plan

    from sailplan.planner.workerenv import TrainerConfig

    with tempfile.TemporaryDirectory(prefix="sailplan-gpu-check-") as directory:
        workdir = Path(directory)
        config = TrainerConfig(
            steps=steps,
            learning_rate=1e-4,
            checkpoint_dir=str(workdir / "ckpt"),
            # only the final save, after the last timed step
            checkpoint_interval_steps=10 * steps,
            checkpoints_to_keep=1,
        )
        with UsedMemory() as used:
            run = run_plan(plan, config, workdir, timeout_s=timeout_s, fresh_interpreters=True)
    lines = [e for e in run.events if e["event"] == "step"]
    if len(lines) != steps:
        raise RuntimeError(f"the trainer reported {len(lines)} of {steps} steps")
    allocated = [
        e["peak_memory_allocated_bytes"] for e in lines if "peak_memory_allocated_bytes" in e
    ]
    reserved = [e["peak_memory_reserved_bytes"] for e in lines if "peak_memory_reserved_bytes" in e]
    return Measured(
        step_seconds=[e["step_seconds"] for e in lines],
        allocated=max(allocated) if allocated else None,
        reserved=max(reserved) if reserved else None,
        device_used=used.growth,
    )


@dataclass(frozen=True)
class Predicted:
    iteration_seconds: float
    peak_bytes: float
    model_state_bytes: float
    framework_overhead_bytes: float


def predict(plan: Any, profiles: Any) -> Predicted:
    """simulate() of `plan` from the measured `profiles`, priced as Sailplan's trainer runs
    it (DEFAULT_CONSTANTS) with the trainer's fp32 model states (TrainingSetup.trainer)."""
    from sailplan.planner.catalog import default_catalog
    from sailplan.planner.cli_sources import cluster_of
    from sailplan.planner.profiles.estimate import complete_profiles
    from sailplan.planner.simulator import PlanningContext, simulate
    from sailplan.planner.simulator.memory import TrainingSetup

    catalog = default_catalog()
    gpu_type = plan.stages[0].replicas[0].gpu_type
    context = PlanningContext(
        model=plan.model,
        cluster=cluster_of(plan, catalog),
        profiles=complete_profiles(
            plan.model, [gpu_type], [1], [plan.micro_batch_size], measured=profiles, catalog=catalog
        ),
        catalog=catalog,
        training=TrainingSetup.trainer(zero_stage=1, precision="fp32"),
    )
    predictions = simulate(plan, context)
    costs = context.costs
    table = costs.require_table(gpu_type, 1, plan.micro_batch_size)
    states = costs.model_state_bytes(table.parameters(0, plan.model.num_layers), 1, 1, False)
    return Predicted(
        iteration_seconds=predictions.iteration_seconds,
        peak_bytes=float(predictions.stages[0].peak_memory_bytes),
        model_state_bytes=float(states),
        framework_overhead_bytes=context.constants.framework_overhead_bytes,
    )


def _ratio(measured: float | None, predicted: float) -> str:
    return "n/a" if measured is None or predicted <= 0 else f"{measured / predicted:.2f}"


def _gb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GB:.2f}"


def report(
    *,
    header: list[str],
    profiles: Any,
    model: str,
    gpu_type: str,
    measured: Measured,
    predicted: Predicted,
) -> str:
    lines = [*header, "", "Profiles just measured (TP 1; seconds per micro-batch, all layers):", ""]
    lines += [
        "| micro-batch | forward s | backward s | Adam update s | largest layer peak GB |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for mbs in PROFILED_MBS:
        found = profiles.compute_profile(model, gpu_type, 1, mbs)
        if found is None or found.oom:
            lines.append(f"| {mbs} | out of memory | | | |")
            continue
        peak = max(found.peak_memory_bytes) if found.peak_memory_bytes else None
        lines.append(
            f"| {mbs} | {sum(found.forward_s):.4f} | {sum(found.backward_s):.4f} | "
            f"{sum(found.update_s):.4f} | {_gb(peak)} |"
        )
    timed = measured.step_seconds[WARMUP_STEPS:]
    step = statistics.median(timed)
    without_overhead = predicted.peak_bytes - predicted.framework_overhead_bytes
    # what the process holds on the device outside torch's allocator (CUDA context,
    # cuBLAS workspaces, NCCL): the part the simulator's framework overhead stands for
    outside_torch = (
        None
        if measured.device_used is None or measured.reserved is None
        else measured.device_used - measured.reserved
    )
    lines += [
        "",
        f"Training against the simulator (median of steps {WARMUP_STEPS + 1}-"
        f"{len(measured.step_seconds)}; steps ranged {min(timed):.4f}-{max(timed):.4f} s):",
        "",
        "| quantity | measured | simulator | measured / simulator |",
        "| --- | ---: | ---: | ---: |",
        f"| step time, s | {step:.4f} | {predicted.iteration_seconds:.4f} | "
        f"{_ratio(step, predicted.iteration_seconds)} |",
        f"| peak allocated (torch), GB, vs predicted peak less framework overhead | "
        f"{_gb(measured.allocated)} | {_gb(without_overhead)} | "
        f"{_ratio(measured.allocated, without_overhead)} |",
        f"| peak reserved (torch), GB, vs the same | {_gb(measured.reserved)} | "
        f"{_gb(without_overhead)} | {_ratio(measured.reserved, without_overhead)} |",
        f"| device memory used during training (NVML growth), GB, vs predicted peak | "
        f"{_gb(measured.device_used)} | {_gb(predicted.peak_bytes)} | "
        f"{_ratio(measured.device_used, predicted.peak_bytes)} |",
        f"| of the prediction: model states (weights, gradients, Adam), GB | | "
        f"{_gb(predicted.model_state_bytes)} | |",
        f"| of the prediction: framework overhead (a GH200 fit), GB; measured: NVML growth "
        f"less peak reserved | {_gb(outside_torch)} | "
        f"{_gb(predicted.framework_overhead_bytes)} | |",
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> str:
    began = time.monotonic()
    name = cuda_device_name()
    gpu_type = catalog_gpu_type(name, args.gpu_type)
    import torch

    from sailplan.planner.catalog import default_catalog
    from sailplan.planner.plan import Plan, Replica, Stage
    from sailplan.planner.profiles.store import load_profile_dir

    catalog = default_catalog()
    try:
        spec = catalog.model(catalog.resolve_model(args.model))
    except LookupError as error:
        raise CheckError(str(error)) from None
    with tempfile.TemporaryDirectory(prefix="sailplan-profiles-") as scratch:
        directory = args.profiles or Path(scratch)
        profile(spec.name, gpu_type, directory, BUDGET_S / 2)
        profiles = load_profile_dir(directory, catalog)
    profiled = time.monotonic() - began
    plan = Plan(
        model=spec,
        global_batch_size=args.mbs * args.micro_batches,
        micro_batch_size=args.mbs,
        num_micro_batches=args.micro_batches,
        stages=(
            Stage(
                layer_start=0,
                layer_end=spec.num_layers,
                replicas=(Replica(pool="gpu-check", gpu_type=gpu_type, zone="us-central1-a"),),
            ),
        ),
    )
    predicted = predict(plan, profiles)
    measured = train(plan, args.steps, max(30.0, BUDGET_S - (time.monotonic() - began)))
    header = [
        f"# gpu_check: {spec.name} on one {name} ({gpu_type}), torch {torch.__version__}",
        "",
        f"Plan: 1 stage, TP 1, DP 1, micro-batch {args.mbs} x {args.micro_batches} per step, "
        f"fp32, Adam; {args.steps} steps. One GPU only: no NVLink, network or cross-device "
        f"collective in any figure. Profiling took {profiled:.0f} s, the whole check "
        f"{time.monotonic() - began:.0f} s.",
    ]
    return report(
        header=header,
        profiles=profiles,
        model=spec.name,
        gpu_type=gpu_type,
        measured=measured,
        predicted=predicted,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        table = run(args)
    except CheckError as error:
        print(f"gpu_check: {error}", file=sys.stderr)
        sys.exit(2)
    print(table, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)


if __name__ == "__main__":
    main()
