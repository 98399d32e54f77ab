"""The node agent's loop (operator/nodeagent/agent.py) against FakeNVML and a fake API.

The worker pods and the plan ConfigMap are the operator's own (reconcile.children renders
them), so the agent is tested on what the operator really writes. Time is a simulated
clock the test advances: the expected energy is power x elapsed time, with the power
computed here from the datasheet model's formula (docs/architecture/planner.md), not
read from the fake.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from operator_builders import JOB_SPEC

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.nodeagent.agent import Agent
from sailplan.operator.nodeagent.assignment import OPT_IN_ANNOTATION
from sailplan.operator.nodeagent.clocks import plan_clocks
from sailplan.operator.nodeagent.devices import FakeAllocator, StaticDevices
from sailplan.operator.nodeagent.metrics import AgentMetrics
from sailplan.operator.nodeagent.nvml import (
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NO_PERMISSION,
    FakeNVML,
    NVMLError,
    fake_gpus,
)
from sailplan.operator.reconcile.children import desired_children
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.operator.replan.decision import plan_request
from sailplan.planner.api import Planned, make_plan
from sailplan.planner.catalog import Catalog
from sailplan.planner.energy import plan_energy
from sailplan.planner.energy.power import SM_CLOCK_POWER_EXPONENT, SM_CLOCK_POWER_SHARE
from sailplan.planner.plan import EnergyPrediction, Plan, StageClocks

NODE = "gke-a100-a-0"
NAMESPACE = "team-a"
STEADY = ((1200, 1305), (1530, 1530))  # [stage][replica]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeCluster:
    """agent.ClusterView over dicts; `pods` holds every pod of every node."""

    def __init__(self) -> None:
        self.all_pods: list[dict[str, Any]] = []
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}

    def node_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.all_pods if p["spec"].get("nodeName") == NODE]

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.jobs.get((namespace, name))

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.configmaps.get((namespace, name))


def a100_watts(catalog: Catalog, mhz: int) -> float:
    """P(f) = P_idle + (P_tdp - P_idle)((1 - k) + k (f / f_max)^3) with the A100's datasheet
    numbers."""
    power = catalog.gpu("A100-40").power
    assert power is not None
    x = mhz / power.max_sm_mhz
    k = SM_CLOCK_POWER_SHARE
    return power.idle_watts + (power.tdp_watts - power.idle_watts) * (
        (1 - k) + k * x**SM_CLOCK_POWER_EXPONENT
    )


def with_clocks(plan: Plan) -> Plan:
    assert plan.predictions is not None
    energy = EnergyPrediction(
        joules_per_iteration_default=2000.0,
        joules_per_iteration=1800.0,
        iteration_seconds=plan.predictions.iteration_seconds,
        stage_clocks=tuple(StageClocks(steady_mhz=s, fill_mhz=s) for s in STEADY),
    )
    return plan.model_copy(
        update={"predictions": plan.predictions.model_copy(update={"energy": energy})}
    )


@pytest.fixture
def cluster(
    make_job: Callable[..., TrainingJob], plan: Plan, pools: tuple[GPUPool, ...]
) -> FakeCluster:
    """Job `opt` (generation 1) opted in; its worker 0 (stage 0, replica 0, TP 2) on NODE,
    the others elsewhere; and a pod of somebody else with one GPU on NODE."""
    job = make_job()
    children = desired_children(job, with_clocks(plan), 1, 0, {p.name: p for p in pools})
    fake = FakeCluster()
    fake.jobs[(NAMESPACE, "opt")] = {
        "metadata": {
            "name": "opt",
            "namespace": NAMESPACE,
            "annotations": {OPT_IN_ANNOTATION: "no-slowdown"},
        }
    }
    configmap = dict(children.configmap)
    configmap["metadata"] = {**configmap["metadata"], "uid": "cm-uid-1"}
    fake.configmaps[(NAMESPACE, configmap["metadata"]["name"])] = configmap
    for index, pod in enumerate(children.pods):
        pod = json.loads(json.dumps(pod))
        pod["metadata"]["uid"] = f"pod-uid-{index}"
        pod["spec"]["nodeName"] = NODE if index == 0 else f"elsewhere-{index}"
        pod["status"] = {"phase": "Running"}
        fake.all_pods.append(pod)
    fake.all_pods.append(
        {
            "metadata": {
                "name": "notebook",
                "namespace": "data-science",
                "uid": "other-uid",
                "labels": {},
            },
            "spec": {
                "nodeName": NODE,
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
            "status": {"phase": "Running"},
        }
    )
    return fake


DEVICES = StaticDevices({"pod-uid-0": ["nvidia0", "nvidia1"], "other-uid": ["nvidia2"]})


def make_agent(cluster: FakeCluster, clock: Clock, **kwargs: Any) -> tuple[Agent, FakeNVML]:
    nvml = FakeNVML(gpus=fake_gpus("A100-40", 4, node=NODE), now=clock, **kwargs)
    agent = Agent(nvml=nvml, cluster=cluster, devices=DEVICES, metrics=AgentMetrics())
    return agent, nvml


def set_step(cluster: FakeCluster, step: int) -> None:
    """What the operator writes from rank 0's metrics (controller.progress)."""
    cluster.jobs[(NAMESPACE, "opt")]["status"] = {"progress": {"step": step, "loss": 2.5}}


def labels(nvml: FakeNVML, gpu: int, stage: str = "0") -> dict[str, str]:
    return {"namespace": NAMESPACE, "trainingjob": "opt", "stage": stage, "gpu": nvml.uuid(gpu)}


def test_the_opted_in_workers_gpus_are_locked_to_their_stage_clock_and_no_other(
    cluster: FakeCluster,
) -> None:
    agent, nvml = make_agent(cluster, Clock())
    agent.sync()
    assert nvml.calls == [("lock", 0, 1200), ("lock", 1, 1200)]
    assert [nvml.sm_mhz(i) for i in range(4)] == [1200, 1200, 1410, 1410]
    assert agent.metrics.value("sailplan_gpu_sm_clock_locked_mhz", labels(nvml, 0)) == 1200
    agent.sync()  # nothing changed: no NVML writes
    assert len(nvml.calls) == 2


def test_measured_energy_per_step_is_power_at_the_locked_clock_times_time_per_step(
    cluster: FakeCluster, catalog: Catalog
) -> None:
    clock = Clock()
    agent, nvml = make_agent(cluster, clock)
    set_step(cluster, 10)
    agent.sync()  # locks at t0, opens the window at step 10
    clock.t += 30.0
    set_step(cluster, 15)
    agent.sync()
    expected = a100_watts(catalog, 1200) * 30.0 / 5
    for gpu in (0, 1):
        value = agent.metrics.value("sailplan_gpu_energy_per_step_joules", labels(nvml, gpu))
        assert value == pytest.approx(expected, abs=1e-2)
        total = agent.metrics.value("sailplan_gpu_energy_joules", labels(nvml, gpu))
        assert total == pytest.approx(a100_watts(catalog, 1200) * 30.0, abs=1e-2)
    watts = agent.metrics.value("sailplan_gpu_power_watts", labels(nvml, 0))
    assert watts == pytest.approx(a100_watts(catalog, 1200), abs=1e-3)
    # the planner's prediction for the whole job sits beside it
    predicted = {"namespace": NAMESPACE, "trainingjob": "opt"}
    assert agent.metrics.value(
        "sailplan_job_predicted_energy_per_step_joules", predicted | {"clocks": "no-slowdown"}
    ) == pytest.approx(1800.0)
    assert agent.metrics.value(
        "sailplan_job_predicted_energy_per_step_joules", predicted | {"clocks": "default"}
    ) == pytest.approx(2000.0)


def test_a_deleted_worker_gets_its_gpus_reset_and_its_series_dropped(cluster: FakeCluster) -> None:
    clock = Clock()
    agent, nvml = make_agent(cluster, clock)
    agent.sync()
    cluster.all_pods[0]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    agent.sync()
    assert nvml.calls[2:] == [("reset", 0), ("reset", 1)]
    assert agent.locked == {}
    assert agent.metrics.value("sailplan_gpu_sm_clock_locked_mhz", labels(nvml, 0)) is None
    del cluster.all_pods[0]
    agent.sync()
    assert len(nvml.calls) == 4  # reset once; the other pod's GPU 2 never touched


def test_a_job_without_the_annotation_is_left_alone(cluster: FakeCluster) -> None:
    cluster.jobs[(NAMESPACE, "opt")]["metadata"]["annotations"] = {}
    agent, nvml = make_agent(cluster, Clock())
    agent.sync()
    assert nvml.calls == []


def test_an_agent_without_the_privilege_locks_nothing_and_counts_the_refusals(
    cluster: FakeCluster,
) -> None:
    agent, nvml = make_agent(cluster, Clock(), privileged=False)
    agent.sync()
    assert nvml.calls == [("lock", 0, 1200), ("lock", 1, 1200)]
    assert agent.locked == {}
    assert agent.metrics.value("sailplan_nodeagent_nvml_errors_total", {"action": "lock"}) == 2
    assert agent.metrics.value("sailplan_gpu_sm_clock_locked_mhz", labels(nvml, 0)) is None
    agent.sync()  # retried next pass
    assert len(nvml.calls) == 4


def test_the_fake_refuses_what_nvml_refuses() -> None:
    nvml = FakeNVML(gpus=fake_gpus("A100-40", 1), now=Clock())
    with pytest.raises(NVMLError) as refused:
        nvml.lock_sm_mhz(0, 1500)
    assert refused.value.code == NVML_ERROR_INVALID_ARGUMENT
    nvml.privileged = False
    with pytest.raises(NVMLError) as refused:
        nvml.reset_sm_mhz(0)
    assert refused.value.code == NVML_ERROR_NO_PERMISSION
    assert "Insufficient Permissions" in str(refused.value)


def test_shutdown_resets_what_it_locked_and_a_restarted_agent_remembers(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    clock = Clock()
    agent, nvml = make_agent(cluster, clock)
    agent.state_file = tmp_path / "locked.json"
    agent.sync()
    assert json.loads(agent.state_file.read_text()) == {nvml.uuid(0): 1200, nvml.uuid(1): 1200}
    # the agent dies; the worker goes while it is down; a new agent on the same GPUs
    del cluster.all_pods[0]
    restarted = Agent(
        nvml=nvml,
        cluster=cluster,
        devices=DEVICES,
        metrics=AgentMetrics(),
        state_file=agent.state_file,
    )
    restarted.sync()
    assert nvml.calls[2:] == [("reset", 0), ("reset", 1)]
    set_step(cluster, 1)
    restarted.shutdown()
    assert json.loads(agent.state_file.read_text()) == {}


def test_clocks_missing_from_the_plan_are_the_planners_no_slowdown_clocks(
    plan: Plan, catalog: Catalog
) -> None:
    computed = plan_clocks(plan, catalog)  # make_plan carries no energy prediction
    assert computed.source == "computed"
    from sailplan.planner.cli_sources import cluster_of, plan_context

    context = plan_context(plan, cluster_of(plan, catalog), None, catalog)
    report = plan_energy(plan, context)
    for stage, per_replica in enumerate(report.no_slowdown.steady_mhz):
        for replica, mhz in enumerate(per_replica):
            assert computed.mhz(stage, replica) == mhz
    assert report.no_slowdown.fill_mhz == report.no_slowdown.steady_mhz  # one clock per GPU
    assert computed.joules_per_iteration <= computed.joules_per_iteration_default
    carried = plan_clocks(with_clocks(plan), catalog)
    assert carried.source == "plan"
    assert carried.mhz(0, 1) == 1305

    # Clocks stored per pass (a fill clock unlike the steady one: one locked clock cannot
    # run them as predicted) are replaced by the planner's one-clock answer at the
    # slowdown the plan was allowed, not half-applied as the steady clock.
    two = with_clocks(plan)
    assert two.predictions is not None and two.predictions.energy is not None
    per_pass = two.predictions.energy.model_copy(
        update={
            "max_slowdown": 0.05,
            "stage_clocks": tuple(StageClocks(steady_mhz=s, fill_mhz=(1410, 1410)) for s in STEADY),
        }
    )
    two = two.model_copy(
        update={"predictions": two.predictions.model_copy(update={"energy": per_pass})}
    )
    replaced = plan_clocks(two, catalog)
    assert replaced.source == "computed"
    slowed = plan_energy(plan, context, max_slowdown=0.05).chosen
    assert slowed.fill_mhz == slowed.steady_mhz
    for stage, per_replica in enumerate(slowed.steady_mhz):
        for replica, mhz in enumerate(per_replica):
            assert replaced.mhz(stage, replica) == mhz
    assert replaced.joules_per_iteration == slowed.joules_per_iteration


def test_the_fake_allocator_gives_each_pod_the_lowest_free_gpus_and_frees_finished_ones() -> None:
    def pod(uid: str, gpus: int, created: str, phase: str = "Running") -> dict[str, Any]:
        return {
            "metadata": {"uid": uid, "creationTimestamp": created},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase},
        }

    allocator = FakeAllocator(4)
    first = [pod("a", 2, "2026-01-01T00:00:01Z"), pod("b", 1, "2026-01-01T00:00:02Z")]
    assert allocator.device_ids(first) == {"a": ("0", "1"), "b": ("2",)}
    later = [
        pod("a", 2, "2026-01-01T00:00:01Z", "Succeeded"),
        *first[1:],
        pod("c", 3, "2026-01-01T00:00:03Z"),
    ]
    assert allocator.device_ids(later) == {"b": ("2",), "c": ("0", "1", "3")}


def test_a_plans_clocks_are_computed_once_and_a_note_is_logged_once(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from sailplan.operator.nodeagent import agent as agent_module

    computed: list[int] = []

    def counting(plan: Plan, catalog: Catalog) -> Any:
        computed.append(1)
        return plan_clocks(plan, catalog)

    monkeypatch.setattr(agent_module, "plan_clocks", counting)
    (name,) = [key[1] for key in cluster.configmaps]
    configmap = cluster.configmaps[(NAMESPACE, name)]
    plan = Plan.from_json(configmap["data"]["plan.json"])
    # stage 0 replica 0 asks for 1203 MHz: not a level of the A100 (15 MHz steps)
    odd = with_clocks(plan).model_copy(deep=True)
    assert odd.predictions is not None and odd.predictions.energy is not None
    clocks = list(odd.predictions.energy.stage_clocks)
    clocks[0] = StageClocks(steady_mhz=(1203, 1305), fill_mhz=(1203, 1305))
    energy = odd.predictions.energy.model_copy(update={"stage_clocks": tuple(clocks)})
    odd = odd.model_copy(
        update={"predictions": odd.predictions.model_copy(update={"energy": energy})}
    )
    configmap["data"] = {**configmap["data"], "plan.json": odd.to_json()}
    agent, nvml = make_agent(cluster, Clock())
    with caplog.at_level("INFO", logger="sailplan.nodeagent"):
        for _ in range(3):
            agent.sync()
    assert computed == [1]
    assert nvml.calls == [("lock", 0, 1200), ("lock", 1, 1200)]
    clamped = [r.message for r in caplog.records if "does not support 1203 MHz" in r.message]
    assert len(clamped) == 2  # one line per GPU, not one per pass


def test_spec_energy_clocks_reach_the_agent_through_the_plan_the_operator_writes(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    # spec.energy.clocks: NoSlowdown, no annotation: the operator's request asks for energy
    # predictions, so the plan it stores carries the clocks of its allowed slowdown, one per
    # GPU for all passes, and the agent locks exactly those (source "plan": nothing
    # recomputed on the node); the predicted time with them stays within the allowance.
    job = make_job(JOB_SPEC | {"energy": {"clocks": "NoSlowdown", "maxSlowdown": 0.05}})
    a100 = pools[:1]
    result = make_plan(plan_request(job, catalog.model("OPT-350M"), build_snapshot(a100)))
    assert isinstance(result, Planned)
    plan = result.best
    assert plan.predictions is not None and plan.predictions.energy is not None
    stored = plan.predictions.energy
    assert all(c.fill_mhz == c.steady_mhz for c in stored.stage_clocks)
    assert stored.max_slowdown == 0.05
    assert stored.iteration_seconds <= 1.05 * plan.predictions.iteration_seconds * (1 + 1e-9)
    assert stored.joules_per_iteration < stored.joules_per_iteration_default
    top = catalog.gpu("A100-40").power.max_sm_mhz  # type: ignore[union-attr]
    assert min(m for c in stored.stage_clocks for m in c.steady_mhz) < top
    children = desired_children(job, plan, 1, 0, {p.name: p for p in a100})
    fake = FakeCluster()
    fake.jobs[(NAMESPACE, "opt")] = {
        "metadata": {"name": "opt", "namespace": NAMESPACE},
        "spec": job.spec.to_kube(),
    }
    configmap = dict(children.configmap)
    configmap["metadata"] = {**configmap["metadata"], "uid": "cm-uid-1"}
    fake.configmaps[(NAMESPACE, configmap["metadata"]["name"])] = configmap
    pod = json.loads(json.dumps(children.pods[0]))
    pod["metadata"]["uid"] = "pod-uid-0"
    pod["spec"]["nodeName"] = NODE
    pod["status"] = {"phase": "Running"}
    fake.all_pods.append(pod)
    worker = plan.workers()[0]
    gpus = [f"nvidia{i}" for i in range(worker.tensor_parallel)]
    nvml = FakeNVML(gpus=fake_gpus("A100-40", 4, node=NODE), now=Clock())
    agent = Agent(
        nvml=nvml, cluster=fake, devices=StaticDevices({"pod-uid-0": gpus}), metrics=AgentMetrics()
    )
    agent.sync()
    wanted = plan.predictions.energy.stage_clocks[worker.stage].steady_mhz[worker.replica]
    assert nvml.calls == [("lock", i, wanted) for i in range(worker.tensor_parallel)]
    assert plan_clocks(plan, catalog).source == "plan"
    # Default clocks: the agent gives the GPUs back
    fake.jobs[(NAMESPACE, "opt")]["spec"]["energy"] = {"clocks": "Default"}
    agent.sync()
    assert nvml.calls[worker.tensor_parallel :] == [
        ("reset", i) for i in range(worker.tensor_parallel)
    ]
