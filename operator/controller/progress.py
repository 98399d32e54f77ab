"""Training progress read from rank 0's metrics endpoint, so no trainer writes to the API server.

Every worker's local rank 0 serves Prometheus gauges (workerenv.METRIC_*) on the trainer
container's metrics port; worker 0's is global rank 0. `ProgressReader.run` is a background
task the runtime spawns beside its queue workers (supervised: one that dies fails the
liveness probe): every `interval` seconds it lists the running worker-0 pods of the jobs this
operator manages, GETs http://<podIP>:<port>/metrics from each with a short timeout (each
in its own thread, all at once), and keeps the newest reading per pod. A reading whose step
changed puts the job on the work queue; the reconcile pass then takes it through `attach`
into the pure reconcile, which writes status.progress with the rest of the status, once.

A pod that does not answer keeps its last reading (status.progress does not flap; its
`time` says how old it is); a reading is dropped when its pod is gone. The steps after the
last round reach the status through the pod itself: rank 0 keeps its progress in its
termination message, which the pass reads from the exited pod (replan.triggers.
final_progress) and `attach` prefers to an older reading, so a finished job shows its
final step. Nothing here blocks a reconcile: the pass only reads the dictionary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sailplan.operator import metrics
from sailplan.operator.controller.blocking import run_blocking
from sailplan.operator.reconcile import naming
from sailplan.operator.replan.triggers import WorkerPod
from sailplan.planner.workerenv import (
    DEFAULT_METRICS_PORT,
    METRIC_LAST_CHECKPOINT,
    METRIC_LOSS,
    METRIC_SAMPLES_PER_SECOND,
    METRIC_STEP,
    METRIC_STEP_ENERGY,
    METRICS_PORT,
    METRICS_PORT_NAME,
    TrainerProgress,
)

log = logging.getLogger("sailplan.operator")

JobKey = tuple[str, str]
# Running worker 0 of every TrainingJob (the Kube list the reader makes each round).
RANK0_SELECTOR = f"{naming.LABEL_ROLE}={naming.ROLE_WORKER},{naming.LABEL_WORKER}=0"
_GAUGES = (
    METRIC_STEP,
    METRIC_LOSS,
    METRIC_SAMPLES_PER_SECOND,
    METRIC_LAST_CHECKPOINT,
    METRIC_STEP_ENERGY,
)
MAX_BODY = 1 << 20  # the trainer's page is a few KiB; a bigger answer is not the trainer


@dataclass(frozen=True)
class Reading:
    """What rank 0 reported, and when the operator first read this step."""

    progress: TrainerProgress
    time: datetime


# -- pure parts ---------------------------------------------------------------------------------
def metrics_address(pod: Mapping[str, Any]) -> tuple[str, int] | None:
    """(pod IP, port) of a running pod's trainer metrics, or None (no IP yet, or metrics off).

    The port is the trainer container's port named `metrics`, else its METRICS_PORT env
    value, else the trainer's default; METRICS_PORT=0 turns the endpoint (and so the
    progress) off."""
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if status.get("phase") != "Running" or not ip:
        return None
    containers = (pod.get("spec") or {}).get("containers") or ()
    trainer = next((c for c in containers if c.get("name") == "trainer"), None)
    if trainer is None:
        return None
    env = {str(e.get("name")): e.get("value") for e in trainer.get("env") or ()}
    if str(env.get(METRICS_PORT, "")).strip() == "0":
        return None
    for port in trainer.get("ports") or ():
        if port.get("name") == METRICS_PORT_NAME and isinstance(port.get("containerPort"), int):
            return str(ip), int(port["containerPort"])
    raw = str(env.get(METRICS_PORT) or DEFAULT_METRICS_PORT)
    return (str(ip), int(raw)) if raw.isdigit() else None


def parse_progress(text: str) -> TrainerProgress | None:
    """TrainerProgress from the trainer's Prometheus text, or None before its first step.

    The gauges start at 0: step 0 means no step completed yet (a resumed trainer too, until
    its first step), and checkpoint step 0 means none. The energy gauge is there only once
    every rank measured a step (sailplan.trainer.energy); a negative one is not a reading."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in _GAUGES:
                values[sample.name] = float(sample.value)
    step = values.get(METRIC_STEP)
    if step is None or not math.isfinite(step) or step < 1:
        return None

    def finite(name: str) -> float | None:
        value = values.get(name)
        return value if value is not None and math.isfinite(value) else None

    checkpoint = finite(METRIC_LAST_CHECKPOINT)
    joules = finite(METRIC_STEP_ENERGY)
    return TrainerProgress(
        step=int(step),
        loss=finite(METRIC_LOSS),
        samples_per_second=finite(METRIC_SAMPLES_PER_SECOND),
        last_checkpoint_step=int(checkpoint)
        if checkpoint is not None and checkpoint >= 1
        else None,
        joules_per_step=joules if joules is not None and joules >= 0 else None,
    )


def attach(pods: Iterable[WorkerPod], readings: Mapping[str, Reading]) -> tuple[WorkerPod, ...]:
    """The pods, each with its reading (by pod uid) as `progress` and `progress_time`; a pod
    whose trainer exited keeps the final progress of its termination message
    (replan.triggers.final_progress) unless a reading is further on."""

    def newest(pod: WorkerPod) -> WorkerPod:
        reading = readings.get(pod.uid)
        if reading is None:
            return pod
        if pod.progress is not None and pod.progress.step >= reading.progress.step:
            return pod
        return dataclasses.replace(pod, progress=reading.progress, progress_time=reading.time)

    return tuple(newest(p) for p in pods)


# -- the reader ---------------------------------------------------------------------------------
def fetch(address: tuple[str, int], timeout: float) -> str:
    """GET /metrics of one pod (blocking; run in a thread)."""
    ip, port = address
    host = f"[{ip}]" if ":" in ip else ip
    # The URL is built from the Pod's IP and port only, never from user text.
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as response:
        body: bytes = response.read(MAX_BODY)
    return body.decode("utf-8", errors="replace")


@dataclass
class ProgressReader:
    """The newest progress of every managed job's rank 0, by pod uid."""

    list_pods: Callable[[str], list[dict[str, Any]]]  # Kube.list_pods_all_namespaces
    managed: Callable[[], set[JobKey]]  # the jobs this operator reconciles
    changed: Callable[[JobKey], None]  # puts the job on the work queue
    interval: float = 10.0
    timeout: float = 2.0
    get: Callable[[tuple[str, int], float], str] = fetch
    now: Callable[[], datetime] = lambda: datetime.now(UTC).replace(microsecond=0)
    readings: dict[str, Reading] = dataclasses.field(default_factory=dict)
    failures: dict[str, str] = dataclasses.field(default_factory=dict)  # uid -> last error

    async def run(self) -> None:
        while True:
            try:
                await self.read_once()
            except Exception:
                # A failed list must not end the task; the next round tries again.
                log.exception("reading training progress failed")
            await asyncio.sleep(self.interval)

    async def read_once(self) -> None:
        pods = await run_blocking(self.list_pods, RANK0_SELECTOR)
        managed = self.managed()
        targets: list[tuple[str, JobKey, tuple[str, int]]] = []
        alive: set[str] = set()
        for pod in pods:
            metadata = pod.get("metadata") or {}
            uid = str(metadata.get("uid", ""))
            alive.add(uid)
            key = (
                str(metadata.get("namespace", "")),
                str((metadata.get("labels") or {}).get(naming.LABEL_JOB, "")),
            )
            address = metrics_address(pod)
            if key in managed and address is not None and metadata.get("deletionTimestamp") is None:
                targets.append((uid, key, address))
        for uid in set(self.readings) - alive:
            del self.readings[uid]
        for uid in set(self.failures) - alive:
            del self.failures[uid]
        results = await asyncio.gather(
            *(run_blocking(self.get, address, self.timeout) for _, _, address in targets),
            return_exceptions=True,
        )
        for (uid, key, address), result in zip(targets, results, strict=True):
            if isinstance(result, BaseException):
                metrics.PROGRESS_READS.labels(result="unreachable").inc()
                self._failed(uid, key, address, f"{type(result).__name__}: {result}")
                continue
            try:
                progress = parse_progress(result)
            except ValueError as error:  # not Prometheus text: not the trainer
                metrics.PROGRESS_READS.labels(result="unparseable").inc()
                self._failed(uid, key, address, f"unparseable metrics: {error}")
                continue
            metrics.PROGRESS_READS.labels(result="ok").inc()
            self.failures.pop(uid, None)
            if progress is None:
                continue
            previous = self.readings.get(uid)
            if previous is not None and previous.progress == progress:
                continue  # unchanged: its time stays when it was first read
            self.readings[uid] = Reading(progress, self.now())
            self.changed(key)

    def _failed(self, uid: str, key: JobKey, address: tuple[str, int], error: str) -> None:
        # Logged when a pod starts failing, not every round; the last reading stays.
        if self.failures.get(uid) is None:
            log.info(
                "rank 0 progress unreachable; keeping the last reading",
                extra={
                    "trainingjob": f"{key[0]}/{key[1]}",
                    "address": f"{address[0]}:{address[1]}",
                    "error": error,
                },
            )
        self.failures[uid] = error
