"""Prometheus metrics of the operator (served on --metrics-port, scraped via the Service).

Counters for reconciles by kind and result and for planner outcomes, a histogram of
planning time (the search can take seconds on big clusters, and that is what an operator
of the operator wants to see first), a histogram of the backoff before retrying a failed
reconcile, a gauge of worker pods by phase, whether this replica leads (leader
election, operator/leader_election.py), and the reads of rank 0's progress
(controller/progress.py) by result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "sailplan_reconciles",
    "Reconcile passes by resource kind and result (ok, error)",
    ["kind", "result"],
    registry=REGISTRY,
)
PLANS = Counter(
    "sailplan_plans",
    "Planner runs by result (planned, infeasible, error)",
    ["result"],
    registry=REGISTRY,
)
PLANNING_SECONDS = Histogram(
    "sailplan_planning_seconds",
    "Wall time of one planner run",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)
RECONCILE_RETRY_SECONDS = Histogram(
    "sailplan_reconcile_retry_delay_seconds",
    "Backoff before retrying a failed TrainingJob reconcile (its count is the retries)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 300),
    registry=REGISTRY,
)
WORKER_PODS = Gauge(
    "sailplan_worker_pods",
    "Worker pods of all TrainingJobs by phase",
    ["phase"],
    registry=REGISTRY,
)
LEADER = Gauge(
    "sailplan_operator_leader",
    "1 while this replica holds the leader-election Lease and runs the handlers, else 0",
    registry=REGISTRY,
)
PROGRESS_READS = Counter(
    "sailplan_progress_reads",
    "Reads of rank 0's metrics endpoint by result (ok, unreachable, unparseable)",
    ["result"],
    registry=REGISTRY,
)
POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def publish_pod_phases(per_job: Iterable[Mapping[str, int]]) -> None:
    """Set the gauge from per-job phase counts (jobs that vanished simply drop out)."""
    totals = dict.fromkeys(POD_PHASES, 0)
    for counts in per_job:
        for phase, count in counts.items():
            totals[phase if phase in totals else "Unknown"] += count
    for phase, total in totals.items():
        WORKER_PODS.labels(phase=phase).set(total)


def serve(port: int) -> None:
    start_http_server(port, registry=REGISTRY)
