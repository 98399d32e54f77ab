"""Which estimate to trust for a model on a GPU it was not measured on: leave-one-out.

For every (model, GPU) the Sailor artifact measured, hide all its profiles and predict them
from what is left, the roofline's calibration refitted without them throughout:

- transfer: the model measured on another GPU, scaled per layer kind by the GPU ratio of a
  reference model measured on both, from qualified pairs only (same tensor-core math, a
  ratio the datasheets explain: profiles.transfer);
- anchored: at points no qualified pair measured, the roofline anchored to the transfer at
  the nearest point it reaches (profiles.estimate.MovedGrid.anchored);
- rescale: the roofline scaled by what the GPU measured for other models of the family
  (profiles.rescale);
- roofline: the FLOP roofline (profiles.estimate);
- shipped: what complete_profiles does (transfer, else anchored, else rescale, else
  roofline), then the case's estimates made consistent across TP degrees
  (profiles.tp_consistency); "no TP fix" is the same chain without that repair;
- no transfer: rescale, else roofline (the chain without any cross-GPU information).

The error is |predicted - measured| / measured of one micro-batch's forward + backward
through the whole model, averaged over the hidden grid points (TP, micro-batch); a '-' is
a case the method cannot reach. The summary gives each chain's mean and median over all
points. --margin sets how far beyond the datasheet interval a reference's GPU ratio may lie
(transfer.PLAUSIBLE_RATIO_MARGIN).

--held-out DIR checks against profiles measured outside the artifact (a folder in its
layout, profiles/<MODEL>/<GPU>/profile.json): for each (model, GPU) there, what
complete_profiles estimates from the artifact without that (model, GPU), point by point.
The public Sailor repository's GH200 profile of GPT-Neo-2.7 (eth-easl/sailor,
sailor/Planner/sailor_planner/profiles/GPT-Neo-2.7/GH-96/profile.json), which the
artifact's mislabelled copy stands for, is such a check.

    python benchmarks/profile_transfer.py [--artifact DIR] [--margin 1.5] [--held-out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from sailplan.planner.catalog import Catalog, CatalogError, default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.estimate import (
    DEFAULT_CALIBRATION,
    MovedGrid,
    complete_profiles,
    fit_calibration,
)
from sailplan.planner.profiles.sailor import import_artifact, import_compute
from sailplan.planner.profiles.tp_consistency import consistent_in_tensor_parallel
from sailplan.planner.profiles.transfer import PLAUSIBLE_RATIO_MARGIN
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet

ARTIFACT = Path(__file__).resolve().parents[2] / "shared" / "reference" / "sailor-artifact"


def total(profile: ComputeProfile) -> float:
    return sum(profile.forward_s) + sum(profile.backward_s)


def error(estimate: ComputeProfile | None, truth: ComputeProfile) -> float | None:
    return abs(total(estimate) - total(truth)) / total(truth) if estimate else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, default=ARTIFACT)
    parser.add_argument("--margin", type=float, default=PLAUSIBLE_RATIO_MARGIN)
    parser.add_argument(
        "--held-out", type=Path, default=None, help="profiles measured elsewhere to check"
    )
    args = parser.parse_args()
    if not (args.artifact / "profiles").is_dir():
        print(f"skipped: the Sailor artifact is not at {args.artifact}", file=sys.stderr)
        return 0
    if args.margin < 1:
        print("error: --margin must be at least 1", file=sys.stderr)
        return 2
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
    methods = ("transfer", "anchored", "rescale", "roofline", "shipped", "no TP fix", "no transfer")
    print()
    header = f"{'model':<14}{'GPU':<11}{'points':>7}" + "".join(f"{m + ' %':>14}" for m in methods)
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

        moved_grid = MovedGrid(
            model, spec, rest, models, catalog, margin=args.margin, calibration=calibration
        )
        case: dict[str, list[float | None]] = {m: [] for m in methods}
        chain: list[ComputeProfile] = []
        for truth in hidden:
            tp, mbs = truth.tensor_parallel, truth.micro_batch_size
            roof = moved_grid.roofline(model, tp, mbs)
            moved = moved_grid.at(tp, mbs)
            anchored = moved_grid.anchored(tp, mbs) if moved is None else None
            rescaled = moved_grid.rescaled(tp, mbs)
            chain.append(moved or anchored or rescaled or roof)
            found = {
                "transfer": moved,
                "anchored": anchored,
                "rescale": rescaled,
                "roofline": roof,
                "no TP fix": chain[-1],
                "no transfer": rescaled or roof,
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
            cells.append(f"{100 * np.mean(reached):>14.1f}" if reached else f"{'-':>14}")
            errors[name].extend(case[name])
        print(f"{model_name:<14}{gpu:<11}{len(hidden):>7}" + "".join(cells))
    print()
    everywhere = len(errors["shipped"])
    print(f"over all {everywhere} points, mean error (median in brackets):")
    for name, label in (
        ("shipped", "shipped chain"),
        ("no TP fix", "shipped chain without the TP repair"),
        ("no transfer", "rescale, else roofline"),
        ("roofline", "roofline"),
    ):
        values = [float(e or 0.0) for e in errors[name]]
        print(f"  {label:<36} {100 * np.mean(values):6.1f}% ({100 * np.median(values):.1f}%)")
    for name in ("transfer", "anchored"):
        reached = [float(e) for e in errors[name] if e is not None]
        print(
            f"  {name} where it reaches ({len(reached)} points)".ljust(39)
            + f"{100 * np.mean(reached):6.1f}% ({100 * np.median(reached):.1f}%)"
        )
    if args.held_out is not None:
        return check_held_out(args.held_out, measured, catalog)
    return 0


def check_held_out(root: Path, artifact: ProfileSet, catalog: Catalog) -> int:
    """complete_profiles' estimate of each held-out (model, GPU) from the artifact without
    it, against the held-out measurement, per grid point."""
    if not (root / "profiles").is_dir():
        print(f"error: no profiles/<MODEL>/<GPU>/profile.json under {root}", file=sys.stderr)
        return 2
    held, skipped = import_compute(root, catalog)
    for line in skipped:
        print(f"held-out skipped: {line}")
    for model_name, gpu in sorted({(p.model, p.gpu_type) for p in held if not p.oom}):
        model = catalog.model(model_name)
        truths = sorted(
            (p for p in held if p.model == model_name and p.gpu_type == gpu and not p.oom),
            key=lambda p: (p.micro_batch_size, p.tensor_parallel),
        )
        rest = ProfileSet(
            compute=tuple(
                p for p in artifact.compute if not (p.model == model_name and p.gpu_type == gpu)
            ),
            network=artifact.network,
        )
        estimated = complete_profiles(
            model,
            [gpu],
            sorted({p.tensor_parallel for p in truths}),
            sorted({p.micro_batch_size for p in truths}),
            measured=rest,
            catalog=catalog,
        )
        print()
        print(f"held out: {model_name} on {gpu}, estimated from the artifact without it")
        print(f"{'mbs':>5}{'tp':>4}{'measured ms':>13}{'estimated ms':>14}{'error %':>9}  how")
        errors = []
        for truth in truths:
            tp, mbs = truth.tensor_parallel, truth.micro_batch_size
            found = estimated.compute_profile(model_name, gpu, tp, mbs)
            if found is None:
                continue
            signed = (total(found) - total(truth)) / total(truth)
            errors.append(abs(signed))
            how = found.provenance.tool
            if "scaled from" in found.provenance.note:
                how += " anchored to " + found.provenance.note.split(" (")[0].split()[-1]
            print(
                f"{mbs:>5}{tp:>4}{1e3 * total(truth):>13.1f}{1e3 * total(found):>14.1f}"
                f"{100 * signed:>+9.1f}  {how}"
            )
        if errors:
            print(
                f"mean error {100 * np.mean(errors):.1f}% (median {100 * np.median(errors):.1f}%) "
                f"over {len(errors)} points"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
