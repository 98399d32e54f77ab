"""PyNVML (operator/nodeagent/nvml.py), the real NVML adapter, over a stand-in `pynvml`
module: the calls and arguments it makes, the clock list it builds, and NVML errors turned
into NVMLError with NVML's code. (On a GPU machine the same adapter runs over the driver.)"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from sailplan.operator.nodeagent.nvml import (
    NVML_ERROR_NO_PERMISSION,
    NVMLError,
    PyNVML,
)


class _Error(Exception):
    def __init__(self, value: int) -> None:
        self.value = value


@pytest.fixture
def pynvml(monkeypatch: pytest.MonkeyPatch) -> Any:
    module: Any = types.ModuleType("pynvml")
    module.calls = []
    module.NVMLError = _Error
    module.NVML_CLOCK_SM = 1

    def record(name: str, result: Any = None) -> Any:
        def function(*args: Any) -> Any:
            module.calls.append((name, *args))
            if isinstance(result, Exception):
                raise result
            return result(*args) if callable(result) else result

        function.__name__ = name
        return function

    module.nvmlInit = record("nvmlInit")
    module.nvmlDeviceGetCount = record("nvmlDeviceGetCount", 2)
    module.nvmlDeviceGetHandleByIndex = record("nvmlDeviceGetHandleByIndex", lambda i: f"h{i}")
    module.nvmlDeviceGetHandleByUUID = record("nvmlDeviceGetHandleByUUID", "h1")
    module.nvmlDeviceGetIndex = record("nvmlDeviceGetIndex", 1)
    module.nvmlDeviceGetUUID = record("nvmlDeviceGetUUID", b"GPU-1234")
    module.nvmlDeviceGetName = record("nvmlDeviceGetName", "NVIDIA H100 80GB HBM3")
    module.nvmlDeviceGetSupportedMemoryClocks = record(
        "nvmlDeviceGetSupportedMemoryClocks", [2619, 1593]
    )
    module.nvmlDeviceGetSupportedGraphicsClocks = record(
        "nvmlDeviceGetSupportedGraphicsClocks", [1965, 1980, 345, 1965]
    )
    module.nvmlDeviceGetClockInfo = record("nvmlDeviceGetClockInfo", 1980)
    module.nvmlDeviceSetGpuLockedClocks = record(
        "nvmlDeviceSetGpuLockedClocks", _Error(NVML_ERROR_NO_PERMISSION)
    )
    module.nvmlDeviceResetGpuLockedClocks = record("nvmlDeviceResetGpuLockedClocks")
    module.nvmlDeviceGetTotalEnergyConsumption = record(
        "nvmlDeviceGetTotalEnergyConsumption", 123456
    )
    module.nvmlDeviceGetPowerUsage = record("nvmlDeviceGetPowerUsage", 301234)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def test_reads_go_to_the_right_nvml_calls(pynvml: Any) -> None:
    nvml = PyNVML()
    assert nvml.device_count() == 2
    assert nvml.uuid(1) == "GPU-1234"
    assert nvml.index_of_uuid("GPU-1234") == 1
    assert nvml.name(0) == "NVIDIA H100 80GB HBM3"
    # graphics clocks at the highest memory clock, distinct, fastest first
    assert nvml.supported_sm_mhz(0) == (1980, 1965, 345)
    assert ("nvmlDeviceGetSupportedGraphicsClocks", "h0", 2619) in pynvml.calls
    assert nvml.sm_mhz(0) == 1980
    assert ("nvmlDeviceGetClockInfo", "h0", 1) in pynvml.calls
    assert nvml.energy_mj(1) == 123456
    assert nvml.power_mw(1) == 301234
    assert pynvml.calls[0] == ("nvmlInit",)


def test_locking_sets_min_and_max_to_the_clock_and_nvml_errors_keep_their_code(
    pynvml: Any,
) -> None:
    nvml = PyNVML()
    with pytest.raises(NVMLError) as refused:
        nvml.lock_sm_mhz(1, 1410)
    assert refused.value.code == NVML_ERROR_NO_PERMISSION
    assert str(refused.value) == "nvmlDeviceSetGpuLockedClocks: Insufficient Permissions"
    assert ("nvmlDeviceSetGpuLockedClocks", "h1", 1410, 1410) in pynvml.calls
    nvml.reset_sm_mhz(1)
    assert pynvml.calls[-1] == ("nvmlDeviceResetGpuLockedClocks", "h1")


def test_without_pynvml_the_error_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with pytest.raises(NVMLError) as missing:
        PyNVML()
    assert str(missing.value) == (
        "pynvml is missing: pip install 'sailplan[nodeagent]' (nvidia-ml-py)"
    )
