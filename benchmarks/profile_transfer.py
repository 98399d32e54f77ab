"""Which estimate to trust for a model on a GPU it was not measured on: leave-one-out.

For every (model, GPU) the Sailor artifact measured, hide all its profiles and predict them
from what is left: the cross-GPU transfer (profiles.transfer: the model measured on another
GPU, scaled per layer kind by the GPU ratio of every other model measured on both), the
same-GPU rescale (profiles.rescale: the roofline scaled by what the GPU measured for other
models of the family), their geometric mean, and the FLOP roofline (profiles.estimate), the
roofline's calibration refitted without the hidden profiles throughout. The error is
|predicted - measured| / measured of one micro-batch's forward + backward through the whole
model, averaged over the hidden grid points (TP, micro-batch); a '-' is a case the method
cannot reach. "shipped" is what complete_profiles does: the mean where both reach, else
whichever does, else the roofline, then the case's estimates made consistent across TP
degrees (profiles.tp_consistency: time x TP non-decreasing, over the hidden grid points);
"no TP fix" is the same chain without that repair. The summary compares the methods on the points every
one of them reaches, and the shipped chain with the transfer-else-roofline chain it
replaced over all points.

    python benchmarks/profile_transfer.py [--artifact DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from sailplan.planner.catalog import CatalogError, GPUSpec, default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.estimate import (
    DEFAULT_CALIBRATION,
    Calibration,
    estimate_compute_profile,
    fit_calibration,
)
from sailplan.planner.profiles.rescale import combine, rescale_profile
from sailplan.planner.profiles.sailor import import_artifact
from sailplan.planner.profiles.tp_consistency import consistent_in_tensor_parallel
from sailplan.planner.profiles.transfer import transfer_profile
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet

ARTIFACT = Path(__file__).resolve().parents[2] / "shared" / "reference" / "sailor-artifact"


def total(profile: ComputeProfile) -> float:
    return sum(profile.forward_s) + sum(profile.backward_s)


def error(estimate: ComputeProfile | None, truth: ComputeProfile) -> float | None:
    return abs(total(estimate) - total(truth)) / total(truth) if estimate else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, default=ARTIFACT)
    args = parser.parse_args()
    if not (args.artifact / "profiles").is_dir():
        print(f"skipped: the Sailor artifact is not at {args.artifact}", file=sys.stderr)
        return 0
    catalog = default_catalog()
    imported = import_artifact(args.artifact, catalog)
    for line in imported.rejected:
        print(f"rejected: {line}")
    measured = imported.profiles
    models: dict[str, ModelSpec] = {}
    for profile in measured.compute:
        try:
            models[profile.model] = catalog.model(profile.model)
        except CatalogError:
            continue
    cases = sorted({(p.model, p.gpu_type) for p in measured.compute if not p.oom})
    methods = ("transfer", "rescale", "mean", "roofline", "shipped", "no TP fix", "before")
    print()
    header = f"{'model':<14}{'GPU':<11}{'points':>7}" + "".join(f"{m + ' %':>12}" for m in methods)
    print(header)
    print("-" * len(header))
    errors: dict[str, list[float | None]] = {m: [] for m in methods}
    for model_name, gpu in cases:
        model = models[model_name]
        spec = catalog.gpu(gpu)
        hidden = [
            p for p in measured.compute if p.model == model_name and p.gpu_type == gpu and not p.oom
        ]
        rest = ProfileSet(
            compute=tuple(
                p for p in measured.compute if not (p.model == model_name and p.gpu_type == gpu)
            ),
            network=measured.network,
        )
        fitted = fit_calibration(rest, catalog, models)
        calibration = fitted[gpu][0] if gpu in fitted else DEFAULT_CALIBRATION

        def roofline(
            m: ModelSpec, tp: int, mbs: int, spec: GPUSpec = spec, cal: Calibration = calibration
        ) -> ComputeProfile:
            return estimate_compute_profile(m, spec, tp, mbs, calibration=cal)

        case: dict[str, list[float | None]] = {m: [] for m in methods}
        chain: list[ComputeProfile] = []
        for truth in hidden:
            tp, mbs = truth.tensor_parallel, truth.micro_batch_size
            roof = roofline(model, tp, mbs)
            moved = transfer_profile(model, gpu, tp, mbs, measured=rest, models=models)
            rescaled = rescale_profile(
                model, gpu, tp, mbs, measured=rest, models=models, roofline=roofline
            )
            mean = combine(moved, rescaled) if moved and rescaled else None
            chain.append(mean or moved or rescaled or roof)
            found = {
                "transfer": moved,
                "rescale": rescaled,
                "mean": mean,
                "roofline": roof,
                "no TP fix": chain[-1],
                "before": moved or roof,
            }
            for name, estimate in found.items():
                case[name].append(error(estimate, truth))
        # the TP repair works on the case's grid as a whole
        consistent = consistent_in_tensor_parallel(ProfileSet(compute=tuple(chain)))
        for truth in hidden:
            shipped = consistent.compute_profile(
                model_name, gpu, truth.tensor_parallel, truth.micro_batch_size
            )
            case["shipped"].append(error(shipped, truth))
        cells = []
        for name in methods:
            reached = [e for e in case[name] if e is not None]
            cells.append(f"{100 * np.mean(reached):>12.1f}" if reached else f"{'-':>12}")
            errors[name].extend(case[name])
        print(f"{model_name:<14}{gpu:<11}{len(hidden):>7}" + "".join(cells))
    print()
    common = [i for i in range(len(errors["roofline"])) if errors["mean"][i] is not None]
    print(f"mean error on the {len(common)} points every method reaches (median in brackets):")
    for name in ("transfer", "rescale", "mean", "roofline"):
        values = [float(errors[name][i] or 0.0) for i in common]
        print(f"  {name:<9} {100 * np.mean(values):6.1f}% ({100 * np.median(values):.1f}%)")
    everywhere = len(errors["shipped"])
    for name, label in (
        ("shipped", "shipped chain"),
        ("no TP fix", "shipped chain without the TP repair"),
        ("before", "transfer, else roofline"),
    ):
        values = [float(e or 0.0) for e in errors[name]]
        print(
            f"over all {everywhere} points, {label}: {100 * np.mean(values):.1f}% "
            f"({100 * np.median(values):.1f}%)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
