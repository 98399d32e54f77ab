"""The operator's memory of a job (api.memory, reconcile.memory) without a cluster: the
state ConfigMap round trip, whose ConfigMap counts, when a pass writes it, the migration
from the v1alpha1 status, and that the pure reconcile returns it instead of a status field."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from operator_builders import RecordingPlanner
from test_reconcile_trainingjob import observe, refuse, with_status

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.memory import JobMemory
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.controller.observation import read_memory
from sailplan.operator.kube import Kube
from sailplan.operator.reconcile import memory
from sailplan.operator.reconcile.trainingjob import Observed, reconcile
from sailplan.operator.replan.state import ReplanState
from sailplan.planner.api import Infeasible, Planned
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import Plan

NOW = datetime(2026, 1, 1, tzinfo=UTC)
REMEMBERED = JobMemory(
    replan=ReplanState(phase="Draining", generation=2, attempt=1, target_generation=3),
    unschedulable_inputs="1:abc",
)


def test_the_state_configmap_round_trips_and_is_owned_and_labelled() -> None:
    body = memory.render("team-a", "opt", "uid-1", REMEMBERED, None)
    assert body["metadata"]["name"] == "opt-state"
    assert "resourceVersion" not in body["metadata"]
    assert body["metadata"]["labels"]["sailplan.dev/role"] == "state"
    assert body["metadata"]["labels"]["sailplan.dev/job"] == "opt"
    (owner,) = body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "TrainingJob",
        "opt",
        "uid-1",
        True,
    )
    assert owner["apiVersion"] == "sailplan.dev/v1beta1"
    stored = memory.read(body | {"metadata": body["metadata"] | {"resourceVersion": "7"}}, "uid-1")
    assert stored == memory.Stored(REMEMBERED, resource_version="7")
    replaced = memory.render("team-a", "opt", "uid-1", JobMemory(), "7")
    assert replaced["metadata"]["resourceVersion"] == "7"


def test_a_configmap_of_another_object_or_unreadable_is_not_taken_as_memory() -> None:
    body = memory.render("team-a", "opt", "uid-old", REMEMBERED, None)
    assert memory.read(body, "uid-new") is None  # an earlier job of the same name
    assert memory.read(None, "uid-new") is None
    broken = body | {"data": {memory.STATE_KEY: '{"replan": {"phase": "Nonsense"}}'}}
    stored = memory.read(broken, "uid-old")
    assert stored is not None and stored.memory == JobMemory()


def test_a_pass_writes_the_memory_only_when_it_changed() -> None:
    absent = memory.Stored(JobMemory())
    assert not absent.needs_write(None)
    assert not absent.needs_write(JobMemory())  # nothing to remember: no ConfigMap
    assert absent.needs_write(REMEMBERED)
    present = memory.Stored(REMEMBERED, resource_version="3")
    assert not present.needs_write(REMEMBERED)
    assert present.needs_write(REMEMBERED.model_copy(update={"unschedulable_inputs": None}))
    assert present.needs_write(JobMemory())


def test_memory_in_a_v1alpha1_status_is_read_for_the_migration() -> None:
    status = {
        "phase": "Running",
        "replan": REMEMBERED.replan.to_kube() if REMEMBERED.replan else None,
        "unschedulableInputs": "1:abc",
    }
    assert memory.has_legacy_fields(status)
    legacy = memory.legacy(status)
    assert legacy.legacy and legacy.resource_version is None
    assert legacy.memory == REMEMBERED
    assert not memory.has_legacy_fields({"phase": "Running", "plan": {"generation": 1}})
    assert JobMemory.from_legacy_status({"replan": {"phase": "Nonsense"}}) == JobMemory()


@pytest.fixture
def job(make_job: Callable[..., TrainingJob]) -> TrainingJob:
    return make_job()


def test_the_reconcile_returns_the_memory_and_the_status_carries_none_of_it(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    first = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, NOW
    )
    assert first.memory is not None and first.memory.replan is not None
    assert first.memory.replan.generation == 1 and first.memory.replan.phase == "Running"
    status = first.status.to_kube()
    assert "replan" not in status and "unschedulableInputs" not in status
    # The next pass over the same cluster remembers the same: nothing to write.
    job = with_status(job, first)
    second = reconcile(observe(job, pools, list(first.create)), refuse, catalog, NOW)
    assert second.memory == first.memory
    assert not memory.Stored(first.memory, resource_version="1").needs_write(second.memory)


def test_an_infeasible_planning_is_remembered_in_the_memory_not_the_status(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    planner = RecordingPlanner(
        Infeasible(code="OutOfMemory", reason="stage 0 needs 41 GB, A100-40 has 40")
    )
    first = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    assert first.status.phase == "Unschedulable"
    assert first.memory is not None and first.memory.unschedulable_inputs
    assert first.memory.unschedulable_inputs.startswith(f"{job.generation}:")
    # Remembered: the same inputs do not ask the planner again ...
    again = reconcile(Observed(job=with_status(job, first), pools=pools), refuse, catalog, NOW)
    assert again.status.phase == "Unschedulable"
    # ... and without the memory they do (it is what stops the repeat).
    forgot = with_status(job, first).model_copy(update={"memory": JobMemory()})
    reconcile(Observed(job=forgot, pools=pools), planner, catalog, NOW)
    assert len(planner.requests) == 2


class _Cluster:
    """What read_memory asks the API server: the state ConfigMap, the job at v1alpha1."""

    def __init__(self, configmap: dict[str, Any] | None, legacy: dict[str, Any] | None) -> None:
        self.configmap = configmap
        self.legacy = legacy
        self.job_reads: list[str] = []

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        assert (namespace, name) == ("team-a", "opt-state")
        return self.configmap

    def get_job(self, namespace: str, name: str, version: str) -> dict[str, Any] | None:
        self.job_reads.append(version)
        return self.legacy


def _read(cluster: _Cluster, raw_status: dict[str, Any]) -> memory.Stored:
    kube = cast(Kube, cluster)
    return asyncio.run(read_memory(kube, "team-a", "opt", "uid-1", raw_status))


def test_read_memory_prefers_the_configmap_and_falls_back_to_the_v1alpha1_status() -> None:
    legacy_job = {
        "metadata": {"uid": "uid-1"},
        "status": {"plan": {"generation": 2}, "unschedulableInputs": "1:abc"},
    }
    mine = memory.render("team-a", "opt", "uid-1", REMEMBERED, None)
    mine["metadata"]["resourceVersion"] = "5"
    cluster = _Cluster(mine, legacy_job)
    assert _read(cluster, {"plan": {"generation": 2}}) == memory.Stored(REMEMBERED, "5")
    assert cluster.job_reads == []  # the ConfigMap is the memory: no second read
    # No ConfigMap, and the status shows the job planned before: the v1alpha1 status.
    cluster = _Cluster(None, legacy_job)
    stored = _read(cluster, {"plan": {"generation": 2}})
    assert cluster.job_reads == ["v1alpha1"]
    assert stored.legacy and stored.memory == JobMemory(unschedulable_inputs="1:abc")
    # A job that never planned has nothing to migrate: not read again.
    cluster = _Cluster(None, legacy_job)
    assert _read(cluster, {"phase": "Pending"}) == memory.Stored(JobMemory())
    assert cluster.job_reads == []
    # A job of the same name with another uid (recreated meanwhile) is not this one.
    cluster = _Cluster(None, legacy_job | {"metadata": {"uid": "uid-2"}})
    assert _read(cluster, {"plan": {"generation": 2}}) == memory.Stored(JobMemory())
