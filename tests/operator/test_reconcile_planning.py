"""The reconcile while the planner searches: the Planning condition says what is searched,
nothing is created, running workers are left alone, and how the search ended is reported."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from operator_builders import JOB_SPEC, RecordingPlanner, pool
from test_reconcile_trainingjob import observe, with_status

from sailplan.operator.api.common import Condition, find_condition
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob, TrainingJobStatus
from sailplan.operator.reconcile.trainingjob import Observed, reconcile
from sailplan.operator.replan.triggers import profiles_fingerprint
from sailplan.operator.search import Interim, PlannerAnswer, SearchFailed, Searching, describe
from sailplan.planner.api import Planned, PlanRequest
from sailplan.planner.catalog import Catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.plan import Plan
from sailplan.planner.profiles.types import ProfileSet

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class SearchingPlanner:
    """A search that started 42 s before NOW and has not ended."""

    requests: list[PlanRequest] = field(default_factory=list)

    def __call__(self, request: PlanRequest, measured: ProfileSet) -> PlannerAnswer:
        self.requests.append(request)
        return Searching(
            started_at=NOW - timedelta(seconds=42),
            deadline_seconds=request.deadline_seconds or 120,
            what=describe(request),
        )


def planning(status: TrainingJobStatus) -> Condition:
    condition = find_condition(status.conditions, "Planning")
    assert condition is not None
    return condition


@pytest.fixture
def job(make_job: Callable[..., TrainingJob]) -> TrainingJob:
    return make_job(JOB_SPEC | {"planning": {"deadlineSeconds": 90}})


def test_a_new_job_says_what_is_searched_and_creates_nothing(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    searching = SearchingPlanner()
    outcome = reconcile(Observed(job=job, pools=pools), searching, catalog, NOW)
    (request,) = searching.requests
    assert request.deadline_seconds == 90  # spec.planning.deadlineSeconds
    assert outcome.create == () and outcome.delete_pods == ()
    condition = planning(outcome.status)
    assert (condition.status, condition.reason) == ("True", "Searching")
    for part in ("42 s", "deadline 90 s", "OPT-350M", "16 A100-40", "12 V100-16", "throughput"):
        assert part in condition.message
    assert outcome.status.phase == "Pending"
    assert outcome.status.plan is None
    assert find_condition(outcome.status.conditions, "Planned") is None
    # The pass comes back while the search runs, so the elapsed time stays current.
    assert outcome.requeue_after is not None and outcome.requeue_after <= 15


def test_the_finished_search_creates_the_plan_and_says_how_it_ended(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog, plan: Plan
) -> None:
    first = reconcile(Observed(job=job, pools=pools), SearchingPlanner(), catalog, NOW)
    job = with_status(job, first)
    found = Planned(best=plan, plans_evaluated=17, search_seconds=3.5)
    done = reconcile(Observed(job=job, pools=pools), RecordingPlanner(found), catalog, NOW)
    assert [o["kind"] for o in done.create][:2] == ["ConfigMap", "Service"]
    condition = planning(done.status)
    assert (condition.status, condition.reason) == ("False", "PlanFound")
    assert "17 plans" in condition.message
    assert condition.last_transition_time == NOW


def test_a_deadline_ends_with_the_best_plan_found_so_far(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog, plan: Plan
) -> None:
    best_so_far = Planned(best=plan, exhaustive=False, plans_evaluated=5, search_seconds=90)
    outcome = reconcile(Observed(job=job, pools=pools), RecordingPlanner(best_so_far), catalog, NOW)
    assert any(o["kind"] == "Pod" for o in outcome.create)
    condition = planning(outcome.status)
    assert (condition.status, condition.reason) == ("False", "DeadlineReachedBestPlan")


def test_a_failed_search_makes_the_job_unschedulable_with_the_reason(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    def crashed(request: PlanRequest, measured: ProfileSet) -> PlannerAnswer:
        return SearchFailed("the search process died without an answer (killed by signal 9)")

    outcome = reconcile(Observed(job=job, pools=pools), crashed, catalog, NOW)
    assert outcome.create == ()
    assert outcome.status.phase == "Unschedulable"
    unschedulable = find_condition(outcome.status.conditions, "Unschedulable")
    assert unschedulable is not None and unschedulable.reason == "SearchFailed"
    assert "signal 9" in unschedulable.message
    assert (planning(outcome.status).status, planning(outcome.status).reason) == (
        "False",
        "SearchFailed",
    )
    # The same job on the same cluster does not ask again (the answer would not change).
    again = reconcile(
        Observed(job=with_status(job, outcome), pools=pools), SearchingPlanner(), catalog, NOW
    )
    assert again.status == outcome.status


def test_a_replan_search_leaves_the_running_generation_alone(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog, plan: Plan
) -> None:
    first = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, NOW
    )
    job, created = with_status(job, first), list(first.create)
    running = dict.fromkeys(range(4), "Running")
    # Worker 2 is preempted: lost capacity needs a new plan, whose search is under way.
    searching = SearchingPlanner()
    outcome = reconcile(
        observe(job, pools, created, running | {2: "Failed"}, frozenset({2})),
        searching,
        catalog,
        NOW,
    )
    assert len(searching.requests) == 1
    assert outcome.create == () and outcome.delete_pods == () and outcome.annotate_pods == ()
    assert outcome.memory == job.memory  # no decision taken yet
    assert outcome.status.plan == job.status.plan
    assert (planning(outcome.status).status, planning(outcome.status).reason) == (
        "True",
        "Searching",
    )
    # The search ends: the same pass now switches to the new plan.
    found = RecordingPlanner(Planned(best=plan))
    switched = reconcile(
        observe(with_status(job, outcome), pools, created, running | {2: "Failed"}, frozenset({2})),
        found,
        catalog,
        NOW,
    )
    assert switched.status.phase == "Replanning"
    assert switched.delete_pods == tuple(f"opt-g1-a0-w{i}" for i in range(4))
    assert planning(switched.status).reason == "PlanFound"


def test_a_search_no_longer_asked_for_is_reported_as_dropped(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog, plan: Plan
) -> None:
    first = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, NOW
    )
    job, created = with_status(job, first), list(first.create)
    running = dict.fromkeys(range(4), "Running")
    searching = reconcile(
        observe(job, pools, created, running | {2: "Failed"}, frozenset({2})),
        SearchingPlanner(),
        catalog,
        NOW,
    )
    # The preempted worker comes back to life (a stale report): no replan is needed.
    calm = reconcile(
        observe(with_status(job, searching), pools, created, running),
        RecordingPlanner(Planned(best=plan)),
        catalog,
        NOW,
    )
    condition = planning(calm.status)
    assert (condition.status, condition.reason) == ("False", "SearchNotNeeded")


# -- an interim plan: made from other inputs, served while the exact search runs ------------
# What the interim plan was made from: a snapshot of before (one A100 node in each zone).
MADE_FROM = ClusterSnapshot(
    pools=(
        Pool(name="a100/us-central1-a", gpu_type="A100-40", zone="us-central1-a",
             gpus_per_node=4, nodes=1),
        Pool(name="a100/us-central1-b", gpu_type="A100-40", zone="us-central1-b",
             gpus_per_node=4, nodes=1),
        Pool(name="v100/us-west1-b", gpu_type="V100-16", zone="us-west1-b",
             gpus_per_node=4, nodes=1),
    )
)  # fmt: skip


@dataclass
class InterimPlanner:
    """A search under way that carries a finished plan of the same spec that fits now."""

    plan: Plan
    requests: list[PlanRequest] = field(default_factory=list)

    def __call__(self, request: PlanRequest, measured: ProfileSet) -> PlannerAnswer:
        self.requests.append(request)
        interim = Interim(Planned(best=self.plan), MADE_FROM, ProfileSet())
        return Searching(NOW, 90, describe(request), interim=interim)


def test_a_new_job_starts_on_the_interim_plan_judged_against_what_it_was_made_from(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog, plan: Plan
) -> None:
    outcome = reconcile(Observed(job=job, pools=pools), InterimPlanner(plan), catalog, NOW)
    assert [o["kind"] for o in outcome.create].count("Pod") == len(plan.workers())
    assert outcome.status.plan is not None and outcome.status.plan.generation == 1
    # The exact search still runs, and says so; the replan machine compares the cluster
    # with the snapshot the plan was made from, so the capacity added since is a trigger.
    assert planning(outcome.status).reason == "Searching"
    state = outcome.memory.replan
    assert state is not None
    assert state.evaluated_cluster == MADE_FROM
    assert state.evaluated_cluster_hash == MADE_FROM.content_hash()
    assert state.evaluated_profiles == profiles_fingerprint(ProfileSet())


def test_new_capacity_waits_for_the_exact_answer_not_the_interim_plan(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog, plan: Plan
) -> None:
    first = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, NOW
    )
    job, created = with_status(job, first), list(first.create)
    running = dict.fromkeys(range(4), "Running")
    more = (pool("a100", "a100-ondemand", {"us-central1-a": 4, "us-central1-b": 2}), pools[1])
    interim = InterimPlanner(plan)
    outcome = reconcile(observe(job, more, created, running), interim, catalog, NOW)
    assert len(interim.requests) == 1  # the new capacity asked for a plan
    # A voluntary change is not judged on a plan made from other inputs: no decision yet,
    # so the trigger asks again when the exact search ends.
    assert outcome.memory == job.memory
    assert outcome.create == () and outcome.delete_pods == ()


def test_lost_capacity_switches_to_the_interim_plan_at_once(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog, plan: Plan
) -> None:
    first = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, NOW
    )
    job, created = with_status(job, first), list(first.create)
    running = dict.fromkeys(range(4), "Running")
    outcome = reconcile(
        observe(job, pools, created, running | {2: "Failed"}, frozenset({2})),
        InterimPlanner(plan),
        catalog,
        NOW,
    )
    assert outcome.status.phase == "Replanning"
    state = outcome.memory.replan
    assert state is not None and state.target_generation == 2
    assert state.evaluated_cluster == MADE_FROM
