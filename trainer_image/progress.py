"""Progress out of the trainer: a JSON line per step, Prometheus metrics, the pod annotation.

Rank 0 patches PROGRESS_ANNOTATION (a TrainerProgress JSON) onto its own Pod; the operator
mirrors it into the TrainingJob status. The patch runs in a background thread, throttled and
latest-value-wins, so a slow API server never stalls a step; outside a cluster (no service
account, no pod name) it is skipped quietly. Every worker's local rank 0 serves Prometheus
metrics on SAILPLAN_METRICS_PORT (0 disables). Called by the engine after every step.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any

from sailplan.planner.workerenv import (
    DEFAULT_METRICS_PORT,
    METRICS_PORT,
    POD_NAME,
    POD_NAMESPACE,
    PROGRESS_ANNOTATION,
    TrainerProgress,
)

log = logging.getLogger(__name__)

_PATCH_INTERVAL_S = 5.0


class PodAnnotator:
    """Background patcher of the progress annotation on this pod (in-cluster only)."""

    def __init__(self, api: Any, name: str, namespace: str) -> None:
        self.api, self.name, self.namespace = api, name, namespace
        self._latest: TrainerProgress | None = None
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="progress-patch", daemon=True)
        self._thread.start()

    @classmethod
    def from_environment(cls) -> PodAnnotator | None:
        name, namespace = os.environ.get(POD_NAME), os.environ.get(POD_NAMESPACE)
        if not name or not namespace or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            return None
        try:
            from kubernetes import client, config

            # A kubeconfig (the local e2e pod runner gives each pod one carrying the pod's
            # own service-account token) wins over the in-cluster files.
            if os.environ.get("KUBECONFIG"):
                config.load_kube_config()  # type: ignore[no-untyped-call]
            else:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
        except Exception as error:  # not in a cluster, or no service account: skip quietly
            log.info("progress annotation disabled: %s", error)
            return None
        return cls(client.CoreV1Api(), name, namespace)

    def publish(self, progress: TrainerProgress) -> None:
        with self._lock:
            self._latest = progress
        self._event.set()

    def _loop(self) -> None:
        while True:
            self._event.wait()
            self._event.clear()
            with self._lock:
                progress = self._latest
            if progress is None:
                continue
            body = {"metadata": {"annotations": {PROGRESS_ANNOTATION: progress.model_dump_json()}}}
            try:
                self.api.patch_namespaced_pod(self.name, self.namespace, body)
            except Exception as error:  # the next step retries with fresher numbers
                log.warning("progress patch failed: %s", error)
            time.sleep(_PATCH_INTERVAL_S)


class Metrics:
    def __init__(self, port: int) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        self.step = Gauge("sailplan_trainer_step", "completed steps", registry=self.registry)
        self.loss = Gauge(
            "sailplan_trainer_loss", "mean loss of the last step", registry=self.registry
        )
        self.samples = Gauge(
            "sailplan_trainer_samples_per_second", "training throughput", registry=self.registry
        )
        self.checkpoint = Gauge(
            "sailplan_trainer_last_checkpoint_step",
            "newest complete checkpoint",
            registry=self.registry,
        )
        start_http_server(port, registry=self.registry)


class Reporter:
    """What one rank reports; rank 0 logs and annotates, each worker's local rank 0 serves metrics."""

    def __init__(self, *, rank: int, local_rank: int, generation: int) -> None:
        self.rank = rank
        self.generation = generation
        self.annotator = PodAnnotator.from_environment() if rank == 0 else None
        port = int(os.environ.get(METRICS_PORT, DEFAULT_METRICS_PORT))
        self.metrics = Metrics(port) if local_rank == 0 and port > 0 else None

    def step(
        self,
        step: int,
        loss: float,
        samples_per_second: float,
        last_checkpoint: int | None,
        seconds: float,
    ) -> None:
        if self.metrics is not None:
            self.metrics.step.set(step)
            self.metrics.loss.set(loss)
            self.metrics.samples.set(samples_per_second)
            if last_checkpoint is not None:
                self.metrics.checkpoint.set(last_checkpoint)
        if self.rank != 0:
            return
        self.event(
            "step",
            step=step,
            loss=loss,
            samples_per_second=round(samples_per_second, 3),
            step_seconds=round(seconds, 4),
            last_checkpoint_step=last_checkpoint,
        )
        if self.annotator is not None:
            self.annotator.publish(
                TrainerProgress(
                    step=step,
                    loss=loss,
                    samples_per_second=samples_per_second,
                    last_checkpoint_step=last_checkpoint,
                    plan_generation=self.generation,
                )
            )

    def event(self, kind: str, **fields: Any) -> None:
        if self.rank == 0:
            line = json.dumps({"event": kind, "generation": self.generation, **fields})
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
