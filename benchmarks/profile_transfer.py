"""Which estimate to trust for a model on a GPU it was not measured on: leave-one-out.

For every (model, GPU) the Sailor artifact measured, hide all its profiles and predict them
two ways from what is left: the cross-GPU transfer (profiles.transfer: the model measured
on another GPU, scaled per layer kind by the GPU ratio of every other model measured on
both) and the FLOP roofline (profiles.estimate, its efficiency refitted without the hidden
profiles). The error is |predicted - measured| / measured of one micro-batch's forward +
backward through the whole model, averaged over the hidden grid points (TP, micro-batch).
complete_profiles uses the transfer where it applies because its mean error here is the
lower one; a row's '-' is a case the transfer cannot reach (no other model on that GPU).

    python benchmarks/profile_transfer.py [--artifact DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from sailplan.planner.catalog import CatalogError, default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.estimate import (
    DEFAULT_CALIBRATION,
    estimate_compute_profile,
    fit_calibration,
)
from sailplan.planner.profiles.sailor import import_artifact
from sailplan.planner.profiles.transfer import transfer_profile
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet

ARTIFACT = Path(__file__).resolve().parents[2] / "shared" / "reference" / "sailor-artifact"


def total(profile: ComputeProfile) -> float:
    return sum(profile.forward_s) + sum(profile.backward_s)


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
    print()
    header = (
        f"{'model':<14}{'GPU':<11}{'points':>7}{'both':>5}{'transfer %':>12}{'roofline %':>12}"
        f"{'roofline all %':>15}"
    )
    print(header)
    print("-" * len(header))
    both_t, both_r, all_r = [], [], []
    for model_name, gpu in cases:
        model = models[model_name]
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
        t_err, r_shared, r_err = [], [], []
        for truth in hidden:
            tp, mbs = truth.tensor_parallel, truth.micro_batch_size
            roof = estimate_compute_profile(
                model, catalog.gpu(gpu), tp, mbs, calibration=calibration
            )
            r_err.append(abs(total(roof) - total(truth)) / total(truth))
            moved = transfer_profile(model, gpu, tp, mbs, measured=rest, models=models)
            if moved is not None:
                t_err.append(abs(total(moved) - total(truth)) / total(truth))
                r_shared.append(r_err[-1])
        all_r.append(float(np.mean(r_err)))
        shared = "-"
        if t_err:
            both_t.extend(t_err)
            both_r.extend(r_shared)
            shared = f"{len(t_err):>5}{100 * np.mean(t_err):>12.1f}{100 * np.mean(r_shared):>12.1f}"
        else:
            shared = f"{0:>5}{'-':>12}{'-':>12}"
        print(f"{model_name:<14}{gpu:<11}{len(hidden):>7}{shared}{100 * all_r[-1]:>12.1f}")
    print()
    print(
        f"on the {len(both_t)} points the transfer reaches: transfer "
        f"{100 * np.mean(both_t):.1f}%, roofline {100 * np.mean(both_r):.1f}% (mean error; "
        f"median {100 * np.median(both_t):.1f}% and {100 * np.median(both_r):.1f}%); "
        f"roofline over all {len(all_r)} cases {100 * np.mean(all_r):.1f}%"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
