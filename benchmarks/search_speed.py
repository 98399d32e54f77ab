"""How fast the planner's full search is on the clusters the Sailor paper timed.

Prints one table row per cluster: wall and CPU seconds of `make_plan` (profile completion
included), complete candidate plans scored, the best plan's shape and throughput, and the
process's peak RSS after the row (resource.getrusage; `--trace-memory` adds the search's
peak Python heap from tracemalloc, which slows the search several-fold, so its times are
then not comparable). One process, no sampling. Sailor's published times are beside ours.

    python benchmarks/search_speed.py            # all six rows
    python benchmarks/search_speed.py --only 6   # a subset (row numbers): the deep pipeline
    python benchmarks/search_speed.py --top 3    # best plan plus two alternatives
    python benchmarks/search_speed.py --objectives   # rows 1-3 under the cost objectives
    python benchmarks/search_speed.py --no-memory-options   # no recomputation or offload

`--objectives` times, on rows 1-3, the minimum cost (USD per iteration), the minimum cost
under a throughput floor of half the row's best throughput, and the maximum throughput
under a budget of half the fastest plan's USD/hour (the floor and budget come from an
untimed throughput search of the same row, so they bind).

Profiles: the measured Sailor artifact (A100-40, V100-16, GH200-96 for OPT-350M) when
`../shared/reference/sailor-artifact` sits beside the checkout, else roofline estimates
(said in the output). Other processes on the machine slow the wall time: the load average
is printed with the table; CPU seconds are the steadier figure.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import tracemalloc
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sailplan.planner.api import Objective, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.profiles.types import ProfileSet

ARTIFACT = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "sailor-artifact"

# (label, [(gpu type, zone, GPUs)], Sailor's published seconds or None)
CLUSTERS: list[tuple[str, list[tuple[str, str, int]], float | None]] = [
    ("128 A100, one zone", [("A100-40", "us-central1-a", 128)], 1.0),
    (
        "32 A100 + 96 V100",
        [("A100-40", "us-central1-a", 32), ("V100-16", "us-central1-a", 96)],
        1.6,
    ),
    (
        "128 A100 + 384 V100",
        [("A100-40", "us-central1-a", 128), ("V100-16", "us-central1-a", 384)],
        17.4,
    ),
    (
        "5 zones x 32 A100",
        [
            ("A100-40", zone, 32)
            for zone in (
                "us-central1-a",
                "us-central1-b",
                "us-central1-c",
                "us-central1-f",
                "us-east1-b",
            )
        ],
        None,
    ),
    (
        "3 types x 256 (A100, V100, GH200)",
        [
            ("A100-40", "us-central1-a", 256),
            ("V100-16", "us-central1-a", 256),
            ("GH200-96", "us-central1-a", 256),
        ],
        4900.0,
    ),
]

# A deep pipeline of a large model (50 layers; the best plan has 7 stages), the case that
# took tens of seconds before the stage DP shared its bounds across depths. The artifact
# measured OPT-30B on other GPU types, so A100-80 and H100-80 are planned on make_plan's
# roofline estimates.
DEEP = (
    "OPT-30B on 64 A100-80 + 32 H100-80",
    [("A100-80", "us-central1-a", 64), ("H100-80", "us-central1-a", 32)],
    "OPT-30B",
)


def cluster(spec: list[tuple[str, str, int]]) -> ClusterSnapshot:
    catalog = default_catalog()
    pools = []
    for gpu, zone, count in spec:
        per_node = 4 if gpu.startswith("GH200") else 8
        pools.append(
            Pool(
                name=f"{gpu.lower()}-{zone}",
                gpu_type=catalog.resolve_gpu(gpu),
                zone=zone,
                gpus_per_node=per_node,
                nodes=count // per_node,
            )
        )
    return ClusterSnapshot(pools=tuple(pools))


def measured_profiles() -> tuple[ProfileSet | None, str]:
    if not (ARTIFACT / "profiles").is_dir():
        return None, f"roofline estimates ({ARTIFACT} absent)"
    from sailplan.planner.profiles.sailor import import_artifact

    imported = import_artifact(ARTIFACT, default_catalog())
    return imported.profiles, f"measured (Sailor artifact at {ARTIFACT})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=int, nargs="*", help="row numbers to run (1-based)")
    parser.add_argument("--global-batch", type=int, default=2048)
    parser.add_argument("--trace-memory", action="store_true", help="tracemalloc peak heap")
    parser.add_argument(
        "--no-memory-options",
        action="store_true",
        help="plan without activation recomputation and optimizer offload",
    )
    parser.add_argument(
        "--top", type=int, default=1, help="plans to return (1 = the best, as Sailor times it)"
    )
    parser.add_argument(
        "--objectives", action="store_true", help="rows 1-3 under the cost objectives instead"
    )
    args = parser.parse_args()
    catalog = default_catalog()
    profiles, source = measured_profiles()
    model = catalog.model("OPT-350M")
    if args.objectives:
        objectives_table(args, profiles, source)
        return
    table = Table(
        title=(
            f"Full search, OPT-350M (row 6: {DEEP[2]}), global batch {args.global_batch}, "
            f"top {args.top}; "
            f"profiles: {source}"
        )
    )
    for column in (
        "#",
        "cluster",
        "wall s",
        "CPU s",
        "Sailor s",
        "plans scored",
        "best plan",
        "samples/s",
        "peak RSS MiB",
        "peak heap MiB",
    ):
        table.add_column(column)
    load_before = os.getloadavg()[0]
    rows = [(label, spec, sailor, model) for label, spec, sailor in CLUSTERS]
    rows.append((DEEP[0], DEEP[1], None, catalog.model(DEEP[2])))
    for row, (label, spec, sailor, row_model) in enumerate(rows, start=1):
        if args.only and row not in args.only:
            continue
        request = PlanRequest(
            model=row_model,
            global_batch_size=args.global_batch,
            cluster=cluster(spec),
            top_k=args.top,
            memory_options=not args.no_memory_options,
        )
        if args.trace_memory:
            tracemalloc.start()
        wall, cpu = time.perf_counter(), time.process_time()
        result = make_plan(request, profiles, catalog)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        heap = "-"
        if args.trace_memory:
            heap = f"{tracemalloc.get_traced_memory()[1] / 2**20:.0f}"
            tracemalloc.stop()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if result.status == "planned":
            best = result.best
            shape = (
                f"P{best.pipeline_depth} x DP{best.data_parallel}, mbs {best.micro_batch_size}, "
                f"{best.world_size} GPUs, layers {[s.num_layers for s in best.stages]}"
            )
            rate = f"{best.predictions.samples_per_second:.1f}" if best.predictions else "-"
            priced = str(result.plans_evaluated)
        else:
            shape, rate, priced = f"infeasible: {result.code}", "-", "-"
        table.add_row(
            str(row),
            label,
            f"{wall:.2f}",
            f"{cpu:.2f}",
            f"{sailor:g}" if sailor else "-",
            priced,
            shape,
            rate,
            f"{rss:.0f}",
            heap,
        )
    console = Console(width=170)
    console.print(table)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    console.print(
        f"peak RSS of the process {rss:.0f} MiB; load average before {load_before:.2f}, "
        f"after {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )


def objectives_table(args: argparse.Namespace, profiles: ProfileSet | None, source: str) -> None:
    """Rows 1-3 under the cost objectives (see the module docstring)."""
    catalog = default_catalog()
    model = catalog.model("OPT-350M")
    table = Table(
        title=(
            f"Cost objectives, OPT-350M, global batch {args.global_batch}, top {args.top}; "
            f"profiles: {source}"
        )
    )
    for column in (
        "#",
        "cluster",
        "objective",
        "wall s",
        "CPU s",
        "best plan",
        "samples/s",
        "USD/it",
    ):
        table.add_column(column)
    rows = args.only or [1, 2, 3]
    for row in rows:
        label, spec, _ = CLUSTERS[row - 1]
        snapshot = cluster(spec)
        fastest = make_plan(
            PlanRequest(
                model=model, global_batch_size=args.global_batch, cluster=snapshot, top_k=1
            ),
            profiles,
            catalog,
        )
        assert fastest.status == "planned" and fastest.best.predictions is not None
        best = fastest.best.predictions
        objectives = [
            ("min cost", Objective(kind="cost")),
            (
                f"min cost, >= {best.samples_per_second / 2:.1f} samples/s",
                Objective(kind="cost", min_samples_per_second=best.samples_per_second / 2),
            ),
            (
                f"max throughput, <= {best.usd_per_hour / 2:.2f} USD/h",
                Objective(kind="throughput", max_usd_per_hour=best.usd_per_hour / 2),
            ),
        ]
        for name, objective in objectives:
            request = PlanRequest(
                model=model,
                global_batch_size=args.global_batch,
                cluster=snapshot,
                top_k=args.top,
                objective=objective,
            )
            wall, cpu = time.perf_counter(), time.process_time()
            result = make_plan(request, profiles, catalog)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if result.status == "planned" and result.best.predictions is not None:
                plan, predicted = result.best, result.best.predictions
                shape = (
                    f"P{plan.pipeline_depth} x DP{plan.data_parallel}, "
                    f"mbs {plan.micro_batch_size}, {plan.world_size} GPUs"
                )
                rate, usd = (
                    f"{predicted.samples_per_second:.1f}",
                    f"{predicted.usd_per_iteration:.4f}",
                )
            else:
                shape, rate, usd = f"infeasible: {result.code}", "-", "-"
            table.add_row(str(row), label, name, f"{wall:.2f}", f"{cpu:.2f}", shape, rate, usd)
    console = Console(width=170)
    console.print(table)
    console.print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
