"""Each rank's GPU energy per step, and the job's sum over ranks that rank 0 reports.

The NVML side is the node agent's FakeNVML (energy = power(clock) x simulated time), so
the expected joules come from the fake GPUs' power curve and the seconds the test
advances, not from the code under test. The sum runs through the trainer's own control
all-reduce (sailplan.trainer.control) across two gloo processes.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from rank_memory import join, spawn, write_report

from sailplan.operator.nodeagent.nvml import (
    NVML_ERROR_NOT_SUPPORTED,
    FakeGPU,
    FakeNVML,
    NVMLError,
    fake_gpus,
)
from sailplan.trainer.control import reduce_step
from sailplan.trainer.energy import StepEnergy, gpu_meter

GPU_TYPE = "A100-40"
# Seconds each rank's step takes in the two-process test: different on purpose, so a sum
# that took one rank's energy twice would not match.
STEP_SECONDS = (2.0, 3.5)


def fake(clock: list[float]) -> tuple[FakeNVML, FakeGPU]:
    gpu = fake_gpus(GPU_TYPE, 1)[0]
    return FakeNVML(gpus=[gpu], now=lambda: clock[0]), gpu


def counter(nvml: FakeNVML) -> StepEnergy:
    return StepEnergy(lambda: nvml.energy_mj(0))


def test_a_step_is_the_counters_growth_between_two_boundaries() -> None:
    clock = [100.0]
    nvml, gpu = fake(clock)
    meter = counter(nvml)
    meter.start()
    clock[0] += 1.5
    assert meter.step() == pytest.approx(gpu.watts(gpu.mhz) * 1.5, abs=1e-3)
    nvml.lock_sm_mhz(0, gpu.supported_mhz[-1])  # a lower clock draws less
    clock[0] += 1.5
    low = meter.step()
    assert low == pytest.approx(gpu.watts(gpu.supported_mhz[-1]) * 1.5, abs=1e-3)
    assert low is not None and low < gpu.watts(gpu.supported_mhz[0]) * 1.5


def test_a_counter_that_goes_back_restarts_the_window_and_a_failing_one_turns_it_off() -> None:
    clock = [0.0]
    nvml, gpu = fake(clock)
    meter = counter(nvml)
    meter.start()
    clock[0] += 1.0
    assert meter.step() == pytest.approx(gpu.watts(gpu.mhz) * 1.0, abs=1e-3)
    gpu.energy_joules = 0.0  # the driver reloaded: the counter starts again
    assert meter.step() is None
    clock[0] += 2.0
    assert meter.step() == pytest.approx(gpu.watts(gpu.mhz) * 2.0, abs=1e-3)

    class Refusing(FakeNVML):
        def energy_mj(self, index: int) -> int:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetTotalEnergyConsumption")

    refusing = counter(Refusing(gpus=[gpu], now=lambda: clock[0]))
    refusing.start()  # logs once, no exception
    assert not refusing.on and refusing.step() is None


def test_no_gpu_means_no_meter() -> None:
    meter = gpu_meter(torch.device("cpu"))
    assert not meter.on
    meter.start()
    assert meter.step() is None


UUID = "5b0c7a1e-2f4d-4e8a-9c3b-1d2e3f4a5b6c"  # torch's form: no "GPU-"


@pytest.fixture
def cuda_device(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A CUDA device 1 as torch describes it, on a machine without one; the synchronize
    calls the meter makes are recorded."""
    synced: list[str] = []
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(uuid=UUID)
    )
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: synced.append(str(device)))
    return synced


def stand_in_pynvml(monkeypatch: pytest.MonkeyPatch, counts: list[int] | Exception) -> Any:
    """A `pynvml` module with two GPUs by UUID; GPU-<UUID>'s counter reads `counts` in turn
    (or raises)."""
    module: Any = types.ModuleType("pynvml")
    module.asked = []
    module.nvmlInit = lambda: None
    handles = {f"GPU-{UUID}": "h1", "GPU-other": "h0"}

    def by_uuid(uuid: str) -> str:
        module.asked.append(uuid)
        return handles[uuid]

    def energy(handle: str) -> int:
        assert handle == "h1"
        if isinstance(counts, Exception):
            raise counts
        return counts.pop(0)

    module.nvmlDeviceGetHandleByUUID = by_uuid
    module.nvmlDeviceGetTotalEnergyConsumption = energy
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def test_a_cuda_devices_meter_reads_the_nvml_gpu_with_its_uuid(
    monkeypatch: pytest.MonkeyPatch, cuda_device: list[str]
) -> None:
    pynvml = stand_in_pynvml(monkeypatch, [1_000, 5_000, 12_500, 20_000])  # mJ
    meter = gpu_meter(torch.device("cuda", 1))  # reads once: is the counter there?
    assert meter.on and pynvml.asked == [f"GPU-{UUID}"]
    meter.start()
    assert meter.step() == 7.5
    assert meter.step() == 7.5
    assert cuda_device == ["cuda:1"] * 3  # the GPU's queued work finishes before each read


def test_without_pynvml_or_the_counter_a_cuda_rank_trains_without_a_meter(
    monkeypatch: pytest.MonkeyPatch, cuda_device: list[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: ImportError
    assert not gpu_meter(torch.device("cuda", 0)).on
    stand_in_pynvml(monkeypatch, RuntimeError("NVML: Not Supported"))  # e.g. a MIG slice
    meter = gpu_meter(torch.device("cuda", 0))
    assert not meter.on
    meter.start()
    assert meter.step() is None


def _rank(rank: int, port: int, tmp: Path) -> None:
    """One rank: two steps through the control all-reduce, measuring on both ranks, then
    one where rank 1 cannot measure (and asks to stop)."""
    join(rank, port)
    group = torch.distributed.new_group([0, 1], backend="gloo")
    clock = [0.0]
    nvml, gpu = fake(clock)
    if rank == 1:
        nvml.lock_sm_mhz(0, gpu.supported_mhz[-1])
    meter = counter(nvml)
    meter.start()
    report: dict[str, object] = {"mhz": gpu.mhz, "local": [], "totals": []}
    for _ in range(2):
        clock[0] += STEP_SECONDS[rank]
        joules = meter.step()
        totals = reduce_step(
            stopping=False, loss_share=1.0 + rank, joules=joules, group=group, world_size=2
        )
        report["local"].append(joules)  # type: ignore[attr-defined]
        report["totals"].append([totals.stop, totals.loss, totals.joules])  # type: ignore[attr-defined]
    if rank == 1:
        meter = StepEnergy(None)
    clock[0] += STEP_SECONDS[rank]
    totals = reduce_step(
        stopping=rank == 1, loss_share=0.5, joules=meter.step(), group=group, world_size=2
    )
    report["partial"] = [totals.stop, totals.loss, totals.joules]
    write_report(tmp, rank, report)
    torch.distributed.destroy_process_group()


@pytest.mark.trainer
def test_the_steps_energy_is_summed_over_the_ranks_in_the_control_all_reduce(
    tmp_path: Path,
) -> None:
    reports = spawn(_rank, tmp_path)
    gpu = fake_gpus(GPU_TYPE, 1)[0]
    expected = [gpu.watts(r["mhz"]) * STEP_SECONDS[i] for i, r in enumerate(reports)]
    assert reports[0]["mhz"] > reports[1]["mhz"]  # rank 1 runs locked lower
    for rank, report in enumerate(reports):
        assert report["local"] == [pytest.approx(expected[rank], abs=1e-3)] * 2
        for stop, loss, joules in report["totals"]:
            assert (stop, loss) == (False, 3.0)
            assert joules == pytest.approx(sum(expected), abs=2e-3)
        # one rank without a measurement: no energy for the job, not half of it
        assert report["partial"] == [True, 1.0, None]


def _trainer_rank(rank: int, port: int, plan_json: str, config_json: str, tmp: Path) -> None:
    """One rank of the real Trainer, its GPU a FakeNVML GPU whose simulated clock moves
    STEP_SECONDS[rank] per counter read (one read per step boundary)."""
    import os

    from sailplan.planner.plan import Plan
    from sailplan.planner.workerenv import TrainerConfig
    from sailplan.trainer import engine
    from sailplan.trainer.stopping import StopSignal

    os.environ["SAILPLAN_METRICS_PORT"] = "0"
    termination = tmp / f"termination-{rank}"
    termination.write_text("")  # the kubelet's file exists in a container
    os.environ["SAILPLAN_TERMINATION_LOG"] = str(termination)
    ticks = [0.0]

    def now() -> float:
        ticks[0] += STEP_SECONDS[rank]
        return ticks[0]

    gpu = fake_gpus(GPU_TYPE, 1)[0]
    nvml = FakeNVML(gpus=[gpu], now=now)
    if rank == 1:
        gpu.locked_mhz = gpu.supported_mhz[-1]
    engine.gpu_meter = lambda device: counter(nvml)  # type: ignore[assignment]
    device = engine.init_world(
        rank=rank,
        local_rank=0,
        world_size=2,
        master_addr="127.0.0.1",
        master_port=port,
        timeout_s=120,
    )
    plan = Plan.from_json(plan_json)
    config = TrainerConfig.model_validate_json(config_json)
    engine.Trainer(
        plan, config, rank=rank, local_rank=0, device=device, generation=1, stop=StopSignal(None, 1)
    ).run()
    torch.distributed.destroy_process_group()
    write_report(tmp, rank, {"mhz": gpu.mhz})


@pytest.mark.trainer
def test_the_trainer_reports_the_jobs_joules_per_step_from_every_stage(tmp_path: Path) -> None:
    """Two pipeline stages (only the last owns the loss): rank 0's final progress, which
    the operator copies into status.progress, carries both GPUs' energy of the last step."""
    from trainer_harness import TINY, make_plan, trainer_config

    from sailplan.planner.workerenv import TrainerProgress

    plan = make_plan(TINY, [(0, 3, 1), (3, TINY.num_layers, 1)], 1, 1, 2)
    config = trainer_config(tmp_path, 3)
    reports = spawn(_trainer_rank, tmp_path, plan.to_json(), config.model_dump_json())
    gpu = fake_gpus(GPU_TYPE, 1)[0]
    expected = sum(gpu.watts(r["mhz"]) * STEP_SECONDS[i] for i, r in enumerate(reports))
    final = TrainerProgress.model_validate_json((tmp_path / "termination-0").read_text())
    assert final.step == 3
    assert final.joules_per_step == pytest.approx(expected, abs=2e-3)
    assert (tmp_path / "termination-1").read_text() == ""  # only global rank 0 reports
