"""What each returned plan was made from, and one line on why it won or how it differs.

`describe_inputs` records the cluster hash and, through the simulator's `profile_refs`, the
compute and network profiles a plan's prediction used, each marked measured or estimated
(so the operator and the CLI can say "this plan rests on guesses for V100-16"). `reasons` writes the one-line `reason` of the best plan and of each
alternative relative to the best. Called by engine.py; pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from sailplan.planner.plan import Plan, PlanInputs
from sailplan.planner.search.objective import Goal
from sailplan.planner.simulator import PlanningContext, profile_refs


def describe_inputs(
    plans: Sequence[Plan], context: PlanningContext, cluster_hash: str
) -> list[PlanInputs]:
    return [
        PlanInputs(
            cluster_hash=cluster_hash,
            profiles=profile_refs(p, context),
        )
        for p in plans
    ]


def _shape(plan: Plan) -> str:
    types = sorted({r.gpu_type for s in plan.stages for r in s.replicas})
    zones = sorted({r.zone for s in plan.stages for r in s.replicas})
    layers = [s.num_layers for s in plan.stages]
    uniform = max(layers) - min(layers) <= 1
    split = (
        ""
        if plan.pipeline_depth == 1
        else (f", layers {'/'.join(map(str, layers))}" + ("" if uniform else " (non-uniform)"))
    )
    tps = sorted({s.tensor_parallel for s in plan.stages})
    return (
        f"{plan.world_size} GPUs ({', '.join(types)} in {len(zones)} zone(s)): "
        f"{plan.pipeline_depth} stage(s) x DP {plan.data_parallel}, TP "
        f"{'/'.join(map(str, tps))}, micro-batch {plan.micro_batch_size}{split}"
    )


def _differences(plan: Plan, best: Plan) -> str:
    diffs = []
    if plan.pipeline_depth != best.pipeline_depth:
        diffs.append(f"{plan.pipeline_depth} stages instead of {best.pipeline_depth}")
    if plan.data_parallel != best.data_parallel:
        diffs.append(f"DP {plan.data_parallel} instead of {best.data_parallel}")
    if plan.micro_batch_size != best.micro_batch_size:
        diffs.append(f"micro-batch {plan.micro_batch_size} instead of {best.micro_batch_size}")
    if plan.world_size != best.world_size:
        diffs.append(f"{plan.world_size} GPUs instead of {best.world_size}")
    tps = [s.tensor_parallel for s in plan.stages]
    if tps != [s.tensor_parallel for s in best.stages]:
        diffs.append(f"TP {'/'.join(map(str, tps))}")
    if not diffs:
        bounds = [s.layer_end for s in plan.stages]
        if bounds != [s.layer_end for s in best.stages]:
            diffs.append(f"stage boundaries at layers {bounds[:-1]}")
        else:
            diffs.append("replicas on other pools")
    return ", ".join(diffs)


def reasons(plans: Sequence[Plan], goal: Goal) -> list[str]:
    best = plans[0]
    assert best.predictions is not None
    cost = goal.objective.kind == "cost"
    energy = goal.objective.kind == "energy"
    if energy:
        headline = (
            f"least GPU energy at no-slowdown clocks: {goal.value(best.predictions) / 1e3:.2f} "
            f"kJ/iteration at {best.predictions.samples_per_second:.1f} samples/s"
        )
    elif cost:
        headline = (
            f"lowest cost: {best.predictions.usd_per_iteration:.4f} USD/iteration at "
            f"{best.predictions.samples_per_second:.1f} samples/s"
        )
    else:
        headline = (
            f"highest throughput: {best.predictions.samples_per_second:.1f} samples/s at "
            f"{best.predictions.usd_per_hour:.2f} USD/hour"
        )
    out = [f"{headline}; {_shape(best)}"]
    for plan in plans[1:]:
        assert plan.predictions is not None
        if energy:
            base = goal.value(best.predictions)
            delta = (goal.value(plan.predictions) - base) / base * 100 if base else 0.0
            lead = f"{delta:.1f}% more energy"
        elif cost:
            base = best.predictions.usd_per_iteration
            delta = (plan.predictions.usd_per_iteration - base) / base * 100 if base else 0.0
            lead = f"{delta:.1f}% more USD/iteration"
        else:
            base = best.predictions.samples_per_second
            delta = (base - plan.predictions.samples_per_second) / base * 100
            lead = f"{delta:.1f}% lower throughput"
        out.append(f"{lead} than the best: {_differences(plan, best)}")
    return out
