"""Which TrainingJob passes compete for capacity, and which jobs others must wait for.

When capacity shrinks (nodes preempted or gone) or frees up, several jobs may need new
plans at once, and the free GPUs go to whichever plans first. The order should be the
jobs' rank (higher priority, then the older job; controller.queue): a lower-ranked job that
planned first would take capacity the higher-ranked job's plan then needs, and either the
scheduler preempts its new workers (a second restart for it) or, at equal priority, the
higher-ranked job waits. So a job that competes for capacity on this pass waits while a
better-ranked job that competes too has not created its new workers yet (its plan search is
under way, or it is switching to a plan made for lost capacity); it then plans on what is
left, the other's unbound workers being reserved.

A job competes when it has no workers, or its current plan lost workers (preempted, on a
node that is gone or NotReady, or deleted): it needs capacity it does not hold. A job whose
workers all run keeps them and waits for nobody; a better-ranked job that needs its nodes
takes them through the scheduler's preemption (reconcile.snapshot.with_preemptible), not
through this order.

Pure: controller.runtime calls `competes` before a pass (to hold it back behind a
contender, controller.queue.held_back_by) and `contends` after it (to make it a
contender).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from sailplan.operator.api import trainingjob as api
from sailplan.operator.api.common import find_condition
from sailplan.operator.api.trainingjob import TrainingJobStatus
from sailplan.operator.reconcile.nodes import NodeInfo
from sailplan.operator.replan import triggers
from sailplan.operator.replan.triggers import WorkerPod

# Replans (the Replanning condition's reason is the trigger) that replace capacity a job
# lost, as opposed to a voluntary switch to a better plan.
CAPACITY_TRIGGERS: Final = frozenset(
    {
        triggers.WORKER_PREEMPTED,
        triggers.NODE_LOST,
        triggers.NODE_CORDONED,
        triggers.CAPACITY_LOST,
        triggers.CAPACITY_RETURNED,
    }
)


def competes(
    status: TrainingJobStatus, pods: Sequence[WorkerPod], nodes: Mapping[str, NodeInfo]
) -> bool:
    """Whether the job's pass may take capacity it does not hold: it has no worker pods, or
    its plan (status.plan, status.attempt) is Running or Pending and lost some of them."""
    if not pods:
        return True
    if status.plan is None or status.phase not in (api.PHASE_RUNNING, api.PHASE_PENDING):
        return False  # adopting, switching, suspended or finished: nothing to plan now
    current = [
        p
        for p in pods
        if (p.generation, p.attempt) == (status.plan.generation, status.attempt) and not p.deleting
    ]
    if triggers.classify_pods(current, nodes).disrupted:
        return True
    return len({p.worker_index for p in current}) < status.workers.desired


def contends(status: TrainingJobStatus, *, competing: bool, created_workers: bool) -> bool:
    """Whether worse-ranked competing jobs must wait for this one after its pass (`status`
    as the pass left it): it created no workers yet and either searches for the plan it
    competes for, or is switching to a plan that replaces lost capacity."""
    if created_workers:
        return False
    planning = find_condition(status.conditions, api.COND_PLANNING)
    if competing and planning is not None and planning.status == "True":
        return True
    replanning = find_condition(status.conditions, api.COND_REPLANNING)
    return (
        replanning is not None
        and replanning.status == "True"
        and replanning.reason in CAPACITY_TRIGGERS
        and status.phase == api.PHASE_REPLANNING
    )
