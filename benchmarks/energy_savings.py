"""Energy saved by the clocks Sailplan applies: the GPT-3 family on A100 pipelines of 4 and 8 stages.

For each GPT-3 model of the catalog and each depth P in (4, 8), one pipeline (DP 1, TP 1)
of A100-40 GPUs (one a2-highgpu-8g node) is split two ways:

- `time`: the contiguous split with the least bottleneck stage time (what Sailplan's search
  picks for a fixed depth and TP 1);
- `params`: the split with the least parameters on its largest stage, the partition Merak
  (the framework Perseus ran on) makes by default (its per-shard parameter budget).

The micro-batch size is the largest of 4, 2, 1 at which both splits fit GPU memory; where
none does, the one of them whose `time` split is fastest with memory options (the planner's
PlanRequest.memory_options: Stage.recompute, Stage.optimizer_offload), each stage that does
not fit taking the option with the least M x its forward/backward + its optimizer step
among those that fit its GPU and host memory (the split stays fixed, which make_plan
cannot be asked for). The global batch is the one the Merak-Zeus examples use per model
(ml-energy/merak-zeus, examples/README.md: GPT-3 small/medium/large 512, xl and 2.7b 1024,
6.7b and 13b 2048). Compute profiles are the roofline estimates (nothing measured for
GPT-3 on A100 ships with the project), power is the catalog's datasheet model
(planner/energy/power.py).

For each plan it prints the iteration time, GPU energy per iteration at default clocks,
and the energy saved against them by: one clock per GPU at no slowdown and within 1% and
5% of slowdown (what the node agent applies: plan_energy's clocks), and Perseus' per-pass
clocks at no slowdown (a second clock for each stage's warm-up/cool-down pass; needs
clock switching inside the trainer, not applied: EnergyReport.per_pass).

Perseus (Chung et al., SOSP'24) reports energy reductions of up to 30% without throughput
loss (abstract; GPT-3 and Bloom on A100 and A40 pipelines). Its per-workload table could not
be retrieved while writing this benchmark, so the comparison column carries only that
headline figure.

    python benchmarks/energy_savings.py
"""

from __future__ import annotations

import itertools
import math
import sys

from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.energy import plan_energy
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator import PlanningContext, simulate

GPU = "A100-40"
ZONE = "us-central1-a"
DEPTHS = (4, 8)
MICRO_BATCHES = (4, 2, 1)
# global batch per model: ml-energy/merak-zeus examples/README.md
MERAK_GLOBAL_BATCH = {
    "GPT3-Small": 512,
    "GPT3-Medium": 512,
    "GPT3-Large": 512,
    "GPT3-XL": 1024,
    "GPT3-2.7B": 1024,
    "GPT3-6.7B": 2048,
    "GPT3-13B": 2048,
}
PERSEUS_HEADLINE = "up to 30%"


def min_max_split(weights: list[float], parts: int) -> list[int]:
    """Cut points of the contiguous split of `weights` into `parts` with the least largest sum."""
    n = len(weights)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    best = [[math.inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for p in range(1, parts + 1):
        for end in range(p, n + 1):
            for start in range(p - 1, end):
                value = max(best[p - 1][start], prefix[end] - prefix[start])
                if value < best[p][end]:
                    best[p][end], cut[p][end] = value, start
    cuts = []
    end = n
    for p in range(parts, 0, -1):
        end = cut[p][end]
        cuts.append(end)
    return sorted(cuts)[1:]


def build_plan(model: ModelSpec, cuts: list[int], mbs: int, global_batch: int) -> Plan:
    bounds = [0, *cuts, model.num_layers]
    replica = Replica(pool="a100", gpu_type=GPU, zone=ZONE)
    return Plan(
        model=model,
        global_batch_size=global_batch,
        micro_batch_size=mbs,
        num_micro_batches=global_batch // mbs,
        stages=tuple(
            Stage(layer_start=a, layer_end=b, replicas=(replica,))
            for a, b in itertools.pairwise(bounds)
        ),
    )


# (recompute, optimizer offload) per stage: PlanRequest.memory_options' choices
MEMORY_OPTIONS = (
    ("none", False),
    ("selective", False),
    ("full", False),
    ("none", True),
    ("selective", True),
    ("full", True),
)
SLOWDOWNS = (0.01, 0.05)


def with_memory_options(plan: Plan, context: PlanningContext) -> Plan | None:
    """`plan` with, on each stage that does not fit, the memory option of least
    M x forward/backward + optimizer step among those that fit (module docstring); None
    when some stage fits with none. A stage's memory depends only on its own options."""
    memory = context.catalog.gpu(GPU).memory_bytes
    host = context.costs.host_memory_bytes(GPU)
    table = context.costs.require_table(GPU, 1, plan.micro_batch_size)
    trials = {}
    for recompute, offload in MEMORY_OPTIONS:
        stages = tuple(
            s.model_copy(update={"recompute": recompute, "optimizer_offload": offload})
            for s in plan.stages
        )
        trials[(recompute, offload)] = simulate(plan.model_copy(update={"stages": stages}), context)
    chosen = []
    for i, stage in enumerate(plan.stages):
        best: tuple[float, str, bool] | None = None
        for (recompute, offload), predictions in trials.items():
            prediction = predictions.stages[i]
            if prediction.peak_memory_bytes > memory:
                continue
            if host is not None and prediction.host_memory_bytes > host:
                continue
            step = context.costs.stage_update_seconds(
                table, stage.layer_start, stage.layer_end, offload, 1
            )
            cost = plan.num_micro_batches * prediction.forward_backward_seconds + step
            if best is None or cost < best[0]:
                best = (cost, recompute, offload)
        if best is None:
            return None
        chosen.append(stage.model_copy(update={"recompute": best[1], "optimizer_offload": best[2]}))
    return plan.model_copy(update={"stages": tuple(chosen)})


def options_label(plan: Plan) -> str:
    """The memory options of a plan's stages, e.g. `full 3/8, offload 1/8` or `-`."""
    parts = []
    depth = plan.pipeline_depth
    for kind in ("selective", "full"):
        count = sum(s.recompute == kind for s in plan.stages)
        if count:
            parts.append(f"{kind} {count}/{depth}")
    offloaded = sum(s.optimizer_offload for s in plan.stages)
    if offloaded:
        parts.append(f"offload {offloaded}/{depth}")
    return ", ".join(parts) or "-"


def context_for(model: ModelSpec, mbs: int, cluster: ClusterSnapshot) -> PlanningContext:
    catalog = default_catalog()
    profiles = complete_profiles(model, [GPU], [1], [mbs], measured=ProfileSet(), catalog=catalog)
    profiles = complete_profiles(model, [GPU], [], [], measured=profiles, catalog=catalog)
    return PlanningContext(model=model, cluster=cluster, profiles=profiles, catalog=catalog)


def fitting_plans(
    model: ModelSpec, depth: int, global_batch: int, cluster: ClusterSnapshot
) -> tuple[PlanningContext, dict[str, Plan]] | None:
    """Both splits at the largest micro-batch at which they fit without memory options;
    else, with memory options, at the micro-batch whose `time` split is fastest; None if
    nothing fits."""
    memory = default_catalog().gpu(GPU).memory_bytes
    with_options: list[tuple[float, PlanningContext, dict[str, Plan]]] = []
    for options in (False, True):
        for mbs in MICRO_BATCHES:
            context = context_for(model, mbs, cluster)
            table = context.costs.require_table(GPU, 1, mbs)
            times = [table.forward_backward_seconds(i, i + 1) for i in range(model.num_layers)]
            params = [model.layer_parameters(i, 1) for i in range(model.num_layers)]
            plans: dict[str, Plan] = {}
            for label, weights in (("time", times), ("params", params)):
                plan: Plan | None = build_plan(
                    model, min_max_split(weights, depth), mbs, global_batch
                )
                assert plan is not None
                if options:
                    plan = with_memory_options(plan, context)
                elif simulate(plan, context).peak_memory_bytes > memory:
                    plan = None
                if plan is None:
                    break
                plans[label] = plan
            if len(plans) < 2:
                continue
            if not options:
                return context, plans
            seconds = simulate(plans["time"], context).iteration_seconds
            with_options.append((seconds, context, plans))
    if not with_options:
        return None
    _, context, plans = min(with_options, key=lambda found: found[0])
    return context, plans


def main() -> int:
    catalog = default_catalog()
    cluster = ClusterSnapshot(
        pools=(Pool(name="a100", gpu_type=GPU, zone=ZONE, gpus_per_node=8, nodes=1),)
    )
    memory = catalog.gpu(GPU).memory_bytes
    header = (
        f"{'model':<12} {'P':>2} {'mbs':>3} {'M':>4} {'split':<6} {'memory options':<22} "
        f"{'iter s':>8} {'default kJ':>10} {'1 clock':>7} {'+1%':>6} {'+5%':>6} "
        f"{'per-pass':>8}  Perseus"
    )
    print(header)
    print("-" * len(header))
    for name, global_batch in MERAK_GLOBAL_BATCH.items():
        model = catalog.model(name)
        for depth in DEPTHS:
            found = fitting_plans(model, depth, global_batch, cluster)
            if found is None:
                print(f"{name:<12} {depth:>2}   -    - does not fit {GPU} memory")
                continue
            context, plans = found
            for label, plan in plans.items():
                predictions = simulate(plan, context)
                assert predictions.peak_memory_bytes <= memory
                report = plan_energy(plan, context, predictions=predictions, per_pass=True)
                default = report.default.joules_per_iteration
                slowed = [
                    plan_energy(plan, context, predictions=predictions, max_slowdown=x).chosen
                    for x in SLOWDOWNS
                ]
                saved = [1 - p.joules_per_iteration / default for p in slowed]
                per_pass = report.per_pass_saved_fraction or 0.0
                print(
                    f"{name:<12} {depth:>2} {plan.micro_batch_size:>3} "
                    f"{plan.num_micro_batches:>4} {label:<6} {options_label(plan):<22} "
                    f"{predictions.iteration_seconds:>8.2f} {default / 1e3:>10.1f} "
                    f"{report.saved_fraction * 100:>6.1f}% {saved[0] * 100:>5.1f}% "
                    f"{saved[1] * 100:>5.1f}% {per_pass * 100:>7.1f}%  {PERSEUS_HEADLINE}"
                )
    print(
        "\nsaved against default clocks: 1 clock = one SM clock per GPU at no slowdown (what "
        "the node agent applies); +1%, +5% = one clock per GPU within that slowdown; "
        "per-pass = Perseus' two clocks per stage at no slowdown (not applied). "
        "Perseus: its abstract's headline (per-workload figures not retrieved)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
