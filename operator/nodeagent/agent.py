"""The node agent's loop: observe the node's pods, lock and reset clocks, measure energy.

`Agent.sync()` is one pass, called every --interval seconds by `run()` (__main__.py):

1. list the pods bound to this node (fieldSelector spec.nodeName) and ask the device
   source which GPUs each has;
2. for Sailplan worker pods (labels sailplan.dev/job, role worker), read their TrainingJob's
   opt-in (spec.energy.clocks, or the deprecated annotation) and their plan ConfigMap
   (`<job>-plan-g<generation>`), whose clocks (clocks.py: the plan's own, which the
   operator writes for opted-in jobs) are read once per ConfigMap (a generation's
   ConfigMap is immutable);
3. `assignment.assign` decides; resets go first, then locks, each through NVML; a failed
   call is logged in one line and counted, and retried next pass;
4. sample the energy counter and power of every GPU it manages, read the job's step from
   its status.progress (the operator's reading of rank 0), and publish the metrics.

The agent remembers which GPUs it locked (to reset only those) in memory and, with
--state-file, on the node, so a restarted agent still resets a GPU whose pod went while it
was down. `shutdown()` resets every GPU it locked (the DaemonSet's pod going away must not
leave clocks locked).

Polling rather than a watch: energy is sampled each pass anyway, and one list per pass
is a few pods.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sailplan.operator.nodeagent.assignment import (
    OPT_IN_ANNOTATION,
    OPT_IN_CLOCKS,
    Assignment,
    WorkerGPUs,
    assign,
    opt_in,
)
from sailplan.operator.nodeagent.clocks import ClockPlan, ClockPlanError, plan_clocks
from sailplan.operator.nodeagent.devices import DeviceSource, resolve
from sailplan.operator.nodeagent.energy import EnergyMeter
from sailplan.operator.nodeagent.metrics import AgentMetrics
from sailplan.operator.nodeagent.nvml import NVML, NVMLError
from sailplan.planner.catalog import Catalog, default_catalog
from sailplan.planner.plan import Plan

log = logging.getLogger("sailplan.nodeagent")

# The operator's labels (sailplan.operator.reconcile.naming), spelled out so the agent does
# not import the reconcile package.
LABEL_JOB = "sailplan.dev/job"
LABEL_ROLE = "sailplan.dev/role"
LABEL_GENERATION = "sailplan.dev/plan-generation"
LABEL_WORKER = "sailplan.dev/worker-index"
LABEL_STAGE = "sailplan.dev/stage"
WORKER_ANNOTATION = "sailplan.dev/worker"
ROLE_WORKER = "worker"
PLAN_KEY = "plan.json"


class ClusterView(Protocol):
    """The reads the agent makes of the API server (RBAC: list pods, get configmaps,
    get trainingjobs)."""

    def node_pods(self) -> list[dict[str, Any]]: ...

    def job(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...


def plan_configmap_name(job: str, generation: int) -> str:
    return f"{job}-plan-g{generation}"


@dataclass(frozen=True)
class _Worker:
    namespace: str
    name: str
    uid: str
    job: str
    generation: int
    stage: int
    replica: int
    running: bool


def _worker(pod: Mapping[str, Any]) -> _Worker | None:
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if labels.get(LABEL_ROLE) != ROLE_WORKER or LABEL_JOB not in labels:
        return None
    try:
        generation = int(labels[LABEL_GENERATION])
        stage = int(labels[LABEL_STAGE])
        replica = int(json.loads((metadata.get("annotations") or {})[WORKER_ANNOTATION])["replica"])
    except (KeyError, ValueError, TypeError):
        return None
    phase = (pod.get("status") or {}).get("phase")
    return _Worker(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
        job=str(labels[LABEL_JOB]),
        generation=generation,
        stage=stage,
        replica=replica,
        running=phase == "Running" and metadata.get("deletionTimestamp") is None,
    )


def _progress_step(job: Mapping[str, Any] | None) -> int | None:
    step = (((job or {}).get("status") or {}).get("progress") or {}).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


@dataclass
class Agent:
    nvml: NVML
    cluster: ClusterView
    devices: DeviceSource
    metrics: AgentMetrics
    catalog: Catalog = field(default_factory=default_catalog)
    state_file: Path | None = None
    locked: dict[int, int] = field(default_factory=dict)  # GPU index -> MHz the agent locked
    _clocks: dict[tuple[str, str, str], ClockPlan | str] = field(default_factory=dict)
    _meter: EnergyMeter = field(default_factory=EnergyMeter)
    _logged: set[str] = field(default_factory=set)  # notes of the last pass
    _noted: set[str] = field(default_factory=set)  # notes of this pass
    _plans_used: set[tuple[str, str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._load_state()

    # -- state on the node --------------------------------------------------------------
    def _load_state(self) -> None:
        if self.state_file is None or not self.state_file.exists():
            return
        try:
            by_uuid = json.loads(self.state_file.read_text())
            for uuid, mhz in dict(by_uuid).items():
                self.locked[self.nvml.index_of_uuid(str(uuid))] = int(mhz)
        except (OSError, ValueError, TypeError, NVMLError) as error:
            log.warning("ignoring state file %s: %s", self.state_file, error)

    def _save_state(self) -> None:
        if self.state_file is None:
            return
        by_uuid = {self.nvml.uuid(gpu): mhz for gpu, mhz in sorted(self.locked.items())}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(by_uuid, sort_keys=True))
        tmp.replace(self.state_file)

    def _note(self, line: str) -> None:
        """Log a line when it first appears (a pass repeats every few seconds); a line
        that went away and comes back is logged again."""
        if line not in self._logged and line not in self._noted:
            log.info("%s", line)
        self._noted.add(line)

    # -- one pass -----------------------------------------------------------------------
    def _clock_plan(self, worker: _Worker) -> ClockPlan | None:
        name = plan_configmap_name(worker.job, worker.generation)
        configmap = self.cluster.configmap(worker.namespace, name) or {}
        text = (configmap.get("data") or {}).get(PLAN_KEY)
        if text is None:
            self._note(f"{worker.namespace}/{name}: no {PLAN_KEY} yet")
            return None
        # A generation's ConfigMap is immutable: its uid names its plan.
        key = (worker.namespace, name, str((configmap.get("metadata") or {}).get("uid", "")))
        self._plans_used.add(key)
        cached = self._clocks.get(key)
        if cached is None:
            try:
                cached = plan_clocks(Plan.from_json(text), self.catalog)
            except ClockPlanError as error:
                cached = f"{worker.namespace}/{name}: no clocks: {error}"
            except ValueError as error:
                cached = f"{worker.namespace}/{name}: unreadable plan: {str(error).splitlines()[0]}"
            self._clocks[key] = cached
        if isinstance(cached, str):
            self._note(cached)
            return None
        return cached

    def _opted_in(self, namespace: str, job: str, jobs: dict[tuple[str, str], bool]) -> bool:
        if (namespace, job) not in jobs:
            opted, deprecated = opt_in(self.cluster.job(namespace, job) or {})
            if deprecated:
                self._note(
                    f"{namespace}/{job}: the {OPT_IN_ANNOTATION} annotation is deprecated; "
                    f"set spec.energy.clocks: {OPT_IN_CLOCKS}"
                )
            jobs[(namespace, job)] = opted
        return jobs[(namespace, job)]

    def _step(self, worker: _Worker) -> int | None:
        return _progress_step(self.cluster.job(worker.namespace, worker.job))

    def _call(self, action: str, function: Any, *args: Any) -> bool:
        try:
            function(*args)
        except NVMLError as error:
            self.metrics.nvml_errors.labels(action=action).inc()
            log.warning("%s GPU %s failed: %s", action, args[0], error)
            return False
        return True

    def sync(self) -> Assignment:
        self._noted = set()
        self._plans_used = set()
        try:
            return self._sync()
        finally:
            self._logged = self._noted
            # Clocks of plans no pod on the node runs any more are not needed again.
            self._clocks = {k: v for k, v in self._clocks.items() if k in self._plans_used}

    def _sync(self) -> Assignment:
        pods = self.cluster.node_pods()
        device_ids = self.devices.device_ids(pods)
        workers: list[WorkerGPUs] = []
        by_pod: dict[str, _Worker] = {}
        clock_plans: dict[tuple[str, str], ClockPlan] = {}
        jobs: dict[tuple[str, str], bool] = {}
        for pod in pods:
            worker = _worker(pod)
            if worker is None:
                continue
            opted_in = self._opted_in(worker.namespace, worker.job, jobs)
            plan = self._clock_plan(worker) if opted_in and worker.running else None
            if plan is not None:
                clock_plans[(worker.namespace, worker.job)] = plan
            gpus = tuple(
                index
                for device in device_ids.get(worker.uid, ())
                if (index := resolve(device, self.nvml)) is not None
            )
            by_pod[f"{worker.namespace}/{worker.name}"] = worker
            workers.append(
                WorkerGPUs(
                    namespace=worker.namespace,
                    name=worker.name,
                    job=worker.job,
                    stage=worker.stage,
                    replica=worker.replica,
                    gpus=gpus,
                    running=worker.running,
                    opted_in=opted_in,
                    mhz=None if plan is None else plan.mhz(worker.stage, worker.replica),
                )
            )
        gpus_here: set[int] = set(self.locked)
        for workers_gpu in workers:
            gpus_here.update(workers_gpu.gpus)
        supported: dict[int, tuple[int, ...]] = {}
        for gpu in sorted(gpus_here):
            try:
                supported[gpu] = self.nvml.supported_sm_mhz(gpu)
            except NVMLError as error:
                self.metrics.nvml_errors.labels(action="read").inc()
                self._note(f"GPU {gpu}: cannot read its supported clocks: {error}")
        result = assign(workers, supported, self.locked)
        for line in result.notes:
            self._note(line)
        changed = False
        for gpu in result.reset:
            if self._call("reset", self.nvml.reset_sm_mhz, gpu):
                log.info("GPU %s: clocks reset to the driver default", gpu)
                del self.locked[gpu]
                changed = True
        for gpu, mhz in result.lock:
            desired = result.desired[gpu]
            if self._call("lock", self.nvml.lock_sm_mhz, gpu, mhz):
                log.info(
                    "GPU %s: SM clock locked to %s MHz for %s/%s stage %s",
                    gpu,
                    mhz,
                    desired.namespace,
                    desired.pod,
                    desired.stage,
                )
                self.locked[gpu] = mhz
                changed = True
        if changed:
            self._save_state()
        self._measure(result, by_pod, clock_plans)
        return result

    def _measure(
        self,
        result: Assignment,
        by_pod: Mapping[str, _Worker],
        clock_plans: Mapping[tuple[str, str], ClockPlan],
    ) -> None:
        series: dict[tuple[str, ...], tuple[int, float, float | None, float]] = {}
        steps: dict[tuple[str, str, int], int | None] = {}
        keys = []
        for gpu, desired in sorted(result.desired.items()):
            if self.locked.get(gpu) != desired.mhz:
                continue  # not locked (NVML refused): nothing of ours to measure
            worker = by_pod[f"{desired.namespace}/{desired.pod}"]
            step_key = (worker.namespace, worker.job, worker.generation)
            if step_key not in steps:
                steps[step_key] = self._step(worker)
            try:
                counter = self.nvml.energy_mj(gpu)
                watts = self.nvml.power_mw(gpu) / 1000.0
                uuid = self.nvml.uuid(gpu)
            except NVMLError as error:
                self.metrics.nvml_errors.labels(action="read").inc()
                self._note(f"GPU {gpu}: cannot read energy: {error}")
                continue
            key = (gpu, worker.uid)
            keys.append(key)
            per_step = self._meter.observe(key, counter, steps[step_key])
            labels = (desired.namespace, desired.job, str(desired.stage), uuid)
            series[labels] = (desired.mhz, watts, per_step, self._meter.total_joules(key, counter))
        self._meter.forget(keys)
        jobs = {
            job: (plan.joules_per_iteration, plan.joules_per_iteration_default)
            for job, plan in clock_plans.items()
            if any((d.namespace, d.job) == job for d in result.desired.values())
        }
        self.metrics.publish(series, jobs)

    def shutdown(self) -> None:
        """Reset every GPU the agent locked (its pod is going away)."""
        for gpu in sorted(self.locked):
            if self._call("reset", self.nvml.reset_sm_mhz, gpu):
                del self.locked[gpu]
        self._save_state()
