"""The few NVML calls the node agent needs, behind a Protocol: the real library and a fake.

The agent (agent.py) locks SM clocks and reads energy counters through `NVML` only, so its
loop is tested on machines without a GPU against `FakeNVML`, which records every call,
refuses what the driver refuses (a clock outside the supported range:
NVML_ERROR_INVALID_ARGUMENT; locking without root or CAP_SYS_ADMIN:
NVML_ERROR_NO_PERMISSION) and integrates energy as power(clock) x time, with the power
curve of planner/energy/power.py, on an injected clock.

`PyNVML` is the real one, over `pynvml` from the `nvidia-ml-py` package (the `nodeagent`
extra), imported lazily so the operator and the tests never need it. GPUs are addressed by
NVML index; `index_of_uuid` maps a device plugin's GPU UUID to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# NVML's return codes the agent tells apart (nvml.h; pynvml exposes the same numbers).
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6

_NAMES = {
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
}


class NVMLError(Exception):
    """An NVML call failed; `code` is NVML's return code (0: NVML itself is missing)."""

    def __init__(self, code: int, what: str = "") -> None:
        self.code = code
        self.what = what
        super().__init__(code, what)

    def __str__(self) -> str:
        if self.code == 0:
            return self.what
        name = _NAMES.get(self.code, f"NVML error {self.code}")
        return f"{self.what}: {name}" if self.what else name


class NVML(Protocol):
    """What the agent needs of NVML. `index` is the NVML device index."""

    def device_count(self) -> int: ...

    def uuid(self, index: int) -> str: ...

    def index_of_uuid(self, uuid: str) -> int:
        """The index of the GPU with this UUID; NVMLError(NOT_FOUND) if none."""
        ...

    def name(self, index: int) -> str: ...

    def supported_sm_mhz(self, index: int) -> tuple[int, ...]:
        """SM clocks the GPU can be locked to (at its highest memory clock), descending."""
        ...

    def sm_mhz(self, index: int) -> int:
        """The SM clock the GPU runs at now."""
        ...

    def lock_sm_mhz(self, index: int, mhz: int) -> None:
        """nvmlDeviceSetGpuLockedClocks(mhz, mhz): needs root or CAP_SYS_ADMIN."""
        ...

    def reset_sm_mhz(self, index: int) -> None:
        """nvmlDeviceResetGpuLockedClocks: back to the driver's default boost behaviour."""
        ...

    def energy_mj(self, index: int) -> int:
        """nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver loaded."""
        ...

    def power_mw(self, index: int) -> int:
        """nvmlDeviceGetPowerUsage: milliwatts now."""
        ...


class PyNVML:
    """NVML through pynvml (package nvidia-ml-py). nvmlInit on construction."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise NVMLError(
                0, "pynvml is missing: pip install 'sailplan[nodeagent]' (nvidia-ml-py)"
            ) from None
        self._nvml: Any = pynvml
        self._call(pynvml.nvmlInit)

    def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        try:
            return function(*args)
        except self._nvml.NVMLError as error:
            raise NVMLError(int(error.value), function.__name__) from None

    def _handle(self, index: int) -> Any:
        return self._call(self._nvml.nvmlDeviceGetHandleByIndex, index)

    def device_count(self) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetCount))

    def uuid(self, index: int) -> str:
        value = self._call(self._nvml.nvmlDeviceGetUUID, self._handle(index))
        return value.decode() if isinstance(value, bytes) else str(value)

    def index_of_uuid(self, uuid: str) -> int:
        handle = self._call(self._nvml.nvmlDeviceGetHandleByUUID, uuid)
        return int(self._call(self._nvml.nvmlDeviceGetIndex, handle))

    def name(self, index: int) -> str:
        value = self._call(self._nvml.nvmlDeviceGetName, self._handle(index))
        return value.decode() if isinstance(value, bytes) else str(value)

    def supported_sm_mhz(self, index: int) -> tuple[int, ...]:
        handle = self._handle(index)
        memory = max(self._call(self._nvml.nvmlDeviceGetSupportedMemoryClocks, handle))
        clocks = self._call(self._nvml.nvmlDeviceGetSupportedGraphicsClocks, handle, memory)
        return tuple(sorted({int(c) for c in clocks}, reverse=True))

    def sm_mhz(self, index: int) -> int:
        return int(
            self._call(
                self._nvml.nvmlDeviceGetClockInfo, self._handle(index), self._nvml.NVML_CLOCK_SM
            )
        )

    def lock_sm_mhz(self, index: int, mhz: int) -> None:
        self._call(self._nvml.nvmlDeviceSetGpuLockedClocks, self._handle(index), mhz, mhz)

    def reset_sm_mhz(self, index: int) -> None:
        self._call(self._nvml.nvmlDeviceResetGpuLockedClocks, self._handle(index))

    def energy_mj(self, index: int) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetTotalEnergyConsumption, self._handle(index)))

    def power_mw(self, index: int) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetPowerUsage, self._handle(index)))


@dataclass
class FakeGPU:
    """One simulated GPU: its identity, its clock levels and its power at each clock."""

    uuid: str
    name: str
    supported_mhz: tuple[int, ...]  # descending; [0] is the default (boost) clock
    watts: Callable[[int], float]  # power under load at an SM clock
    locked_mhz: int | None = None
    energy_joules: float = 0.0

    @property
    def mhz(self) -> int:
        return self.supported_mhz[0] if self.locked_mhz is None else self.locked_mhz


@dataclass
class FakeNVML:
    """NVML without a GPU: every GPU busy all the time, power from `FakeGPU.watts`.

    `now` is the simulated clock (seconds); energy is integrated between calls, so a test
    advances `now` and computes the expected millijoules itself. `privileged=False` plays an
    agent without CAP_SYS_ADMIN: locking and resetting fail with NO_PERMISSION, reads work.
    """

    gpus: Sequence[FakeGPU]
    now: Callable[[], float]
    privileged: bool = True
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    _last: float | None = None

    def _advance(self) -> None:
        now = self.now()
        if self._last is not None and now > self._last:
            for gpu in self.gpus:
                gpu.energy_joules += gpu.watts(gpu.mhz) * (now - self._last)
        self._last = now

    def _gpu(self, index: int) -> FakeGPU:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT, f"GPU index {index}")
        return self.gpus[index]

    def device_count(self) -> int:
        return len(self.gpus)

    def uuid(self, index: int) -> str:
        return self._gpu(index).uuid

    def index_of_uuid(self, uuid: str) -> int:
        for index, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                return index
        raise NVMLError(NVML_ERROR_NOT_FOUND, f"GPU {uuid}")

    def name(self, index: int) -> str:
        return self._gpu(index).name

    def supported_sm_mhz(self, index: int) -> tuple[int, ...]:
        return self._gpu(index).supported_mhz

    def sm_mhz(self, index: int) -> int:
        return self._gpu(index).mhz

    def lock_sm_mhz(self, index: int, mhz: int) -> None:
        self.calls.append(("lock", index, mhz))
        gpu = self._gpu(index)
        if not self.privileged:
            raise NVMLError(NVML_ERROR_NO_PERMISSION, "nvmlDeviceSetGpuLockedClocks")
        if not min(gpu.supported_mhz) <= mhz <= max(gpu.supported_mhz):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT, "nvmlDeviceSetGpuLockedClocks")
        self._advance()
        gpu.locked_mhz = mhz

    def reset_sm_mhz(self, index: int) -> None:
        self.calls.append(("reset", index))
        gpu = self._gpu(index)
        if not self.privileged:
            raise NVMLError(NVML_ERROR_NO_PERMISSION, "nvmlDeviceResetGpuLockedClocks")
        self._advance()
        gpu.locked_mhz = None

    def energy_mj(self, index: int) -> int:
        gpu = self._gpu(index)
        self._advance()
        return int(gpu.energy_joules * 1000.0)

    def power_mw(self, index: int) -> int:
        gpu = self._gpu(index)
        return int(gpu.watts(gpu.mhz) * 1000.0)


def fake_gpus(gpu_type: str, count: int, *, node: str = "node") -> list[FakeGPU]:
    """`count` fake GPUs of a catalog GPU type with the energy model's clock levels and
    power (planner/energy/power.py); `--fake-nvml` and the tests use it."""
    from sailplan.planner.catalog import default_catalog
    from sailplan.planner.energy import EnergyModel

    curve = EnergyModel(default_catalog()).curve(gpu_type)
    watts = dict(zip(curve.mhz, curve.load_watts, strict=True))

    def power(mhz: int) -> float:
        # A locked clock between two modelled levels draws what the nearest level draws.
        return watts[min(watts, key=lambda level: (abs(level - mhz), -level))]

    return [
        FakeGPU(
            uuid=f"GPU-fake-{node}-{i}",
            name=f"Fake {curve.gpu_type}",
            supported_mhz=curve.mhz,
            watts=power,
        )
        for i in range(count)
    ]
