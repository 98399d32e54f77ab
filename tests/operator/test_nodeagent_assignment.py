"""The node agent's pure decision (operator/nodeagent/assignment.py) and energy windows
(energy.py): which GPU gets which clock, what is reset, what is never touched."""

from __future__ import annotations

import pytest

from sailplan.operator.nodeagent.assignment import (
    OPT_IN_ANNOTATION,
    WorkerGPUs,
    assign,
    nearest_supported,
    opt_in,
)
from sailplan.operator.nodeagent.energy import EnergyMeter

LEVELS = (1410, 1395, 1380, 1365, 1350, 1200)
SUPPORTED = {0: LEVELS, 1: LEVELS, 2: LEVELS, 3: LEVELS}


def _worker(
    name: str,
    gpus: tuple[int, ...],
    *,
    mhz: int | None = 1365,
    opted_in: bool = True,
    running: bool = True,
    stage: int = 0,
) -> WorkerGPUs:
    return WorkerGPUs(
        namespace="team-a",
        name=name,
        job="opt",
        stage=stage,
        replica=0,
        gpus=gpus,
        running=running,
        opted_in=opted_in,
        mhz=mhz,
    )


def test_only_gpus_of_opted_in_running_workers_are_locked() -> None:
    result = assign(
        [
            _worker("w0", (0, 1), mhz=1365, stage=0),
            _worker("w1", (2,), mhz=1350, stage=1),
            _worker("other-job", (3,), opted_in=False),
        ],
        SUPPORTED,
        locked={},
    )
    assert result.lock == ((0, 1365), (1, 1365), (2, 1350))
    assert result.reset == ()
    assert set(result.desired) == {0, 1, 2}
    assert result.desired[2].stage == 1
    assert result.desired[0].pod == "w0"


def test_gpus_the_agent_never_locked_are_never_touched() -> None:
    # GPU 3 belongs to a job that did not opt in, GPU 2 to no pod at all: neither is in
    # the lock or the reset list, even though nothing is desired for them.
    result = assign([_worker("other", (3,), opted_in=False)], SUPPORTED, locked={0: 1365})
    assert result.lock == ()
    assert result.reset == (0,)


@pytest.mark.parametrize(
    "gone",
    [
        [],  # the pod was deleted
        [_worker("w0", (0, 1), running=False)],  # deleting, or finished
        [_worker("w0", (0, 1), opted_in=False)],  # the job dropped the annotation
        [_worker("w0", (0, 1), mhz=None)],  # the new plan has no clock for it
    ],
)
def test_gpus_whose_pod_went_are_reset(gone: list[WorkerGPUs]) -> None:
    result = assign(gone, SUPPORTED, locked={0: 1365, 1: 1365})
    assert result.reset == (0, 1)
    assert result.lock == ()
    assert result.desired == {}


def test_a_gpu_already_at_its_clock_gets_no_call_and_a_changed_clock_is_relocked() -> None:
    result = assign([_worker("w0", (0, 1), mhz=1365)], SUPPORTED, locked={0: 1365, 1: 1410})
    assert result.lock == ((1, 1365),)
    assert result.reset == ()


def test_an_unsupported_clock_is_clamped_to_the_nearest_supported_and_said() -> None:
    result = assign([_worker("w0", (0,), mhz=1372)], SUPPORTED, locked={})
    # 1372 is 7 MHz from 1365 and 8 from 1380
    assert result.lock == ((0, 1365),)
    assert result.desired[0].requested_mhz == 1372
    (note,) = result.notes
    assert "1372 MHz" in note and "1365 MHz" in note and "team-a/w0" in note


def test_clamping_ties_go_up_and_out_of_range_clocks_go_to_the_ends() -> None:
    assert nearest_supported(1290, (1380, 1200)) == 1380  # 90 either way: no slowdown
    assert nearest_supported(2000, LEVELS) == 1410
    assert nearest_supported(300, LEVELS) == 1200


def test_a_gpu_claimed_twice_goes_to_one_pod_and_a_gpu_not_on_the_node_is_skipped() -> None:
    result = assign(
        [_worker("a", (0,), mhz=1365), _worker("b", (0, 7), mhz=1200)], SUPPORTED, locked={}
    )
    assert result.lock == ((0, 1365),)
    assert any("GPU 0 is already a's" in n for n in result.notes)
    assert any("GPU 7 is not on this node" in n for n in result.notes)


def test_energy_per_step_is_the_counter_growth_over_the_steps_done() -> None:
    meter = EnergyMeter()
    assert meter.observe("g", 1_000_000, None) is None
    assert meter.observe("g", 1_500_000, 10) is None  # the window starts at step 10
    assert meter.observe("g", 1_800_000, 10) is None  # no step done yet
    assert meter.observe("g", 3_500_000, 14) == pytest.approx((3_500_000 - 1_500_000) / 1000 / 4)
    # the next window starts where this one ended
    assert meter.observe("g", 4_100_000, 16) == pytest.approx(600_000 / 1000 / 2)
    assert meter.total_joules("g", 4_100_000) == pytest.approx(3100.0)


def test_a_counter_or_step_going_backwards_restarts_the_window() -> None:
    meter = EnergyMeter()
    meter.observe("g", 5_000, 100)
    meter.observe("g", 9_000, 102)
    # a replan resumed from checkpoint step 90: the window restarts, the last value stays
    assert meter.observe("g", 10_000, 90) == pytest.approx(2.0)
    assert meter.observe("g", 16_000, 93) == pytest.approx(2.0)
    # the driver reloaded (counter back near zero): a new window and no value yet
    assert meter.observe("g", 100, 95) is None
    meter.forget([])
    assert meter.total_joules("g", 100) == 0.0


def test_the_spec_field_opts_in_and_the_annotation_is_a_deprecated_alias() -> None:
    def job(clocks: str | None, annotation: str | None) -> dict[str, object]:
        return {
            "metadata": {"annotations": {OPT_IN_ANNOTATION: annotation} if annotation else {}},
            "spec": {"energy": {"clocks": clocks}} if clocks else {},
        }

    assert opt_in(job("NoSlowdown", None)) == (True, False)
    assert opt_in(job("Default", None)) == (False, False)
    assert opt_in(job(None, None)) == (False, False)
    # the API server fills in clocks: Default, so the annotation must still count then
    assert opt_in(job("Default", "no-slowdown")) == (True, True)
    assert opt_in(job(None, "no-slowdown")) == (True, True)
    assert opt_in(job(None, "yes")) == (False, False)
    assert opt_in({}) == (False, False)
