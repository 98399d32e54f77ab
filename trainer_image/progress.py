"""Progress out of the trainer: a JSON line per step on rank 0, Prometheus gauges.

Every worker's local rank 0 serves the workerenv.METRIC_* gauges on SAILPLAN_METRICS_PORT
(0 disables); worker 0's are global rank 0's, which the operator reads into the
TrainingJob's status.progress (the GPU energy of the step, summed over the ranks by the
engine's control all-reduce, among them once measured: sailplan.trainer.energy). Global
rank 0 also writes its progress after every step into
its container's termination message (workerenv.TERMINATION_LOG), so the steps the operator
had not scraped yet when the trainer exits reach status.progress from the pod status. The
trainer itself makes no API call (its pods mount no service-account token). Called by the
engine after every step.

On a GPU each step also brings the peak memory of every rank of the worker
(sailplan.trainer.peak_memory): served as two gauges labelled by global rank and stage,
and global rank 0's own in its step line and termination message as
`peak_memory_allocated_bytes` and `peak_memory_reserved_bytes`. TrainerProgress has no such
fields and ignores unknown ones, so an operator reading the message is unaffected; on the
CPU the gauges and fields are absent.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from sailplan.planner.workerenv import (
    DEFAULT_METRICS_PORT,
    DEFAULT_TERMINATION_LOG,
    METRIC_LAST_CHECKPOINT,
    METRIC_LOSS,
    METRIC_SAMPLES_PER_SECOND,
    METRIC_STEP,
    METRIC_STEP_ENERGY,
    METRICS_PORT,
    TERMINATION_LOG,
    TrainerProgress,
)
from sailplan.trainer.peak_memory import RankPeak

_GAUGES = {
    METRIC_STEP: "completed steps",
    METRIC_LOSS: "mean loss of the last step",
    METRIC_SAMPLES_PER_SECOND: "training throughput",
    METRIC_LAST_CHECKPOINT: "newest complete checkpoint",
}
# Served only once set: no series means not measured (0 J would read as a measurement).
_OPTIONAL = {METRIC_STEP_ENERGY: "GPU energy of the last step over all ranks, joules"}
# Per rank of the worker, labelled; trainer-only (the operator reads none of them).
METRIC_PEAK_ALLOCATED = "sailplan_trainer_peak_memory_allocated_bytes"
METRIC_PEAK_RESERVED = "sailplan_trainer_peak_memory_reserved_bytes"
_PEAKS = {
    METRIC_PEAK_ALLOCATED: "peak bytes in CUDA tensors during the last step (torch's allocator)",
    METRIC_PEAK_RESERVED: "peak bytes the CUDA caching allocator reserved during the last step",
}


class Metrics:
    """The gauges, served from one snapshot: a scrape never sees a step with the previous
    step's loss (the operator copies them into status.progress together)."""

    def __init__(self, port: int) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self._lock = threading.Lock()
        self._values: dict[str, float | None] = {
            **dict.fromkeys(_GAUGES, 0.0),
            **dict.fromkeys(_OPTIONAL),
        }
        self._peaks: list[RankPeak] = []
        self.registry = CollectorRegistry()
        self.registry.register(self)
        start_http_server(port, registry=self.registry)

    def set(self, values: dict[str, float | None], peaks: Sequence[RankPeak] = ()) -> None:
        with self._lock:
            self._values.update(values)
            self._peaks = list(peaks)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            values, peaks = dict(self._values), list(self._peaks)
        for name, help_text in (_GAUGES | _OPTIONAL).items():
            value = values[name]
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=value)
        if peaks:
            allocated, reserved = (
                GaugeMetricFamily(name, help_text, labels=["rank", "stage"])
                for name, help_text in _PEAKS.items()
            )
            for peak in peaks:
                labels = [str(peak.rank), str(peak.stage)]
                allocated.add_metric(labels, float(peak.allocated))
                reserved.add_metric(labels, float(peak.reserved))
            yield allocated
            yield reserved


class Reporter:
    """What one rank reports: rank 0 logs, each worker's local rank 0 serves the gauges."""

    def __init__(self, *, rank: int, local_rank: int, generation: int) -> None:
        self.rank = rank
        self.generation = generation
        port = int(os.environ.get(METRICS_PORT, DEFAULT_METRICS_PORT))
        self.metrics = Metrics(port) if local_rank == 0 and port > 0 else None
        # The kubelet's file (it exists in a container); never created elsewhere.
        final = os.environ.get(TERMINATION_LOG, DEFAULT_TERMINATION_LOG)
        self.final_path = final if rank == 0 and os.path.isfile(final) else None

    def step(
        self,
        step: int,
        loss: float,
        samples_per_second: float,
        last_checkpoint: int | None,
        seconds: float,
        *,
        joules: float | None = None,
        memory: Sequence[RankPeak] | None = None,
    ) -> None:
        """After step `step`; `joules`: the GPU energy of this step over all ranks (None:
        not measured, and the energy gauge goes away); `memory`: the step's peak memory of
        this worker's ranks (None: not measured, and those gauges and fields are absent)."""
        own = next((p for p in memory or () if p.rank == self.rank), None)
        peak_fields = (
            {}
            if own is None
            else {
                "peak_memory_allocated_bytes": own.allocated,
                "peak_memory_reserved_bytes": own.reserved,
            }
        )
        if self.metrics is not None:
            values: dict[str, float | None] = {
                METRIC_STEP: float(step),
                METRIC_LOSS: loss,
                METRIC_SAMPLES_PER_SECOND: samples_per_second,
                METRIC_STEP_ENERGY: joules,
            }
            if last_checkpoint is not None:
                values[METRIC_LAST_CHECKPOINT] = float(last_checkpoint)
            self.metrics.set(values, memory or ())
        if self.rank != 0:
            return
        self._final(
            TrainerProgress(
                step=step,
                loss=loss,
                samples_per_second=samples_per_second,
                last_checkpoint_step=last_checkpoint,
                plan_generation=self.generation,
                joules_per_step=joules,
            ),
            peak_fields,
        )
        self.event(
            "step",
            step=step,
            loss=loss,
            samples_per_second=round(samples_per_second, 3),
            step_seconds=round(seconds, 4),
            last_checkpoint_step=last_checkpoint,
            joules=None if joules is None else round(joules, 3),
            **peak_fields,
        )

    def _final(self, progress: TrainerProgress, extra: dict[str, int]) -> None:
        """The latest progress as the termination message (overwritten each step; a few
        hundred bytes of the kubelet's 4 KiB), with `extra` fields TrainerProgress does not
        know (it ignores them)."""
        if self.final_path is None:
            return
        message = progress.model_dump(mode="json", exclude_none=True) | extra
        try:
            with open(self.final_path, "w", encoding="utf-8") as out:
                out.write(json.dumps(message))
        except OSError:
            self.final_path = None  # not writable here: the endpoint alone reports

    def event(self, kind: str, **fields: Any) -> None:
        if self.rank == 0:
            line = json.dumps({"event": kind, "generation": self.generation, **fields})
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
