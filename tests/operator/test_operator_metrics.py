"""Prometheus metrics: pod phases are totals over jobs, counters are exposed under sailplan_*."""

from __future__ import annotations

from prometheus_client import generate_latest

from sailplan.operator import metrics


def test_pod_phase_gauge_sums_over_jobs_and_forgets_deleted_ones() -> None:
    metrics.publish_pod_phases([{"Running": 3, "Pending": 1}, {"Running": 2, "Evicted": 1}])
    exposed = generate_latest(metrics.REGISTRY).decode()
    assert 'sailplan_worker_pods{phase="Running"} 5.0' in exposed
    assert 'sailplan_worker_pods{phase="Pending"} 1.0' in exposed
    assert 'sailplan_worker_pods{phase="Unknown"} 1.0' in exposed  # odd phases are not lost
    metrics.publish_pod_phases([{"Running": 2}])
    exposed = generate_latest(metrics.REGISTRY).decode()
    assert 'sailplan_worker_pods{phase="Running"} 2.0' in exposed
    assert 'sailplan_worker_pods{phase="Pending"} 0.0' in exposed


def test_counters_and_histogram_are_registered() -> None:
    metrics.RECONCILES.labels(kind="TrainingJob", result="ok").inc()
    metrics.PLANS.labels(result="infeasible").inc()
    metrics.PLANNING_SECONDS.observe(0.3)
    exposed = generate_latest(metrics.REGISTRY).decode()
    assert 'sailplan_reconciles_total{kind="TrainingJob",result="ok"}' in exposed
    assert 'sailplan_plans_total{result="infeasible"}' in exposed
    assert 'sailplan_planning_seconds_bucket{le="0.5"}' in exposed
