"""Kueue admission through the pure TrainingJob reconcile (reconcile.kueue): a job with a
queue name plans, queues one Workload for its plan's GPUs and starts no worker until Kueue
admits it; the reason it waits is on the job; an eviction drains it like spec.suspend and
the next plan queues a new Workload; a finished job gives its quota back. The same against
the real Kueue: test_kueue_cluster.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kueue_builders import (
    ADMITTED,
    EVICTED,
    NO_QUOTA,
    QUEUE,
    observed_with,
    queued,
    workload_status,
)
from operator_builders import JOB_SPEC, RecordingPlanner
from test_reconcile_trainingjob import NOW, _reason, observe, refuse, with_status

from sailplan.operator.api.common import find_condition
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob, TrainingJobStatus
from sailplan.operator.reconcile import kueue
from sailplan.operator.reconcile.children import desired_children
from sailplan.operator.reconcile.trainingjob import Observed, Outcome, reconcile
from sailplan.planner.api import Planned
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import Plan
from sailplan.planner.workerenv import CHECKPOINT_REQUEST_ANNOTATION


def admitted_message(status: TrainingJobStatus) -> str | None:
    condition = find_condition(status.conditions, kueue.COND_ADMITTED)
    return condition.message if condition else None


@pytest.fixture
def job(make_job: Callable[..., TrainingJob]) -> TrainingJob:
    return queued(make_job())


def first_pass(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> Outcome:
    return reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, NOW
    )


def test_a_queued_job_plans_then_queues_its_plan_as_one_workload_and_starts_no_worker(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    outcome = first_pass(job, pools, plan, catalog)
    kinds = [o["kind"] for o in outcome.create]
    assert kinds == ["ConfigMap", "Service", "Workload"]
    (workload,) = [o for o in outcome.create if o["kind"] == "Workload"]
    assert workload["spec"]["queueName"] == QUEUE
    assert workload["metadata"]["ownerReferences"][0]["uid"] == job.uid
    # The gang: per GPUPool the plan's workers and the GPUs each holds (its stage's TP).
    expected: dict[str, list[int]] = {}
    for stage in plan.stages:
        for replica in stage.replicas:
            gpupool = replica.pool.split("/")[0]
            expected.setdefault(gpupool, []).append(stage.tensor_parallel)
    asked = {
        ps["template"]["metadata"]["labels"]["sailplan.dev/gpupool"]: (
            ps["count"],
            ps["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"],
        )
        for ps in workload["spec"]["podSets"]
    }
    assert {p: (len(v), v[0]) for p, v in expected.items()} == {
        p: (count, int(gpus)) for p, (count, gpus) in asked.items()
    }
    # The flavor Kueue assigns follows the workers' own node affinity to their pool.
    for pod_set in workload["spec"]["podSets"]:
        affinity = pod_set["template"]["spec"]["affinity"]["nodeAffinity"]
        assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # Held by the queue, shown as Kubeflow and JobSet jobs that Kueue suspends show it.
    status = outcome.status
    assert status.phase == "Suspended"
    assert _reason(status, kueue.COND_ADMITTED) == ("False", kueue.REASON_WORKLOAD_CREATED)
    assert _reason(status, "Running") == ("False", kueue.REASON_AWAITING_ADMISSION)
    assert _reason(status, "Suspended") == ("True", kueue.REASON_AWAITING_ADMISSION)
    assert outcome.requeue_after is not None  # Kueue's answer is looked at again soon
    assert "PodsCreated" not in [e.reason for e in outcome.events]


def test_workers_start_only_once_kueue_admitted_the_workload(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    first = first_pass(job, pools, plan, catalog)
    (workload,) = [o for o in first.create if o["kind"] == "Workload"]
    job = with_status(job, first)
    created = list(first.create)

    waiting = reconcile(
        observed_with(observe(job, pools, created), workload_status(workload, **NO_QUOTA)),
        refuse,
        catalog,
        NOW + timedelta(seconds=5),
    )
    assert [o["kind"] for o in waiting.create] == []
    admitted = admitted_message(waiting.status)
    assert admitted is not None and "insufficient unused quota" in admitted
    assert _reason(waiting.status, kueue.COND_ADMITTED) == ("False", "Pending")
    assert "Pending" in [e.reason for e in waiting.events]
    assert waiting.status.phase == "Suspended"
    suspended = find_condition(waiting.status.conditions, "Suspended")
    assert suspended is not None and "insufficient unused quota" in suspended.message
    # The queue's suspension is not spec.suspend's: no resume reported between passes, and
    # the condition keeps its transition time (a status that changed every pass would
    # trigger the next pass through the job's own watch).
    first_suspended = find_condition(first.status.conditions, "Suspended")
    assert first_suspended is not None
    assert suspended.last_transition_time == first_suspended.last_transition_time
    job = with_status(job, waiting)
    again = reconcile(
        observed_with(observe(job, pools, created), workload_status(workload, **NO_QUOTA)),
        refuse,
        catalog,
        NOW + timedelta(seconds=7),
    )
    for outcome in (waiting, again):
        assert "JobResumed" not in [e.reason for e in outcome.events]
    assert again.status.conditions == waiting.status.conditions

    running = reconcile(
        observed_with(observe(job, pools, created), workload_status(workload, **ADMITTED)),
        refuse,
        catalog,
        NOW + timedelta(seconds=10),
    )
    assert [o["kind"] for o in running.create] == ["Pod"] * len(plan.workers())
    assert _reason(running.status, kueue.COND_ADMITTED) == ("True", kueue.REASON_ADMITTED)
    assert _reason(running.status, "Suspended") == ("False", kueue.REASON_ADMITTED)
    assert running.status.phase == "Pending"  # workers created, not running yet
    assert "Admitted" in [e.reason for e in running.events]
    assert running.delete_workloads == ()


def test_a_queue_that_does_not_exist_is_the_reason_and_names_the_label(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    first = first_pass(job, pools, plan, catalog)
    (workload,) = [o for o in first.create if o["kind"] == "Workload"]
    job = with_status(job, first)
    missing = {
        "QuotaReserved": ("False", "Inadmissible", f"LocalQueue {QUEUE} doesn't exist"),
    }
    outcome = reconcile(
        observed_with(
            observe(job, pools, list(first.create)), workload_status(workload, **missing)
        ),
        refuse,
        catalog,
        NOW,
    )
    assert not [o for o in outcome.create if o["kind"] == "Pod"]
    assert _reason(outcome.status, kueue.COND_ADMITTED) == ("False", kueue.REASON_QUEUE_NOT_FOUND)
    message = admitted_message(outcome.status) or ""
    assert f"LocalQueue {QUEUE} doesn't exist" in message and kueue.QUEUE_LABEL in message
    assert ("Warning", kueue.REASON_QUEUE_NOT_FOUND) in [(e.type, e.reason) for e in outcome.events]


def test_without_kueue_installed_a_queued_job_says_so_and_an_unqueued_one_runs(
    job: TrainingJob,
    make_job: Callable[..., TrainingJob],
    pools: tuple[GPUPool, ...],
    plan: Plan,
    catalog: Catalog,
) -> None:
    planner = RecordingPlanner(Planned(best=plan))
    queued = reconcile(Observed(job=job, pools=pools, workloads=None), planner, catalog, NOW)
    assert [o["kind"] for o in queued.create] == ["ConfigMap", "Service"]
    assert _reason(queued.status, kueue.COND_ADMITTED) == (
        "False",
        kueue.REASON_KUEUE_NOT_INSTALLED,
    )
    plain = reconcile(Observed(job=make_job(), pools=pools, workloads=None), planner, catalog, NOW)
    assert [o["kind"] for o in plain.create].count("Pod") == len(plan.workers())
    assert _reason(plain.status, kueue.COND_ADMITTED) is None


def test_an_evicted_workload_drains_the_job_and_its_next_plan_queues_a_new_one(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    first = first_pass(job, pools, plan, catalog)
    (workload,) = [o for o in first.create if o["kind"] == "Workload"]
    job = with_status(job, first)
    admitted = workload_status(workload, **ADMITTED)
    started = reconcile(
        observed_with(observe(job, pools, list(first.create)), admitted), refuse, catalog, NOW
    )
    created = [*first.create, *started.create]
    job = with_status(job, started)
    running = dict.fromkeys(range(4), "Running")
    steady = reconcile(
        observed_with(observe(job, pools, created, running), admitted), refuse, catalog, NOW
    )
    assert steady.status.phase == "Running"
    job = with_status(job, steady)

    evicted = workload_status(workload, **EVICTED)
    drain = reconcile(
        observed_with(observe(job, pools, created, running), evicted),
        refuse,
        catalog,
        NOW + timedelta(seconds=30),
    )
    workers = [o["metadata"]["name"] for o in created if o["kind"] == "Pod"]
    assert drain.annotate_pods == tuple(
        (name, {CHECKPOINT_REQUEST_ANNOTATION: "1"}) for name in workers
    )
    assert _reason(drain.status, kueue.COND_ADMITTED) == ("False", kueue.REASON_EVICTED)
    assert "higher priority" in (admitted_message(drain.status) or "")
    # Suspended by the queue, not by spec.suspend.
    assert drain.status.phase == "Suspended"
    assert _reason(drain.status, "Suspended") == ("True", kueue.REASON_EVICTED)
    job = with_status(job, drain)
    exited = reconcile(
        observed_with(observe(job, pools, created, dict.fromkeys(range(4), "Succeeded")), evicted),
        refuse,
        catalog,
        NOW + timedelta(seconds=40),
    )
    assert set(exited.delete_pods) == set(workers)
    job = with_status(job, exited)

    # The workers are gone: the job plans anew and queues the new plan; the old Workload
    # (and its quota) goes.
    kept = [o for o in created if o["kind"] != "Pod"]
    replanned = reconcile(
        observed_with(observe(job, pools, kept), evicted),
        RecordingPlanner(Planned(best=plan)),
        catalog,
        NOW + timedelta(seconds=50),
    )
    (new,) = [o for o in replanned.create if o["kind"] == "Workload"]
    assert new["metadata"]["name"] == kueue.workload_name(job.name, 2)
    assert not [o for o in replanned.create if o["kind"] == "Pod"]
    assert replanned.delete_workloads == (workload["metadata"]["name"],)
    assert replanned.status.phase == "Suspended"
    assert _reason(replanned.status, "Suspended") == ("True", kueue.REASON_AWAITING_ADMISSION)


def test_a_finished_job_deletes_its_workload_which_returns_the_quota(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    first = first_pass(job, pools, plan, catalog)
    (workload,) = [o for o in first.create if o["kind"] == "Workload"]
    job = with_status(job, first)
    admitted = workload_status(workload, **ADMITTED)
    started = reconcile(
        observed_with(observe(job, pools, list(first.create)), admitted), refuse, catalog, NOW
    )
    created = [*first.create, *started.create]
    job = with_status(job, started)
    done = reconcile(
        observed_with(observe(job, pools, created, dict.fromkeys(range(4), "Succeeded")), admitted),
        refuse,
        catalog,
        NOW + timedelta(seconds=60),
    )
    assert done.status.phase == "Succeeded"
    assert done.delete_workloads == (workload["metadata"]["name"],)


def test_a_spec_suspended_queued_job_never_creates_a_workload(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    job = queued(make_job(JOB_SPEC | {"suspend": True}))
    outcome = reconcile(Observed(job=job, pools=pools), refuse, catalog, NOW)
    assert outcome.create == () and outcome.status.phase == "Suspended"
    assert _reason(outcome.status, "Suspended") == ("True", "JobSuspended")


def test_the_shipped_queues_give_every_example_gpupool_its_flavor_and_quota() -> None:
    """manifests/kueue/queues.yaml (docs/guide/kueue.md) fits manifests/examples: one
    ResourceFlavor per example GPUPool selecting its node pool, each with a GPU quota in the
    ClusterQueue, and the LocalQueue in the examples' namespace."""
    root = Path(__file__).resolve().parents[2]
    queues = list(yaml.safe_load_all((root / "manifests/kueue/queues.yaml").read_text()))
    examples = [
        d
        for f in sorted((root / "manifests/examples").glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d
    ]
    # A pool names its GKE node pool, or selects its nodes by that label.
    node_pools = {
        d["spec"].get("nodePool")
        or d["spec"]["selector"]["matchLabels"]["cloud.google.com/gke-nodepool"]
        for d in examples
        if d["kind"] == "GPUPool"
    }
    flavors = {
        d["metadata"]["name"]: d["spec"]["nodeLabels"]["cloud.google.com/gke-nodepool"]
        for d in queues
        if d["kind"] == "ResourceFlavor"
    }
    assert sorted(flavors.values()) == sorted(node_pools)
    (cluster_queue,) = [d for d in queues if d["kind"] == "ClusterQueue"]
    (group,) = cluster_queue["spec"]["resourceGroups"]
    assert set(group["coveredResources"]) == {"cpu", "memory", kueue.GPU_RESOURCE}
    quotas = {
        f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in group["flavors"]
    }
    assert set(quotas) == set(flavors)
    assert all(int(q[kueue.GPU_RESOURCE]) > 0 for q in quotas.values())
    (local,) = [d for d in queues if d["kind"] == "LocalQueue"]
    namespaces = {d["metadata"]["name"] for d in examples if d["kind"] == "Namespace"}
    assert local["metadata"]["namespace"] in namespaces
    assert local["spec"]["clusterQueue"] == cluster_queue["metadata"]["name"]


def test_the_workers_priority_class_is_the_workloads_so_kueue_orders_and_preempts_by_it(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    overrides = {"spec": {"priorityClassName": "training-high"}}
    job = queued(make_job(JOB_SPEC | {"podTemplateOverrides": overrides}))
    observed = Observed(job=job, pools=pools, workload_priority=100_000)
    outcome = reconcile(observed, RecordingPlanner(Planned(best=plan)), catalog, NOW)
    (workload,) = [o for o in outcome.create if o["kind"] == "Workload"]
    assert {k: workload["spec"][k] for k in ("priorityClassName", "priority")} == {
        "priorityClassName": "training-high",
        "priority": 100_000,
    }
    assert workload["spec"]["priorityClassSource"] == "scheduling.k8s.io/priorityclass"
    # Without one the Workload names none (Kueue then uses its default, 0).
    plain = first_pass(queued(make_job()), pools, plan, catalog)
    (workload,) = [o for o in plain.create if o["kind"] == "Workload"]
    assert "priorityClassName" not in workload["spec"] and "priority" not in workload["spec"]


# -- a replan keeps the job's standing in the queue ------------------------------------------
def _generation_pods(
    job: TrainingJob, plan: Plan, generation: int, pools: tuple[GPUPool, ...]
) -> tuple[dict[str, Any], ...]:
    return desired_children(job, plan, generation, 0, {p.name: p for p in pools}).pods


def _admit_generation(
    job: TrainingJob,
    pools: tuple[GPUPool, ...],
    plan: Plan,
    generation: int,
    *bodies: dict[str, Any],
) -> kueue.Admission:
    pods = _generation_pods(job, plan, generation, pools)
    admission = kueue.admit(
        job,
        tuple(w for w in map(kueue.observed_workload, bodies) if w is not None),
        list(pods),
        generation=generation,
        generation_pods=pods,
        finished=False,
        previous=None,
    )
    assert admission is not None
    return admission


def test_a_replan_while_waiting_updates_the_pending_workload_which_keeps_its_place(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan
) -> None:
    """Kueue orders pending Workloads by priority, then creation time: the replan's pod sets
    go into the Workload that waits (allowed while no quota is reserved), so the job keeps
    its place; the patch is conditional on the Workload as read."""
    old = kueue.render_workload(job, 1, _generation_pods(job, plan, 1, pools), QUEUE)
    pending = workload_status(old, resource_version="41", **NO_QUOTA)
    admission = _admit_generation(job, pools, plan, 2, pending)
    assert not [o for o in admission.create if o["kind"] in ("Pod", "Workload")]
    assert admission.delete_workloads == ()
    ((name, patch),) = admission.patch_workloads
    assert name == old["metadata"]["name"]
    assert patch["metadata"] == {
        "labels": {"sailplan.dev/plan-generation": "2"},
        "resourceVersion": "41",
    }
    new = kueue.render_workload(job, 2, _generation_pods(job, plan, 2, pools), QUEUE)
    assert patch["spec"]["podSets"] == new["spec"]["podSets"]
    conditions = {c.type: (c.status, c.reason) for c in admission.conditions}
    assert conditions[kueue.COND_ADMITTED] == ("False", kueue.REASON_WORKLOAD_UPDATED)
    assert conditions["Suspended"] == ("True", kueue.REASON_AWAITING_ADMISSION)
    # The next pass finds it as the new generation's Workload.
    relabelled = pending | {
        "metadata": pending["metadata"]
        | {"labels": pending["metadata"]["labels"] | patch["metadata"]["labels"]}
    }
    (observed,) = [kueue.observed_workload(relabelled)]
    assert observed is not None and observed.generation == 2


def test_an_admitted_workload_whose_quota_covers_the_new_plan_keeps_its_admission(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan
) -> None:
    old_pods = _generation_pods(job, plan, 1, pools)
    old = kueue.render_workload(job, 1, old_pods, QUEUE)
    # Admitted for one worker more per pool than the new plan has.
    bigger = old | {
        "spec": old["spec"]
        | {"podSets": [ps | {"count": ps["count"] + 1} for ps in old["spec"]["podSets"]]}
    }
    admission = _admit_generation(job, pools, plan, 2, workload_status(bigger, **ADMITTED))
    assert [o["kind"] for o in admission.create] == ["Pod"] * len(plan.workers())
    ((name, patch),) = admission.patch_workloads
    assert name == old["metadata"]["name"] and "spec" not in patch  # admitted: never resized
    assert patch["metadata"] == {"labels": {"sailplan.dev/plan-generation": "2"}}
    conditions = {c.type: (c.status, c.reason) for c in admission.conditions}
    assert conditions[kueue.COND_ADMITTED] == ("True", kueue.REASON_ADMITTED)
    assert admission.phase is None


def test_a_new_plan_beyond_the_admitted_quota_or_after_an_eviction_gets_a_new_workload(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan
) -> None:
    old = kueue.render_workload(job, 1, _generation_pods(job, plan, 1, pools), QUEUE)
    smaller = old | {
        "spec": old["spec"]
        | {"podSets": [ps | {"count": ps["count"] - 1} for ps in old["spec"]["podSets"]]}
    }
    for body in (workload_status(smaller, **ADMITTED), workload_status(old, **EVICTED)):
        admission = _admit_generation(job, pools, plan, 2, body)
        (new,) = [o for o in admission.create if o["kind"] == "Workload"]
        assert new["metadata"]["name"] == kueue.workload_name(job.name, 2)
        assert admission.delete_workloads == (old["metadata"]["name"],)
        assert admission.patch_workloads == ()
        assert not [o for o in admission.create if o["kind"] == "Pod"]


def test_charged_sums_each_pools_requests_over_its_pod_sets(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan
) -> None:
    pods = _generation_pods(job, plan, 1, pools)
    workload = kueue.render_workload(job, 1, pods, QUEUE)
    gpus: dict[str, float] = {}
    for pod in pods:
        pool = pod["metadata"]["labels"]["sailplan.dev/gpupool"]
        asked = pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
        gpus[pool] = gpus.get(pool, 0.0) + float(asked)
    assert {
        pool: total
        for pool, resource, total in kueue.charged(workload)
        if resource == kueue.GPU_RESOURCE
    } == gpus
    charged = kueue.charged(workload)
    assert kueue.fits_within(charged, charged)
    assert not kueue.fits_within(charged, charged[1:])


def test_watched_workloads_ask_for_no_poll_and_listed_ones_do(
    job: TrainingJob, pools: tuple[GPUPool, ...], plan: Plan
) -> None:
    """Where the operator watches Workloads (Kueue installed at its start) their changes
    run the pass, so the gate asks for no later pass; where it lists them it polls, faster
    right after creating one; without Kueue every minute."""
    pods = _generation_pods(job, plan, 1, pools)
    created = kueue.render_workload(job, 1, pods, QUEUE)

    def requeue(watched: bool, *bodies: dict[str, Any], served: bool = True) -> float | None:
        admission = kueue.admit(
            job,
            tuple(w for w in map(kueue.observed_workload, bodies) if w is not None)
            if served
            else None,
            list(pods),
            generation=1,
            generation_pods=pods,
            finished=False,
            previous=None,
            watched=watched,
        )
        assert admission is not None
        return admission.requeue_after

    waiting = workload_status(created, **NO_QUOTA)
    admitted = workload_status(created, **ADMITTED)
    assert [requeue(True), requeue(True, waiting), requeue(True, admitted)] == [None] * 3
    assert [requeue(False), requeue(False, waiting), requeue(False, admitted)] == [
        kueue.CREATED_POLL_SECONDS,
        kueue.WAITING_POLL_SECONDS,
        kueue.ADMITTED_POLL_SECONDS,
    ]
    assert requeue(True, served=False) == kueue.MISSING_POLL_SECONDS
