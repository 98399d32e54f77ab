"""When the search offers its first feasible plan, with and without memory options.

The operator plans under a wall-clock deadline (spec.planning.deadlineSeconds) and serves
the best plan found by then, so what matters to it is how soon the search has one. This
times the operator's deadline test case (tests/operator/test_planning_service.py's
large_request: OPT-30B, global batch 256, over the example GPUPools, roofline profiles):
CPU and wall seconds from make_plan's start (profile completion included) to the first
plan offered to the top-k, and the stage DPs that ran before it. The search runs under
the operator's default planning deadline (--deadline), as the operator's does: with memory
options it then first searches without them (engine.Search._seed_without_options). The
search is stopped at its first plan; --limit bounds the CPU seconds spent waiting for one.

    python benchmarks/first_plan.py                 # with and without memory options
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any

from sailplan.planner.api import Objective, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.search import engine, objective
from sailplan_dev.example_pools import EXAMPLE_POOLS


class _FirstPlanError(Exception):
    """Raised from the top-k's first offer to stop the search there."""


def first_plan(memory_options: bool, limit: float, deadline: float | None) -> str:
    """One line: when the first plan came and what it was, or that none came in time."""
    catalog = default_catalog()
    request = PlanRequest(
        model=catalog.model("OPT-30B"),
        global_batch_size=256,
        cluster=ClusterSnapshot(pools=EXAMPLE_POOLS),
        objective=Objective(kind="throughput"),
        memory_options=memory_options,
        deadline_seconds=deadline,
    )
    offer, solve = objective.TopK.offer, engine.Search._solve
    dps = [0, 0]  # stage DPs run, of them with no bar (no plan known, no cap)

    def first_offer(self: objective.TopK, value: float, plan: Any) -> None:
        raise _FirstPlanError(plan)

    def counted(self: engine.Search, *args: Any, cap: float = float("inf")) -> None:
        dps[0] += 1
        if cap == float("inf") and self.top.kth() == float("inf"):
            dps[1] += 1
        solve(self, *args, cap=cap)

    def out_of_time(signum: int, frame: object) -> None:
        raise TimeoutError

    objective.TopK.offer = first_offer  # type: ignore[method-assign]
    engine.Search._solve = counted  # type: ignore[method-assign]
    signal.signal(signal.SIGPROF, out_of_time)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        signal.setitimer(signal.ITIMER_PROF, limit)
        make_plan(request, ProfileSet(), catalog)
        found = "the search ended without a plan"
    except _FirstPlanError as first:
        plan = first.args[0]
        found = (
            f"first plan P{plan.pipeline_depth} x DP{plan.data_parallel}, "
            f"mbs {plan.micro_batch_size}, {plan.predictions.samples_per_second:.2f} samples/s"
        )
    except TimeoutError:
        found = f"no plan within {limit:g} CPU s"
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        objective.TopK.offer = offer  # type: ignore[method-assign]
        engine.Search._solve = solve  # type: ignore[method-assign]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return (
        f"memory options {'on ' if memory_options else 'off'}: {found}; "
        f"CPU {cpu:.2f} s, wall {wall:.2f} s, {dps[0]} stage DPs ({dps[1]} without a bar)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=float, default=120.0, help="CPU seconds to wait")
    parser.add_argument(
        "--deadline",
        type=float,
        default=120.0,
        help="the search's deadline_seconds (the operator's default, replan/defaults.py); 0 = none",
    )
    args = parser.parse_args()
    print(f"deadline {args.deadline:g} s" if args.deadline else "no deadline", flush=True)
    for memory_options in (False, True):
        print(first_plan(memory_options, args.limit, args.deadline or None), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
