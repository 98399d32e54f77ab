"""benchmarks/gpu_power.py, the read-only power measurement for GPU machines, run against
FakeNVML on a simulated clock: energy-counter power is the fake's power, no clock is
touched, NVML names map to catalog types."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sailplan.operator.nodeagent.nvml import FakeNVML, fake_gpus
from sailplan.planner.catalog import default_catalog

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_power.py"


@pytest.fixture(scope="module")
def gpu_power() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_power", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_power"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_power_is_energy_counter_growth_over_time_and_no_clock_is_touched(
    gpu_power: ModuleType,
) -> None:
    t = [0.0]

    def wait(seconds: float) -> None:
        t[0] += seconds

    nvml = FakeNVML(gpus=fake_gpus("A100-40", 2), now=lambda: t[0])
    phases = gpu_power.measure(nvml, [0, 1], 20.0, now=lambda: t[0], wait=wait)
    power = default_catalog().gpu("A100-40").power
    assert power is not None
    for phase in phases.values():
        # at the default clock the model's load power is the board limit
        assert phase.watts == pytest.approx(power.tdp_watts, abs=0.01)
        assert phase.sm_mhz == power.max_sm_mhz
    assert nvml.calls == []  # no lock, no reset


def test_nvml_names_map_to_catalog_types(gpu_power: ModuleType) -> None:
    catalog = default_catalog()
    assert gpu_power.catalog_type("NVIDIA H100 80GB HBM3", catalog) == "H100-80"
    assert gpu_power.catalog_type("NVIDIA H200", catalog) == "H200-141"
    assert gpu_power.catalog_type("NVIDIA A100-SXM4-80GB", catalog) == "A100-80"
    assert gpu_power.catalog_type("NVIDIA A100-SXM4-40GB", catalog) == "A100-40"
    assert gpu_power.catalog_type("Tesla V100-SXM2-16GB", catalog) == "V100-16"
    assert gpu_power.catalog_type("Fake A100-40", catalog) == "A100-40"
    assert gpu_power.catalog_type("Radeon Instinct", catalog) is None


def test_the_script_prints_a_table_with_fake_gpus() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--fake", "A100-40:1", "--seconds", "0.2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "| 0 Fake A100-40 | A100-40 |" in done.stdout
