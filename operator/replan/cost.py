"""What a switch costs and what it gains, in the job's own objective.

The restart cost is the time training stands still: write a checkpoint, tear the pods
down, start new pods (schedule, pull, rendezvous), read the checkpoint back. Checkpoint
traffic is estimated from the model's size and the storage bandwidth (the job's
spec.replan.checkpointBandwidthBytesPerSecond, else 1 GB/s); where the last switch was
measured (checkpoint request to clean exit) that measurement replaces the estimate of the
save and teardown.

The gain is judged over the work that is left, capped by a horizon (the job's
spec.replan.horizonSeconds, else 6 h), since a prediction for a week from now is worth
little: a switch pays when the time it saves (Throughput) or the money it saves (Cost) over
that work exceeds what the restart costs, and the relative gain reaches the job's
spec.replan.minPredictedGain. Called by replan.decision.

A plan that needs nodes an autoscaled pool has yet to add (more nodes in a pool than are
ready there) waits for them: `node_wait_seconds` (the slowest such pool's provisioning
time) is added to its restart, and among a first plan's candidates `fastest_to_finish`
picks the one that finishes the work first counting that wait, so a plan on the nodes
that exist now may beat a faster one that waits eight minutes for new ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sailplan.operator.replan import defaults
from sailplan.operator.replan.triggers import nodes_needed
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Predictions

# A checkpoint holds fp32 master weights (4 B/param) plus Adam's two fp32 moments (8); SGD
# keeps the weights only. The trainer's engine saves exactly these (ZeRO paper, Sec. 3.1).
CHECKPOINT_BYTES_PER_PARAM = {"adam": 12.0, "sgd": 4.0}


@dataclass(frozen=True)
class RestartCostModel:
    """Defaults: 1 GB/s aggregate to checkpoint storage (a bucket or Filestore from one
    zone), 15 s to tear pods down after the checkpoint, 90 s to schedule, start and
    rendezvous new pods with a cached image."""

    storage_bytes_per_second: float = float(defaults.CHECKPOINT_BANDWIDTH_BYTES_PER_SECOND)
    teardown_seconds: float = 15.0
    pod_start_seconds: float = 90.0

    def checkpoint_bytes(self, model: ModelSpec, optimizer: str) -> float:
        return model.total_parameters() * CHECKPOINT_BYTES_PER_PARAM.get(optimizer, 12.0)

    def restart_seconds(
        self, model: ModelSpec, optimizer: str, measured_drain_seconds: float | None = None
    ) -> float:
        transfer = self.checkpoint_bytes(model, optimizer) / self.storage_bytes_per_second
        drain = (
            measured_drain_seconds
            if measured_drain_seconds is not None
            else transfer + self.teardown_seconds
        )
        return drain + self.pod_start_seconds + transfer


ObjectiveKind = Literal["Throughput", "Cost", "Energy"]


@dataclass(frozen=True)
class Evaluation:
    """The current plan against a candidate, on the same (new) cluster snapshot."""

    objective: ObjectiveKind
    current_samples_per_second: float
    new_samples_per_second: float
    current_usd_per_sample: float
    new_usd_per_sample: float
    remaining_samples: float
    restart_seconds: float
    gain_fraction: float  # samples/s gain (Throughput), USD/sample (Cost), J/sample (Energy) saving
    benefit: float  # seconds (Throughput), USD (Cost), joules (Energy) saved over remaining_samples
    restart_penalty: float  # the restart in the same unit as benefit
    min_gain: float

    @property
    def worth_it(self) -> bool:
        return self.gain_fraction >= self.min_gain and self.benefit > self.restart_penalty

    def explain(self) -> str:
        unit = {"Throughput": "s", "Cost": "USD", "Energy": "J"}[self.objective]
        return (
            f"predicted gain {self.gain_fraction:+.1%} (minimum {self.min_gain:.0%}), "
            f"saves {self.benefit:.4g} {unit} over {self.remaining_samples:.0f} samples "
            f"against a restart of {self.restart_seconds:.0f} s ({self.restart_penalty:.4g} {unit})"
        )


def evaluate(
    objective: ObjectiveKind,
    current: Predictions,
    candidate: Predictions,
    *,
    global_batch_size: int,
    remaining_samples: float,
    horizon_seconds: float,
    restart_seconds: float,
    min_gain: float,
) -> Evaluation:
    # Work judged: what is left, but no more than the current plan does within the horizon.
    work = max(0.0, min(remaining_samples, current.samples_per_second * horizon_seconds))
    current_usd = current.usd_per_iteration / global_batch_size
    new_usd = candidate.usd_per_iteration / global_batch_size
    if objective == "Throughput":
        gain = candidate.samples_per_second / current.samples_per_second - 1.0
        benefit = work / current.samples_per_second - work / candidate.samples_per_second
        penalty = restart_seconds
    elif objective == "Energy":
        # GPU joules per sample at each plan's no-slowdown clocks (both carry energy)
        now_j = _joules(current) / global_batch_size
        new_j = _joules(candidate) / global_batch_size
        gain = 1.0 - new_j / now_j if now_j > 0 else 0.0
        benefit = work * (now_j - new_j)
        # During the restart the new plan's GPUs draw at least their blocking power; its
        # average draw (energy over iteration time) prices that wait.
        penalty = restart_seconds * _joules(candidate) / candidate.iteration_seconds
    else:
        gain = 1.0 - new_usd / current_usd if current_usd > 0 else 0.0
        benefit = work * (current_usd - new_usd)
        # During the restart the new plan's GPUs are already paid for and do no work.
        penalty = restart_seconds * candidate.usd_per_hour / 3600.0
    return Evaluation(
        objective=objective,
        current_samples_per_second=current.samples_per_second,
        new_samples_per_second=candidate.samples_per_second,
        current_usd_per_sample=current_usd,
        new_usd_per_sample=new_usd,
        remaining_samples=work,
        restart_seconds=restart_seconds,
        gain_fraction=gain,
        benefit=benefit,
        restart_penalty=penalty,
        min_gain=min_gain,
    )


def _joules(predictions: Predictions) -> float:
    energy = predictions.energy
    if energy is None:
        raise ValueError("the Energy objective compares plans with energy predictions")
    return energy.joules_per_iteration


def node_wait_seconds(plan: Plan, cluster: ClusterSnapshot) -> float:
    """Seconds `plan` waits for nodes the autoscaler must add first: the longest
    provisioning time of the pools where it needs more nodes than are ready (0 if none)."""
    groups: dict[str, list[int]] = {}
    for worker in plan.workers():
        groups.setdefault(worker.pool, []).append(worker.tensor_parallel)
    by_name = {p.name: p for p in cluster.pools}
    waits = [
        by_name[name].provisioning_seconds
        for name, tps in groups.items()
        if name in by_name
        and nodes_needed(tps, by_name[name].gpus_per_node) > by_name[name].ready_nodes
    ]
    return max(waits, default=0.0)


def fastest_to_finish(
    plans: Sequence[Plan],
    cluster: ClusterSnapshot,
    *,
    remaining_samples: float,
    horizon_seconds: float,
) -> tuple[Plan, str | None]:
    """The plan, of `plans` (best first), that finishes the work judged (what is left, at
    most what the best plan does within the horizon) first once its node wait is counted;
    with a one-line reason when that is not the first plan."""
    best = plans[0]
    assert best.predictions is not None  # the planner always predicts what it returns
    work = max(0.0, min(remaining_samples, best.predictions.samples_per_second * horizon_seconds))

    def finish(plan: Plan) -> float:
        assert plan.predictions is not None
        return node_wait_seconds(plan, cluster) + work / plan.predictions.samples_per_second

    chosen = min(plans, key=finish)  # min keeps the first of equals: the planner's order
    if chosen is best:
        return best, None
    return chosen, (
        f"runs on nodes that are ready sooner: finishes {work:.0f} samples in "
        f"{finish(chosen):.0f} s against {finish(best):.0f} s for the fastest plan, which "
        f"waits {node_wait_seconds(best, cluster):.0f} s for new nodes"
    )
