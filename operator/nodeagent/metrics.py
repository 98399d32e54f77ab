"""Prometheus metrics of the node agent, served on its own port (--metrics-port).

Per GPU the agent manages (labels namespace, trainingjob, stage, gpu = the GPU's UUID):
the SM clock it locked, the power and the energy per training step it measured, and the
energy measured since it began managing the GPU for the pod. Per job (labels namespace,
trainingjob, clocks = no-slowdown | default): the planner's predicted energy of one
iteration of the whole job, so a dashboard compares `sum by (namespace, trainingjob)` of
the measured per-GPU energy per step with the prediction. Label sets of GPUs whose pod
went are removed, so a series never outlives its pod.

A registry per AgentMetrics object: the tests make their own and read values from it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

# `trainingjob`, not `job`: Prometheus sets `job` on every series it scrapes (the scrape
# job) and would rename a `job` label of ours to `exported_job`.
GPU_LABELS = ("namespace", "trainingjob", "stage", "gpu")
JOB_LABELS = ("namespace", "trainingjob", "clocks")


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sm_clock = Gauge(
            "sailplan_gpu_sm_clock_locked_mhz", "SM clock the agent locked", GPU_LABELS, registry=r
        )
        self.power = Gauge(
            "sailplan_gpu_power_watts",
            "GPU power (NVML) at the last sample",
            GPU_LABELS,
            registry=r,
        )
        self.energy_per_step = Gauge(
            "sailplan_gpu_energy_per_step_joules",
            "GPU energy per training step measured from NVML's energy counter",
            GPU_LABELS,
            registry=r,
        )
        self.energy = Gauge(
            "sailplan_gpu_energy_joules",
            "GPU energy measured since the agent began managing the GPU for this pod",
            GPU_LABELS,
            registry=r,
        )
        self.predicted = Gauge(
            "sailplan_job_predicted_energy_per_step_joules",
            "Planner's GPU energy of one iteration of the whole job (all its GPUs)",
            JOB_LABELS,
            registry=r,
        )
        self.nvml_errors = Counter(
            "sailplan_nodeagent_nvml_errors",
            "NVML calls that failed, by action (lock, reset, read)",
            ["action"],
            registry=r,
        )
        self._gpu_series: set[tuple[str, ...]] = set()
        self._job_series: set[tuple[str, ...]] = set()

    def publish(
        self,
        gpus: Mapping[tuple[str, ...], tuple[int, float, float | None, float]],
        jobs: Mapping[tuple[str, str], tuple[float, float]],
    ) -> None:
        """Set every series: gpus[(namespace, job, stage, uuid)] = (locked MHz, watts,
        joules per step or None, joules so far); jobs[(namespace, job)] = (predicted joules
        per iteration with the clocks, at default clocks). Others are removed."""
        for labels in self._gpu_series - set(gpus):
            for gauge in (self.sm_clock, self.power, self.energy_per_step, self.energy):
                with contextlib.suppress(KeyError):  # never set (no per-step value yet)
                    gauge.remove(*labels)
        for labels, (mhz, watts, per_step, total) in gpus.items():
            self.sm_clock.labels(*labels).set(mhz)
            self.power.labels(*labels).set(watts)
            self.energy.labels(*labels).set(total)
            if per_step is not None:
                self.energy_per_step.labels(*labels).set(per_step)
        self._gpu_series = set(gpus)
        series = {
            (namespace, job, clocks): value
            for (namespace, job), (clocked, default) in jobs.items()
            for clocks, value in (("no-slowdown", clocked), ("default", default))
        }
        for labels in self._job_series - set(series):
            self.predicted.remove(*labels)
        for labels, value in series.items():
            self.predicted.labels(*labels).set(value)
        self._job_series = set(series)

    def value(self, name: str, labels: Mapping[str, str]) -> float | None:
        """A sample's value (tests)."""
        return self.registry.get_sample_value(name, dict(labels))

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
