"""The search's energy objective against the throughput and cost objectives.

For each cluster and throughput floor, one row per objective: the plan it returns, its
samples/s, its GPU energy per iteration at its own no-slowdown clocks, one per GPU as the
node agent applies them (planner.energy, the same model for every row, so the rows
compare), the search's CPU seconds (make_plan, profile completion included) and the
complete plans it scored (Planned.plans_evaluated: the stage DP's finalists, of which only
those whose bound can still win are simulated). The energy objective needs the floor; the
throughput and cost objectives get the same floor as a constraint.

    python benchmarks/energy_objective.py            # the three small clusters
    python benchmarks/energy_objective.py --large    # the 64-GPU cluster, energy only

"bound kJ" is the energy objective's Planned.energy_lower_bound: no plan meeting the floor
uses less (planner/search/energy.py).

Roofline-estimated profiles and datasheet power, so the figures are the model's, not
measurements. CPU seconds of one process; other load on the machine shows in wall time only.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from sailplan.planner.api import Objective, Planned, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cli_energy import context_for
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.energy import plan_energy

ZONE = "us-central1-a"
# (label, model, global batch, [(gpu type, GPUs per node, nodes)], floors in samples/s)
CASES: list[tuple[str, str, int, list[tuple[str, int, int]], list[float]]] = [
    ("GPT3-Small, 4 A100-40", "GPT3-Small", 64, [("A100-40", 4, 1)], [10.0, 30.0]),
    (
        "GPT3-Small, 4 A100-40 + 8 V100-16",
        "GPT3-Small",
        64,
        [("A100-40", 4, 1), ("V100-16", 8, 1)],
        [20.0, 40.0],
    ),
    (
        "OPT-350M, 8 A100-40 + 8 H100-80",
        "OPT-350M",
        256,
        [("A100-40", 8, 1), ("H100-80", 8, 1)],
        [50.0, 150.0],
    ),
]


# 64 GPUs: 32 A100-40 and 32 V100-16 on 8-GPU nodes; floors 30% and 60% of the fastest
# plan's 406 samples/s.
LARGE: list[tuple[str, str, int, list[tuple[str, int, int]], list[float]]] = [
    (
        "GPT3-Small, 32 A100-40 + 32 V100-16",
        "GPT3-Small",
        128,
        [("A100-40", 8, 4), ("V100-16", 8, 4)],
        [122.0, 244.0],
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", action="store_true", help="the 64-GPU cluster, energy only")
    args = parser.parse_args()
    catalog = default_catalog()
    table = Table(
        title="energy objective against throughput and cost (no-slowdown energy, one clock per GPU)"
    )
    columns = ("cluster", "floor/s", "objective", "plan", "samples/s", "kJ/iter", "bound kJ")
    for column in (*columns, "CPU s", "plans"):
        table.add_column(column)
    kinds = ("energy",) if args.large else ("throughput", "cost", "energy")
    for label, model_name, batch, shapes, floors in LARGE if args.large else CASES:
        pools = tuple(
            Pool(name=gpu.lower(), gpu_type=gpu, zone=ZONE, gpus_per_node=per_node, nodes=nodes)
            for gpu, per_node, nodes in shapes
        )
        cluster = ClusterSnapshot(pools=pools)
        model = catalog.model(model_name)
        for floor in floors:
            for kind in kinds:
                request = PlanRequest(
                    model=model,
                    global_batch_size=batch,
                    cluster=cluster,
                    objective=Objective(kind=kind, min_samples_per_second=floor),
                )
                started = time.process_time()
                result = make_plan(request, catalog=catalog)
                seconds = time.process_time() - started
                if not isinstance(result, Planned):
                    table.add_row(
                        label, f"{floor:g}", kind, result.code, "", "", "", f"{seconds:.2f}", ""
                    )
                    continue
                plan = result.best
                assert plan.predictions is not None
                report = plan_energy(plan, context_for(plan, cluster, None, catalog))
                types = "+".join(sorted(plan.gpus_by_pool()))
                shape = (
                    f"{plan.world_size} GPUs ({types}), {plan.pipeline_depth} x DP "
                    f"{plan.data_parallel}, mbs {plan.micro_batch_size}"
                )
                table.add_row(
                    label,
                    f"{floor:g}",
                    kind,
                    shape,
                    f"{plan.predictions.samples_per_second:.1f}",
                    f"{report.no_slowdown.joules_per_iteration / 1e3:.2f}",
                    ""
                    if result.energy_lower_bound is None
                    else f"{result.energy_lower_bound / 1e3:.2f}",
                    f"{seconds:.2f}",
                    f"{result.plans_evaluated:,}",
                )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
