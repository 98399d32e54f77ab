"""Power against SM clock, per GPU type, and a stage's time at a lowered clock.

The model (docs/architecture/planner.md#energy-model lists every constant with its source):

- Power while computing at SM clock f (x = f / f_max):
      P(f) = P_idle + (P_tdp - P_idle) * ((1 - k) + k * x^3)
  Dense training draws the board limit (TDP) at the default, maximum clock. Of the power
  above idle, the share k scales with the SM clock as dynamic CMOS power does when the
  voltage follows the clock (alpha C V^2 f with V ~ f: f^3); the rest (HBM, memory
  controller, uncore, leakage above idle) does not follow the SM clock. k = 0.54 is fitted to
  the only public per-frequency training profile we found, the Perseus authors' example in
  the Zeus docs (docs/perseus/index.md: an A40, 300 W, drawing 304 W at 1740 MHz and
  163 W at 690 MHz; 30 W idle assumed): SM_CLOCK_POWER_SHARE.
- Time at clock f: the part of a stage's forward/backward that is compute bound scales as
  f_max / f, the memory-bound part and the tensor-parallel all-reduces do not:
      t(f) = t(f_max) * ((1 - s) + s * f_max / f)
  with s, the clock-scaled share, from a roofline of the stage's layers
  (clock_scaled_share): tensor-core FLOPs / peak against the bytes its element-wise work
  moves / memory bandwidth plus its TP all-reduces.
- While a GPU waits (pipeline bubbles, blocked in NCCL, the gradient all-reduce) it draws
  the blocking power (catalog blocking_watts, default idle_watts): Perseus' P_blocking.

Measured curves override the model: a PowerProfile (a profile document like the compute and
network ones, planner/profiles/types.py, read from a profile directory or the operator's
profile store and carried in ProfileSet.power) gives, per SM clock, the measured power under
load and (optionally) the measured time relative to the maximum clock.

Pure: no I/O; the catalog and profiles are passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from sailplan.planner.catalog import Catalog, CatalogError, GPUSpec
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.memory import layer_activation_bytes
from sailplan.planner.profiles.types import PowerProfile

# Share of the above-idle load power that follows the SM clock (cubic): fitted to the two
# ends of the Perseus example profile (Zeus docs, docs/perseus/index.md) -- 304 W at
# 1740 MHz, 162.8 W at 690 MHz, 161.2 W at 660 MHz on a 300 W A40 (30 W idle assumed):
# (162.8 - 30) / (300 - 30) = 1 - k (1 - (690/1740)^3) gives k = 0.54, and the model then
# predicts 161.7 W at 660 MHz.
SM_CLOCK_POWER_SHARE = 0.54
# Exponent of the clock-scaled power: dynamic power alpha C V^2 f with the voltage
# following the clock under DVFS (Mei, Wang, Chu, "A survey and measurement study of GPU
# DVFS on energy conservation", Digital Communications and Networks 3(2), 2017).
SM_CLOCK_POWER_EXPONENT = 3.0
# Bytes a layer's element-wise work moves per byte of activation it keeps for backward:
# written in forward, read in backward, its gradient written in backward.
ACTIVATION_TRAFFIC_FACTOR = 3.0
# Weight bytes moved per parameter and micro-batch: fp16 weights read in forward and in
# backward, the fp16 gradient written (accumulated) in backward.
WEIGHT_TRAFFIC_BYTES_PER_PARAM = 6.0


class EnergyError(LookupError):
    """The energy model cannot price something: a GPU type without power data, a bad
    profile. One line, listing what is known."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class PowerCurve:
    """What the frequency planner needs of one GPU type: its clock levels, fastest first."""

    gpu_type: str
    mhz: tuple[int, ...]  # descending; mhz[0] is the default (maximum) clock
    load_watts: tuple[float, ...]  # power while computing at each clock
    time_factor: tuple[float, ...] | None  # measured t(f)/t(f_max); None = roofline model
    blocking_watts: float
    source: Literal["datasheet", "measured"]

    @property
    def max_mhz(self) -> int:
        return self.mhz[0]

    def time_factors(self, clock_scaled_share: float) -> tuple[float, ...]:
        """t(f) / t(f_max) at every level for a stage whose clock-scaled share is given."""
        if self.time_factor is not None:
            return self.time_factor
        s = min(1.0, max(0.0, clock_scaled_share))
        top = self.mhz[0]
        return tuple((1.0 - s) + s * top / f for f in self.mhz)


def modelled_watts(spec: GPUSpec, mhz: int) -> float:
    """P(f) of the datasheet model (module docstring)."""
    power = spec.power
    assert power is not None
    x = mhz / power.max_sm_mhz
    dynamic: float = (1.0 - SM_CLOCK_POWER_SHARE) + SM_CLOCK_POWER_SHARE * float(
        x**SM_CLOCK_POWER_EXPONENT
    )
    return power.idle_watts + (power.tdp_watts - power.idle_watts) * dynamic


class EnergyModel:
    """Power curves per GPU type: a measured PowerProfile where given, else the catalog."""

    def __init__(self, catalog: Catalog, profiles: Iterable[PowerProfile] = ()) -> None:
        self.catalog = catalog
        self._profiles: dict[str, PowerProfile] = {}
        for profile in profiles:
            try:
                name = catalog.resolve_gpu(profile.gpu_type)
            except CatalogError as error:
                raise EnergyError(f"PowerProfile: {error}") from None
            self._profiles[name] = profile
        self._curves: dict[str, PowerCurve] = {}

    def known_gpus(self) -> tuple[str, ...]:
        with_power = {n for n, g in self.catalog.gpus.items() if g.power is not None}
        return tuple(sorted(with_power | set(self._profiles)))

    def curve(self, gpu_type: str) -> PowerCurve:
        """The GPU type's curve; EnergyError names the GPU types that have one."""
        try:
            name = self.catalog.resolve_gpu(gpu_type)
        except CatalogError:
            name = gpu_type
        cached = self._curves.get(name)
        if cached is not None:
            return cached
        profile = self._profiles.get(name)
        spec = self.catalog.gpus.get(name)
        if profile is not None:
            points = sorted(profile.points, key=lambda p: -p.sm_mhz)
            timed = points[0].time_factor is not None
            curve = PowerCurve(
                gpu_type=name,
                mhz=tuple(p.sm_mhz for p in points),
                load_watts=tuple(p.watts for p in points),
                time_factor=tuple(p.time_factor or 1.0 for p in points) if timed else None,
                blocking_watts=(
                    profile.idle_watts if profile.blocking_watts is None else profile.blocking_watts
                ),
                source="measured",
            )
        elif spec is not None and spec.power is not None:
            power = spec.power
            levels = list(range(power.max_sm_mhz, power.min_sm_mhz - 1, -power.sm_step_mhz))
            curve = PowerCurve(
                gpu_type=name,
                mhz=tuple(levels),
                load_watts=tuple(modelled_watts(spec, f) for f in levels),
                time_factor=None,
                blocking_watts=power.block_watts,
                source="datasheet",
            )
        else:
            raise EnergyError(
                f"no power data for GPU type {gpu_type!r} (energy model); known: "
                f"{', '.join(self.known_gpus()) or 'none'}; add catalog power fields or a "
                "PowerProfile"
            )
        self._curves[name] = curve
        return curve


def roofline_parts(
    model: ModelSpec,
    spec: GPUSpec,
    layer: int,
    *,
    tp: int,
    mbs: int,
    flash_attention: bool = False,
) -> tuple[float, float]:
    """(clock-scaled, not clock-scaled) roofline seconds of one layer's forward+backward:
    clock_scaled_share's two sums for a single layer."""
    from sailplan.planner.profiles.estimate import tensor_parallel_seconds
    from sailplan.planner.profiles.flops import layer_forward_flops

    compute = 3.0 * layer_forward_flops(model, layer, tp, mbs) / spec.peak_flops
    moved = ACTIVATION_TRAFFIC_FACTOR * layer_activation_bytes(
        model, layer, tp, mbs, flash_attention
    ) + WEIGHT_TRAFFIC_BYTES_PER_PARAM * model.layer_parameters(layer, tp)
    tp_forward, tp_backward = tensor_parallel_seconds(model, layer, tp, mbs, spec)
    return compute, moved / spec.memory_bandwidth_bytes_per_s + tp_forward + tp_backward


def clock_scaled_share(
    model: ModelSpec,
    spec: GPUSpec,
    layer_start: int,
    layer_end: int,
    *,
    tp: int,
    mbs: int,
    flash_attention: bool = False,
) -> float:
    """Share of layers [layer_start, layer_end)'s forward+backward time that scales with the
    SM clock: a roofline (Williams, Waterman, Patterson, CACM 52(4), 2009) per layer.

    Compute-bound: 3 x forward FLOPs (backward = 2 x forward) at the datasheet peak.
    Not clock-bound: the bytes the element-wise work moves (ACTIVATION_TRAFFIC_FACTOR x the
    activations kept for backward, Korthikanti et al.) plus the weights read and gradients
    written, at the datasheet memory bandwidth; and the layer's tensor-parallel all-reduces
    (a network time). The measured or estimated time of the stage is split in this ratio.
    """
    compute = 0.0
    other = 0.0
    for layer in range(layer_start, layer_end):
        c, o = roofline_parts(model, spec, layer, tp=tp, mbs=mbs, flash_attention=flash_attention)
        compute += c
        other += o
    total = compute + other
    return compute / total if total > 0 else 0.0
