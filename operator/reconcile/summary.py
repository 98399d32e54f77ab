"""Plain pieces shared by the TrainingJob reconcile and the replan state machine.

An Event the reconcile wants recorded, and the one-line plan summary that status, history
and Events all show. They live apart from reconcile.trainingjob because replan.machine
needs them and reconcile.trainingjob calls replan.machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from sailplan.planner.plan import Plan


@dataclass(frozen=True)
class KubeEvent:
    type: str  # Normal | Warning
    reason: str
    message: str


def summarize(plan: Plan) -> str:
    """One line a person can read: stages, degrees, micro-batch, GPUs per pool, prediction."""
    tps = "/".join(str(s.tensor_parallel) for s in plan.stages)
    pools = ", ".join(f"{n}x {pool}" for pool, n in plan.gpus_by_pool().items())
    line = (
        f"{plan.pipeline_depth} stages x DP {plan.data_parallel} (TP {tps}), "
        f"micro-batch {plan.micro_batch_size}: {pools}"
    )
    if plan.predictions is not None:
        line += f"; {plan.predictions.samples_per_second:.1f} samples/s predicted"
    return line
