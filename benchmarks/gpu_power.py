"""GPU power at the default clocks, measured through NVML, against the energy model.

Read-only: it never locks or resets a clock (a shared GPU's settings are not ours to
change), it only reads what the node agent reads (operator/nodeagent/nvml.py): the SM clock,
the total energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ) and the power
(nvmlDeviceGetPowerUsage). For every GPU it measures two phases of `--seconds` each:

- idle: nothing of ours runs; energy counter growth / time, against the catalog's
  idle_watts (an estimate, docs/architecture/planner.md#energy-model);
- load (`--load`, needs torch and CUDA): bf16 matrix products on every GPU, after a
  warm-up; energy counter growth / time and the mean SM clock, against the model's
  P(f) = P_idle + (P_tdp - P_idle)((1 - k) + k (f / f_max)^3) at that clock.

    python benchmarks/gpu_power.py --seconds 20 --load
    python benchmarks/gpu_power.py --fake A100-40:2      # no GPU: FakeNVML (tests the script)

A GPU whose NVML name maps to no catalog type is measured and printed without a model
column. Power drawn by other processes on a shared GPU is in the numbers, so run it on an
otherwise idle GPU. With --fake both phases are under load (FakeNVML's GPUs always are).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sailplan.operator.nodeagent.nvml import NVML, FakeNVML, NVMLError, fake_gpus
from sailplan.planner.catalog import Catalog, default_catalog
from sailplan.planner.energy import modelled_watts

# NVML device names -> catalog GPU types: (all of these substrings, type), first match wins.
_NAMES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("H200",), "H200-141"),
    (("GH200",), "GH200-96"),
    (("H100",), "H100-80"),
    (("A100", "80GB"), "A100-80"),
    (("A100",), "A100-40"),
    (("V100",), "V100-16"),
    (("L4",), "L4"),
    (("T4",), "T4"),
)


def catalog_type(nvml_name: str, catalog: Catalog) -> str | None:
    """The catalog GPU type of an NVML device name ('NVIDIA H100 80GB HBM3' -> H100-80)."""
    upper = nvml_name.upper()
    if upper.startswith("FAKE "):  # FakeNVML names its GPUs 'Fake <type>'
        return catalog.resolve_gpu(nvml_name[5:])
    for parts, name in _NAMES:
        if all(part in upper for part in parts):
            return name
    return None


@dataclass(frozen=True)
class Phase:
    """One GPU over one phase: mean power from the energy counter and the mean SM clock."""

    watts: float
    sm_mhz: float


def measure(
    nvml: NVML,
    gpus: Sequence[int],
    seconds: float,
    *,
    now: Callable[[], float] = time.monotonic,
    wait: Callable[[float], None] = time.sleep,
    samples: int = 10,
) -> dict[int, Phase]:
    """Mean power (energy counter growth / elapsed time) and mean SM clock per GPU."""
    start = {g: nvml.energy_mj(g) for g in gpus}
    began = now()
    clocks: dict[int, list[int]] = {g: [] for g in gpus}
    for _ in range(samples):
        wait(seconds / samples)
        for g in gpus:
            clocks[g].append(nvml.sm_mhz(g))
    elapsed = now() - began
    return {
        g: Phase(
            watts=(nvml.energy_mj(g) - start[g]) / 1000.0 / elapsed,
            sm_mhz=sum(clocks[g]) / len(clocks[g]),
        )
        for g in gpus
    }


def _load(gpus: Sequence[int], stop: threading.Event) -> list[threading.Thread]:
    import torch  # the trainer extra; only --load needs it

    def run(index: int) -> None:
        device = torch.device(f"cuda:{index}")
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        while not stop.is_set():
            for _ in range(20):
                a = (a @ b).clamp_(-1, 1)
            torch.cuda.synchronize(device)

    # NVML and CUDA number the GPUs alike when CUDA_DEVICE_ORDER=PCI_BUS_ID, as set below.
    threads = [threading.Thread(target=run, args=(g,), daemon=True) for g in gpus]
    for thread in threads:
        thread.start()
    return threads


def table(
    nvml: NVML, idle: dict[int, Phase], load: dict[int, Phase] | None, catalog: Catalog
) -> str:
    rows = [
        "| GPU | type | idle W (model) | load SM MHz | load W | model P(f) W | error |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in sorted(idle):
        name = nvml.name(g)
        kind = catalog_type(name, catalog)
        spec = catalog.gpu(kind) if kind else None
        power = spec.power if spec else None
        idle_model = f"{power.idle_watts:.0f}" if power else "-"
        cells = [f"{g} {name}", kind or "-", f"{idle[g].watts:.1f} ({idle_model})"]
        if load is None:
            cells += ["-", "-", "-", "-"]
        else:
            phase = load[g]
            model = modelled_watts(spec, round(phase.sm_mhz)) if spec and power else None
            cells += [
                f"{phase.sm_mhz:.0f}",
                f"{phase.watts:.1f}",
                f"{model:.1f}" if model is not None else "-",
                f"{(phase.watts - model) / model:+.1%}" if model else "-",
            ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--load", action="store_true", help="bf16 matmuls on every GPU (torch)")
    parser.add_argument("--fake", metavar="TYPE:COUNT", help="FakeNVML instead of the driver")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        print("gpu_power: --seconds must be above 0", file=sys.stderr)
        return 2
    catalog = default_catalog()
    nvml: NVML
    try:
        if args.fake:
            kind, _, count = args.fake.partition(":")
            nvml = FakeNVML(gpus=fake_gpus(kind, int(count or 1)), now=time.monotonic)
        else:
            from sailplan.operator.nodeagent.nvml import PyNVML

            nvml = PyNVML()
    except (NVMLError, ValueError, LookupError) as error:
        print(f"gpu_power: {error}", file=sys.stderr)
        return 2
    gpus = list(range(nvml.device_count()))
    print(f"{len(gpus)} GPU(s); clocks left as they are; {args.seconds:g} s per phase")
    idle = measure(nvml, gpus, args.seconds)
    load = None
    if args.load and not args.fake:
        import os

        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        stop = threading.Event()
        threads = _load(gpus, stop)
        time.sleep(min(5.0, args.seconds))  # warm-up: clocks and power settle
        load = measure(nvml, gpus, args.seconds)
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    elif args.fake:
        load = measure(nvml, gpus, args.seconds)  # FakeNVML's GPUs are always under load
    print(table(nvml, idle, load, catalog))
    return 0


if __name__ == "__main__":
    sys.exit(main())
