"""Simulator accuracy against real runs: the GH200 OPT-350M plans of the Sailor artifact.

Each validation file is a plan (4 GH200 per node, TP=4) with its measured iteration time
(`real`) and peak GPU memory (`max_mem`). This script converts each to a Plan
(profiles.sailor.plan_from_sailor), simulates it with the artifact's imported GH-96
profiles and network fits (measured profiles made non-decreasing in micro-batch size, as
the planner does) as the runs trained (DeepSpeed's pipeline engine, fp32: SAILOR_RUNTIME,
SAILOR_TRAINING), and prints per-plan errors and the mean absolute error (MAE).

Iteration time has no fitted constant: communication comes from the network's bandwidths
(simulator/collectives.py), so its error is the same in and out of sample. With --refit the
two memory constants (framework overhead, allocator factor; least squares) are fitted on
training folds only: all runs (in sample), all but one (leave-one-run-out), and the runs
with DP x PP <= 4 predicting the larger ones (leave-one-configuration-out). It then prints
the ranking metric: for each set of measured alternatives on the same GPUs and global
batch, the regret of the simulator's pick against the fastest measured plan. Sailor
reports 6% (time) and 5.56% (memory) on the same runs.

    python benchmarks/simulator_accuracy.py            # table with the shipped constants
    python benchmarks/simulator_accuracy.py --refit    # plus the fit and leave-one-out
    python benchmarks/simulator_accuracy.py --validation <runs> --model GPT-Neo-2.7B
    python benchmarks/simulator_accuracy.py --breakdown   # memory terms and floor per run

`--validation` takes any folder of Sailor plan files with measurements (the artifact's
profiles and network fits still come from `--artifact`); a grid point the artifact did not
measure is estimated (profiles.estimate.complete_profiles) and its row is marked `est`.
Runs without a measured peak memory print `-` and stay out of the memory error.
`--breakdown` prints each run's memory terms (model states, activations per micro-batch and
in flight, overhead) and its floor, the most any stage must hold at once whatever the
runtime adds (states + one micro-batch's activations): a measured peak below it did not come
from the training setup priced here (docs/benchmarks.md, held-out runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sailplan.planner.catalog import CatalogError, default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.cleaning import monotone_in_micro_batch
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.sailor import (
    SailorFormatError,
    SailorPlan,
    import_artifact,
    load_validation_plans,
)
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator import (
    DEEPSPEED_PIPELINE_CONSTANTS,
    PlanningContext,
    SimulatorConstants,
    in_flight_micro_batches,
    simulate,
)
from sailplan.planner.simulator.memory import FP32_BYTES, TrainingSetup

REPO = Path(__file__).resolve().parents[1]
# The Sailor runs trained with Megatron-DeepSpeed's PipelineEngine
# (DEEPSPEED_PIPELINE_CONSTANTS: blocking sends of 1/TP parts, 5e8-element gradient
# buckets, attention scores stored); the rest is the shipped model.
SAILOR_RUNTIME = DEEPSPEED_PIPELINE_CONSTANTS
# The Sailor runs trained in fp32: fp32 gradients in the all-reduce and fp32 tensors across
# stage boundaries, 4 bytes each. Sources: Sailor's Clariden run script
# (ae_scripts/clariden_scripts/run_opt.slurm, eth-easl/sailor) gives DeepSpeed a config with
# no bf16/fp16 section and Megatron-DeepSpeed no --bf16/--fp16, so DeepSpeed's all-reduce
# (engine.py allreduce_bucket) communicates in fp32 (communication_data_type); the artifact's
# models/llm_info.json, recorded from the same models, has params_bytes = 4 x params_floats
# and act_output_bytes = 4 x act_output_floats for every model; Sailor's validation
# (Planner/simulations/validation/validate.py) simulates the runs with fp16=False, 4-byte
# floats. Model states stay 16 B/param (fp32 weights and gradients, Adam's 8, no master
# copy, against 2 + 2 + 4 + 8), so the memory fit does not move. `precision` keeps its
# default: it only scales activation memory, whose 16-bit formula and allocator factor are
# fitted on these runs' measured peaks (the artifact's own fp32 measurement of a TP-4
# OPT-350M layer, 109.6 MB per sample, is 0.93 x that formula's 117.4 MB).
SAILOR_TRAINING = TrainingSetup(parameter_bytes=FP32_BYTES, boundary_element_bytes=FP32_BYTES)
ARTIFACT = REPO.parent / "shared" / "reference" / "sailor-artifact"
VALIDATION = ARTIFACT / "validation" / "gh200-opt350"

Runs = list[tuple[str, SailorPlan]]


def errors(
    runs: Runs, model: ModelSpec, profiles: ProfileSet, constants: SimulatorConstants
) -> list[tuple[str, float, float, float, float]]:
    """(name, real s, simulated s, real bytes, simulated bytes) per run."""
    rows = []
    for name, run in runs:
        context = PlanningContext(
            model=model,
            cluster=run.cluster,
            profiles=profiles,
            constants=constants,
            training=SAILOR_TRAINING,
        )
        predicted = simulate(run.plan, context)
        measured = all(
            (found := profiles.compute_profile(model.name, r.gpu_type, s.tensor_parallel, mbs))
            is not None
            and found.provenance.source == "measured"
            for s in run.plan.stages
            for r in s.replicas
            for mbs in (run.plan.micro_batch_size,)
        )
        rows.append(
            (
                name if measured else f"{name} est",
                run.measured_iteration_seconds or 0.0,
                predicted.iteration_seconds,
                float(run.measured_peak_memory_bytes or 0),
                float(predicted.peak_memory_bytes),
            )
        )
    return rows


def mae(pairs: Sequence[tuple[float, float]]) -> float:
    return float(np.mean([abs(sim - real) / real for real, sim in pairs]))


@dataclasses.dataclass(frozen=True)
class StageMemory:
    """The memory terms of one stage replica's GPU as the simulator prices them (bytes).

    states: model states (simulator/memory.py); activations: one micro-batch's activations
    (with its received input) before the allocator factor; in_flight: micro-batches 1F1B
    keeps (in_flight_micro_batches). Peak = states + factor x in_flight x activations +
    overhead (CostModel.stage_memory_bytes).
    """

    stage: int
    tensor_parallel: int
    parameters: float
    states: float
    activations: float
    in_flight: int

    def peak(self, constants: SimulatorConstants) -> float:
        return (
            self.states
            + self.activations * self.in_flight * constants.activation_allocator_factor
            + constants.framework_overhead_bytes
        )

    @property
    def floor(self) -> float:
        """What this GPU must hold at once whatever the runtime adds: its model states and
        one micro-batch's activations (no overhead, no allocator factor, one micro-batch
        even where 1F1B keeps more)."""
        return self.states + self.activations


def stage_memory(
    run: SailorPlan, model: ModelSpec, profiles: ProfileSet, constants: SimulatorConstants
) -> list[StageMemory]:
    """Each stage's memory terms (its first replica's GPU type) as the runs trained."""
    context = PlanningContext(
        model=model,
        cluster=run.cluster,
        profiles=profiles,
        constants=constants,
        training=SAILOR_TRAINING,
    )
    costs, plan = context.costs, run.plan
    out = []
    for index, stage in enumerate(plan.stages):
        table = costs.require_table(
            stage.replicas[0].gpu_type, stage.tensor_parallel, plan.micro_batch_size
        )
        a, b = stage.layer_start, stage.layer_end
        activations = table.activation_bytes(a, b)
        if a > 0:
            activations += costs.boundary_bytes(plan.micro_batch_size, a)
        parameters = table.parameters(a, b)
        states = float(
            costs.model_state_bytes(parameters, plan.data_parallel, table.tensor_parallel)
        )
        flight = in_flight_micro_batches(index, plan.pipeline_depth, plan.num_micro_batches)
        out.append(
            StageMemory(index, table.tensor_parallel, parameters, states, activations, flight)
        )
    return out


def fit_memory(
    runs: Runs, model: ModelSpec, profiles: ProfileSet, base: SimulatorConstants
) -> SimulatorConstants:
    """Least squares (relative error) of overhead bytes and allocator factor.

    Peak memory is linear in both: states + factor x in-flight activations + overhead,
    taken on the stage the current constants say is the largest.
    """
    rows, targets, weights = [], [], []
    for _, run in runs:
        best = max(stage_memory(run, model, profiles, base), key=lambda s: s.peak(base))
        real = float(run.measured_peak_memory_bytes or 0)
        rows.append([1.0, best.activations * best.in_flight])
        targets.append(real - best.states)
        weights.append(1.0 / real)
    w = np.array(weights)
    solution, *_ = np.linalg.lstsq(np.array(rows) * w[:, None], np.array(targets) * w, rcond=None)
    return dataclasses.replace(
        base,
        framework_overhead_bytes=float(solution[0]),
        activation_allocator_factor=float(solution[1]),
    )


def print_breakdown(
    runs: Runs, model: ModelSpec, profiles: ProfileSet, constants: SimulatorConstants
) -> None:
    """Per run: the terms of the stage the simulator says peaks, and the largest floor of
    any stage (model states + one micro-batch's activations), against the measured peak.
    A measured peak below the floor cannot come from the training setup priced here
    (SAILOR_TRAINING: fp32, no recomputation, scores stored), whatever the overhead."""
    print(
        "Memory terms of the peak stage (GB): states + factor x in-flight activations + "
        "overhead; floor = the largest states + one micro-batch's activations of any stage"
    )
    header = (
        f"{'plan':<16}{'real':>7}{'states':>8}{'act/mb':>8}{'x mb':>6}{'overhd':>8}"
        f"{'sim':>7}{'floor':>7}{'real-floor':>11}"
    )
    print(header)
    print("-" * len(header))
    below = 0
    for name, run in runs:
        stages = stage_memory(run, model, profiles, constants)
        peak = max(stages, key=lambda s: s.peak(constants))
        floor = max(s.floor for s in stages)
        real = float(run.measured_peak_memory_bytes or 0)
        margin = f"{(real - floor) / 1e9:>11.2f}" if real > 0 else f"{'-':>11}"
        below += real > 0 and real < floor
        print(
            f"{name:<16}{real / 1e9:>7.2f}{peak.states / 1e9:>8.2f}"
            f"{peak.activations / 1e9:>8.2f}{peak.in_flight:>6}"
            f"{constants.framework_overhead_bytes / 1e9:>8.2f}{peak.peak(constants) / 1e9:>7.2f}"
            f"{floor / 1e9:>7.2f}{margin}"
        )
    print(f"runs whose measured peak is below the floor: {below} of {len(runs)}")
    print()


def fit(runs: Runs, model: ModelSpec, profiles: ProfileSet) -> SimulatorConstants:
    """The only fitted constants: the two memory terms (time has none to fit), on the runs
    that measured peak memory (the shipped constants where none did)."""
    with_memory = [(name, run) for name, run in runs if run.measured_peak_memory_bytes]
    if len(with_memory) < 2:
        return SAILOR_RUNTIME
    return fit_memory(with_memory, model, profiles, SAILOR_RUNTIME)


def is_small(run: SailorPlan) -> bool:
    """A configuration of the training fold of leave-one-configuration-out: <= 4 nodes."""
    return (
        len({w.pool for w in run.plan.workers()}) <= 1
        and run.plan.data_parallel * (run.plan.pipeline_depth) <= 4
    )


def regret_rows(
    runs: Runs, rows: list[tuple[str, float, float, float, float]]
) -> list[tuple[str, str, str, float]]:
    """Per set of measured alternatives (same GPUs, same global batch): the simulator's pick,
    the fastest measured plan, and how much slower the pick really is."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (_, run) in enumerate(runs):
        gpus = sum(w.tensor_parallel for w in run.plan.workers())
        groups.setdefault((gpus, run.plan.global_batch_size), []).append(i)
    out = []
    for (gpus, batch), members in sorted(groups.items()):
        if len(members) < 2:
            continue
        pick = min(members, key=lambda i: (rows[i][2], rows[i][0]))
        best = min(members, key=lambda i: (rows[i][1], rows[i][0]))
        label = f"{gpus} GPUs, batch {batch}"
        out.append((label, rows[pick][0], rows[best][0], rows[pick][1] / rows[best][1] - 1.0))
    return out


def print_table(rows: list[tuple[str, float, float, float, float]], title: str) -> None:
    print(title)
    header = (
        f"{'plan':<16}{'real s':>9}{'sim s':>9}{'err %':>8}{'real GB':>10}{'sim GB':>9}{'err %':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, real_t, sim_t, real_m, sim_m in rows:
        memory = (
            f"{real_m / 1e9:>10.2f}{sim_m / 1e9:>9.2f}{100 * (sim_m - real_m) / real_m:>+8.1f}"
            if real_m > 0
            else f"{'-':>10}{sim_m / 1e9:>9.2f}{'-':>8}"
        )
        print(
            f"{name:<16}{real_t:>9.3f}{sim_t:>9.3f}{100 * (sim_t - real_t) / real_t:>+8.1f}{memory}"
        )
    time_mae = mae([(r[1], r[2]) for r in rows])
    with_memory = [(r[3], r[4]) for r in rows if r[3] > 0]
    memory_mae = f"{100 * mae(with_memory):.2f}%" if with_memory else "not measured"
    print(f"MAE: iteration time {100 * time_mae:.2f}%, peak memory {memory_mae}")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--refit", action="store_true", help="memory fits, cross-validation and regret"
    )
    parser.add_argument(
        "--artifact", type=Path, default=ARTIFACT, help="Sailor artifact (profiles, network)"
    )
    parser.add_argument(
        "--validation",
        type=Path,
        default=None,
        help="folder of Sailor plan files with measurements "
        "(default: <artifact>/validation/gh200-opt350)",
    )
    parser.add_argument("--model", default="OPT-350M", help="catalog model the runs trained")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="memory terms per run and the floor no runtime goes below",
    )
    args = parser.parse_args()
    validation = args.validation or args.artifact / "validation" / "gh200-opt350"
    if not validation.is_dir():
        if args.validation is None:
            print(f"skipped: the Sailor artifact is not at {args.artifact}", file=sys.stderr)
            return 0
        print(f"error: no folder of runs at {validation}", file=sys.stderr)
        return 2
    catalog = default_catalog()
    try:
        model = catalog.model(args.model)
        runs = load_validation_plans(validation, model, catalog)
    except (CatalogError, SailorFormatError, ValueError) as error:
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    if not runs:
        print(f"error: no plan_config_*.json runs in {validation}", file=sys.stderr)
        return 2
    measured = monotone_in_micro_batch(import_artifact(args.artifact, catalog).profiles)
    plans = [run.plan for _, run in runs]
    profiles = complete_profiles(
        model,
        sorted({w.gpu_type for p in plans for w in p.workers()}),
        sorted({s.tensor_parallel for p in plans for s in p.stages}),
        sorted({p.micro_batch_size for p in plans}),
        measured=measured,
        catalog=catalog,
    )

    c = SAILOR_RUNTIME
    print_table(
        errors(runs, model, profiles, c),
        f"Shipped constants: overhead {c.framework_overhead_bytes / 1e9:.2f} GB, allocator "
        f"x{c.activation_allocator_factor:.2f}, "
        "communication from the network (no efficiency constant), "
        "DeepSpeed's blocking pipeline sends",
    )
    if args.breakdown:
        print_breakdown(runs, model, profiles, c)
    if not args.refit:
        return 0

    fitted = fit(runs, model, profiles)
    print(
        f"Memory fit on all runs: overhead {fitted.framework_overhead_bytes / 1e9:.3f} GB, "
        f"allocator x{fitted.activation_allocator_factor:.3f}"
    )
    print_table(errors(runs, model, profiles, fitted), "In sample (memory fitted on all runs)")
    held_out = []
    for i in range(len(runs)):
        others = runs[:i] + runs[i + 1 :]
        held_out.extend(errors([runs[i]], model, profiles, fit(others, model, profiles)))
    print_table(held_out, "Leave-one-run-out (memory fitted on the other runs)")
    small = [r for r in runs if is_small(r[1])]
    large = [r for r in runs if not is_small(r[1])]
    print_table(
        errors(large, model, profiles, fit(small, model, profiles)),
        f"Leave-one-configuration-out: fitted on the {len(small)} runs with DP x PP <= 4, "
        f"predicting the {len(large)} larger ones",
    )
    print("Ranking: the simulator's pick among measured alternatives (shipped constants)")
    for label, pick, best, regret in regret_rows(runs, errors(runs, model, profiles, c)):
        print(f"  {label:<24} pick {pick:<14} fastest {best:<14} regret {100 * regret:5.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
