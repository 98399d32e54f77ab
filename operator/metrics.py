"""Prometheus metrics of the operator (served on --metrics-port, scraped via the Service).

Counters for reconciles by kind and result and for planner outcomes, a histogram of
planning time (the search can take seconds on big clusters, and that is what an operator
of the operator wants to see first), a histogram of the backoff before retrying a failed
reconcile, a gauge of worker pods by phase, whether this replica leads (leader
election, operator/leader_election.py), the reads of rank 0's progress
(controller/progress.py) by result, and per TrainingJob the GPU energy per step its
trainer measured (status.progress.joulesPerStep) beside the plan's prediction
(status.plan.predictedJoulesPerIteration and ...Default), set from the status each pass
writes (controller/runtime.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

if TYPE_CHECKING:
    from sailplan.operator.api.trainingjob import TrainingJobStatus

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
# The TrainingJob's label is `trainingjob`: Prometheus keeps `job` for its scrape job.
MEASURED_ENERGY = Gauge(
    "sailplan_trainingjob_measured_energy_per_step_joules",
    "GPU energy of the job's last step over all its ranks, from the trainers' NVML counters",
    ["namespace", "trainingjob"],
    registry=REGISTRY,
)
PREDICTED_ENERGY = Gauge(
    "sailplan_trainingjob_predicted_energy_per_step_joules",
    "The plan's GPU energy of one iteration, clocks = no-slowdown (the plan's) or default",
    ["namespace", "trainingjob", "clocks"],
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


def publish_job_energy(key: tuple[str, str], status: TrainingJobStatus) -> None:
    """Set one job's energy series from the status a pass wrote; a number the status does
    not hold (not measured, or a plan made without energy) has no series."""
    progress, plan = status.progress, status.plan
    series: list[tuple[Gauge, tuple[str, ...], float | None]] = [
        (MEASURED_ENERGY, key, progress.joules_per_step if progress is not None else None),
        (
            PREDICTED_ENERGY,
            (*key, "no-slowdown"),
            plan.predicted_joules_per_iteration if plan is not None else None,
        ),
        (
            PREDICTED_ENERGY,
            (*key, "default"),
            plan.predicted_joules_per_iteration_default if plan is not None else None,
        ),
    ]
    for gauge, labels, value in series:
        if value is None:
            _remove(gauge, labels)
        else:
            gauge.labels(*labels).set(value)


def forget_job_energy(key: tuple[str, str]) -> None:
    """Drop a deleted job's energy series."""
    _remove(MEASURED_ENERGY, key)
    for clocks in ("no-slowdown", "default"):
        _remove(PREDICTED_ENERGY, (*key, clocks))


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):  # never set (older prometheus-clients raise)
        gauge.remove(*labels)


def serve(port: int) -> None:
    start_http_server(port, registry=REGISTRY)
