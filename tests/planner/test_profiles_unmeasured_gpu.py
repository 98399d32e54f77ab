"""Why complete_profiles estimates a model on a GPU it was never measured on as it does.

Leaving each (model, GPU) of the Sailor artifact out and predicting its profiles from the
rest (the roofline's calibration refitted without them), the chain complete_profiles uses
(the qualified cross-GPU transfer, else the roofline anchored to it at the nearest point it
reaches, else the same-GPU rescale, else the roofline) must have a lower mean and median
error than the chain without cross-GPU information (rescale, else roofline);
benchmarks/profile_transfer.py prints the full table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sailplan.planner.catalog import CatalogError, GPUSpec, default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.estimate import (
    DEFAULT_CALIBRATION,
    Calibration,
    anchored_estimate,
    estimate_compute_profile,
    fit_calibration,
    grid_distance,
)
from sailplan.planner.profiles.rescale import rescale_profile
from sailplan.planner.profiles.sailor import import_artifact
from sailplan.planner.profiles.transfer import transfer_profile
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet

ARTIFACT = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "sailor-artifact"


def total(profile: ComputeProfile) -> float:
    return sum(profile.forward_s) + sum(profile.backward_s)


def test_the_shipped_chain_beats_the_chain_without_cross_gpu_information() -> None:
    if not (ARTIFACT / "profiles").is_dir():
        pytest.skip(f"the Sailor artifact is not at {ARTIFACT}")
    catalog = default_catalog()
    measured = import_artifact(ARTIFACT, catalog).profiles
    models: dict[str, ModelSpec] = {}
    for profile in measured.compute:
        try:
            models[profile.model] = catalog.model(profile.model)
        except CatalogError:
            continue
    shipped: list[float] = []
    without: list[float] = []
    for model_name, gpu in sorted({(p.model, p.gpu_type) for p in measured.compute if not p.oom}):
        model, spec = models[model_name], catalog.gpu(gpu)
        rest = ProfileSet(
            compute=tuple(
                p for p in measured.compute if not (p.model == model_name and p.gpu_type == gpu)
            )
        )
        fitted = fit_calibration(rest, catalog, models)
        calibration = fitted[gpu][0] if gpu in fitted else DEFAULT_CALIBRATION

        def roofline(
            m: ModelSpec, tp: int, mbs: int, spec: GPUSpec = spec, cal: Calibration = calibration
        ) -> ComputeProfile:
            return estimate_compute_profile(m, spec, tp, mbs, calibration=cal)

        elsewhere = {
            (p.tensor_parallel, p.micro_batch_size)
            for p in rest.compute
            if p.model == model_name and not p.oom
        }
        for truth in measured.compute:
            if truth.model != model_name or truth.gpu_type != gpu or truth.oom:
                continue
            tp, mbs = truth.tensor_parallel, truth.micro_batch_size
            roof = roofline(model, tp, mbs)
            moved = transfer_profile(
                model, gpu, tp, mbs, measured=rest, models=models, catalog=catalog
            )
            anchored = None
            if moved is None:
                for point in sorted(
                    elsewhere - {(tp, mbs)}, key=lambda q: grid_distance(q, tp, mbs)
                ):
                    anchor = transfer_profile(
                        model, gpu, *point, measured=rest, models=models, catalog=catalog
                    )
                    if anchor is not None:
                        anchored = anchored_estimate(
                            model, spec, roof, anchor, calibration=calibration
                        )
                        break
            rescaled = rescale_profile(
                model, gpu, tp, mbs, measured=rest, models=models, roofline=roofline
            )
            fallback = rescaled or roof
            chosen = moved or anchored or fallback
            shipped.append(error(chosen, truth))
            without.append(error(fallback, truth))
    assert len(shipped) > 150
    assert np.mean(shipped) < np.mean(without)
    assert np.median(shipped) < np.median(without)


def error(estimate: ComputeProfile, truth: ComputeProfile) -> float:
    return abs(total(estimate) - total(truth)) / total(truth)
