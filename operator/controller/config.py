"""What `sailplan operator run` configures the controller with (sailplan.operator.cli)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sailplan.operator.controller.queue import Backoff
from sailplan.operator.reconcile.scaleup import BackoffPolicy
from sailplan.operator.replan.decision import ReplanConfig
from sailplan.planner.catalog import Catalog


@dataclass
class OperatorConfig:
    catalog: Catalog
    namespaces: tuple[str, ...] = ()  # TrainingJob namespaces served; empty = all
    profile_namespace: str = "sailplan-system"
    metrics_port: int | None = None
    workers: int = 4
    resync_seconds: float = 60.0
    progress_seconds: float = 10.0  # between reads of every job's rank 0 metrics
    replan: ReplanConfig = field(default_factory=ReplanConfig)
    retry: Backoff = field(default_factory=Backoff)  # after a failed TrainingJob reconcile
    # how long an autoscaled zone that gave no node in time counts no new nodes
    scale_up_backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
