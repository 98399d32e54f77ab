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

from sailplan.planner.catalog import CatalogError, default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.estimate import (
    DEFAULT_CALIBRATION,
    MovedGrid,
    fit_calibration,
    unmeasured_gpu_estimate,
)
from sailplan.planner.profiles.sailor import import_artifact
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
        moved = MovedGrid(model, spec, rest, models, catalog, calibration=calibration)
        for truth in measured.compute:
            if truth.model != model_name or truth.gpu_type != gpu or truth.oom:
                continue
            tp, mbs = truth.tensor_parallel, truth.micro_batch_size
            roof = moved.roofline(model, tp, mbs)
            fallback = moved.rescaled(tp, mbs) or roof
            chosen = unmeasured_gpu_estimate(moved, tp, mbs) or roof
            shipped.append(error(chosen, truth))
            without.append(error(fallback, truth))
    assert len(shipped) > 150
    assert np.mean(shipped) < np.mean(without)
    assert np.median(shipped) < np.median(without)


def error(estimate: ComputeProfile, truth: ComputeProfile) -> float:
    return abs(total(estimate) - total(truth)) / total(truth)
