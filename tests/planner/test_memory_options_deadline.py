"""A deadline-bound search with memory options keeps the plans it finds without them.

The operator plans under a wall-clock deadline with memory options on. With them the first
configurations of OPT-30B over the example GPUPools have no feasible plan and each costs
seconds, so before the search seeded itself with the search without options it found no
plan within 60 CPU s (benchmarks/first_plan.py). The search without options is deterministic
and only improves with time, so given more time than a search without options, the search
with them must return a plan at least as fast.

The deadline runs on a clock that advances a fixed step each time the search reads it (once
per stage of a stage DP), so it measures the search's own progress and the test answers the
same on a loaded machine as on an idle one: the search without options offers its first
plan at the 368th reading here, and finishes after about 3,400.
"""

from __future__ import annotations

import time

import pytest

from sailplan.planner.api import Objective, Planned, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.search import engine
from sailplan_dev.example_pools import EXAMPLE_POOLS

TICK_S = 0.001  # what one reading of the search's clock advances it by


class _ProgressClock:
    """time as the search sees it: monotonic() moves TICK_S per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += TICK_S
        return self.now

    @staticmethod
    def perf_counter() -> float:
        return time.perf_counter()


def _plan(memory_options: bool, deadline: float) -> Planned:
    catalog = default_catalog()
    request = PlanRequest(
        model=catalog.model("OPT-30B"),
        global_batch_size=256,
        cluster=ClusterSnapshot(pools=EXAMPLE_POOLS),
        objective=Objective(kind="throughput"),
        memory_options=memory_options,
        deadline_seconds=deadline,
    )
    result = make_plan(request, ProfileSet(), catalog)
    assert isinstance(result, Planned), result
    return result


def test_deadline_search_with_options_is_no_worse_than_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 450 readings: past the plain search's first plan (368), far before its end. With
    # options the plain search runs first for half the deadline (500 readings), longer than
    # the plain search alone
    monkeypatch.setattr(engine, "time", _ProgressClock())
    without = _plan(memory_options=False, deadline=450 * TICK_S)
    monkeypatch.setattr(engine, "time", _ProgressClock())
    with_options = _plan(memory_options=True, deadline=1000 * TICK_S)
    assert not without.exhaustive and not with_options.exhaustive
    assert without.best.predictions is not None and with_options.best.predictions is not None
    assert (
        with_options.best.predictions.samples_per_second
        >= without.best.predictions.samples_per_second * (1 - 1e-9)
    )
