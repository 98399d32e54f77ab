"""The TrainingJob reconcile drives profiling Jobs: what it creates, when it plans, what it
asks the handler to collect, what it says when profiling fails, and what it does for an
autoscaled pool with no ready node. Pure: no cluster."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from operator_builders import JOB_SPEC, RecordingPlanner, make_plan, pool
from test_reconcile_trainingjob import with_status

from sailplan.operator.api.common import find_condition
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob, TrainingJobStatus
from sailplan.operator.profiling.jobs import LABEL_NEED, LABEL_RANK
from sailplan.operator.profiling.needs import (
    ComputeNeed,
    Need,
    missing_profiles,
    need_id,
)
from sailplan.operator.profiling.status import RESULT_ERROR_ANNOTATION, observed_job
from sailplan.operator.profiling.step import nodes_taken
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.operator.reconcile.trainingjob import Observed, Outcome, reconcile
from sailplan.planner.api import Planned, PlanRequest, PlanResult
from sailplan.planner.catalog import Catalog, default_catalog
from sailplan.planner.profiles.types import (
    BandwidthCurve,
    ComputeProfile,
    NetworkProfile,
    ProfileSet,
    Provenance,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
MEASURED = Provenance(source="measured", tool="sailplan-profile")


def never(request: PlanRequest, measured: ProfileSet) -> PlanResult:
    raise AssertionError("policy Required must not plan before the profiles are measured")


def job_with(make_job: Callable[..., TrainingJob], mode: str, status: Any = None) -> TrainingJob:
    spec = JOB_SPEC | {"profiling": {"mode": mode}}
    return make_job(spec, status.model_dump(by_alias=True, mode="json") if status else None)


def needs_of(job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog) -> tuple[Need, ...]:
    model = catalog.model(job.spec.model.name or "")
    return missing_profiles(
        model, job.spec.training.global_batch_size, build_snapshot(pools), ProfileSet()
    )


def measured_for(needs: tuple[Need, ...]) -> ProfileSet:
    """One measured profile per need: what a successful profiling run stores."""
    compute, network = [], []
    for need in needs:
        if isinstance(need, ComputeNeed):
            layers = need.model.num_layers
            compute.append(
                ComputeProfile(
                    model=need.model.name,
                    gpu_type=need.site.gpu_type,
                    tensor_parallel=1,
                    micro_batch_size=1,
                    forward_s=(0.001,) * layers,
                    backward_s=(0.002,) * layers,
                    update_s=(0.0001,) * layers,
                    provenance=MEASURED,
                )
            )
        else:
            # what `sailplan-profile network` writes for the need: every measure, filed
            # under the GPUs per node it ran with (and, between zones, under the zone
            # pair, one profile per direction)
            ends = [(need.site, need.peer)]
            if need.zone_pair:
                ends.append((need.peer, need.site))
            network.extend(
                NetworkProfile(
                    link=need.link,
                    gpu_type=sender.gpu_type,
                    peer_gpu_type=receiver.gpu_type,
                    zone=sender.zone if need.zone_pair else "",
                    peer_zone=receiver.zone if need.zone_pair else "",
                    gpus_per_node=need.flows,
                    measure=measure,
                    curve=BandwidthCurve(coefficients=(0.0, 0.0, 1.0), max_bytes_per_s=1e9),
                    provenance=MEASURED,
                )
                for sender, receiver in ends
                for measure in ("p2p", "concurrent", "allreduce")
            )
    return ProfileSet(compute=tuple(compute), network=tuple(network))


def as_observed_jobs(created: tuple[dict[str, Any], ...], state: str = "") -> tuple[Any, ...]:
    """The profiling Jobs among `created` as the API server would show them in `state`."""
    found = []
    for obj in created:
        if obj["kind"] != "Job":
            continue
        conditions = [{"type": state, "status": "True"}] if state else []
        body = obj | {"status": {"conditions": conditions}}
        parsed = observed_job(body)
        assert parsed is not None
        found.append(parsed)
    return tuple(found)


def condition(status: TrainingJobStatus, type_: str) -> tuple[str, str, str]:
    found = find_condition(status.conditions, type_)
    assert found is not None, f"no {type_} condition in {status.conditions}"
    return found.status, found.reason, found.message


def kinds(outcome: Outcome) -> list[str]:
    return sorted({o["kind"] for o in outcome.create})


def test_required_launches_a_job_per_missing_profile_and_does_not_plan(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    job = job_with(make_job, "Required")
    outcome = reconcile(Observed(job=job, pools=pools), never, catalog, NOW)
    needs = needs_of(job, pools, catalog)
    assert needs, "the fixture pools lack profiles, so there is something to profile"
    # Only profiling objects: no plan ConfigMap, no worker pod.
    assert kinds(outcome) == ["Job", "Service"]
    launched = {o["metadata"]["labels"][LABEL_NEED] for o in outcome.create if o["kind"] == "Job"}
    assert launched == {need_id(n) for n in needs}
    for obj in outcome.create:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("TrainingJob", job.uid)
    assert outcome.status.phase == "Pending"
    assert condition(outcome.status, "Planned")[:2] == ("False", "AwaitingProfiles")
    assert condition(outcome.status, "Profiling")[:2] == ("True", "ProfilingPending")
    assert [e.reason for e in outcome.events] == ["ProfilingStarted"]

    # Next pass, Jobs running: nothing is created twice, still no plan.
    job = with_status(job, outcome)
    again = reconcile(
        Observed(job=job, pools=pools, profiling_jobs=as_observed_jobs(outcome.create)),
        never,
        catalog,
        NOW,
    )
    assert again.create == () and again.collect == ()
    assert condition(again.status, "Profiling")[:2] == ("True", "ProfilingRunning")
    assert again.events == ()


def test_succeeded_jobs_are_collected_then_the_job_plans_with_measured_profiles(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    job = job_with(make_job, "Required")
    first = reconcile(Observed(job=job, pools=pools), never, catalog, NOW)
    job = with_status(job, first)
    done = as_observed_jobs(first.create, "Complete")
    collected = reconcile(Observed(job=job, pools=pools, profiling_jobs=done), never, catalog, NOW)
    needs = needs_of(job, pools, catalog)
    assert {c.need.key for c in collected.collect} == {n.key for n in needs}
    for item in collected.collect:
        # A network pair's result is in rank 0's log; a compute or intra-node run has one pod.
        pair = not isinstance(item.need, ComputeNeed) and item.need.link != "intra-node"
        assert (item.pod_labels.get(LABEL_RANK) == "0") == pair
        assert len(item.jobs) == (2 if pair else 1)
    assert collected.create == ()

    # The handler stored the results: the job plans, from measured profiles only.
    job = with_status(job, collected)
    planner = RecordingPlanner(Planned(best=make_plan(catalog)))
    measured = measured_for(needs)
    planned = reconcile(
        Observed(job=job, pools=pools, profiling_jobs=done, measured=measured),
        planner,
        catalog,
        NOW,
    )
    assert len(planner.requests) == 1
    assert planned.collect == ()
    assert condition(planned.status, "Planned")[:2] == ("True", "PlanCreated")
    assert condition(planned.status, "Profiling")[:2] == ("False", "ProfilesReady")
    assert {o["kind"] for o in planned.create} == {"ConfigMap", "Service", "Pod"}
    # Nothing reserved for profiling any more: the planner sees every free node.
    assert sum(p.nodes for p in planner.requests[0].cluster.pools) == 2 + 2 + 3


def test_a_failed_profiling_job_stops_required_with_its_reason_and_a_way_out(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    job = job_with(make_job, "Required")
    first = reconcile(Observed(job=job, pools=pools), never, catalog, NOW)
    job = with_status(job, first)
    jobs = list(as_observed_jobs(first.create, "Complete"))
    broken = jobs[0]
    jobs[0] = dataclasses.replace(
        broken,
        complete=False,
        failed=True,
        reason="BackoffLimitExceeded",
        message="Job has reached the specified backoff limit",
    )
    outcome = reconcile(
        Observed(job=job, pools=pools, profiling_jobs=tuple(jobs)), never, catalog, NOW
    )
    state, reason, message = condition(outcome.status, "Planned")
    assert (state, reason) == ("False", "ProfilingFailed")
    assert broken.name in message and "BackoffLimitExceeded" in message
    assert "delete that Job to retry" in message
    assert condition(outcome.status, "Profiling")[:2] == ("False", "ProfilingFailed")
    assert [e.reason for e in outcome.events] == ["ProfilingFailed"]
    assert all(c.need.key not in message for c in outcome.collect)
    # Failed needs are not relaunched by themselves, and the Warning is not repeated.
    job = with_status(job, outcome)
    again = reconcile(
        Observed(job=job, pools=pools, profiling_jobs=tuple(jobs)), never, catalog, NOW
    )
    assert again.create == () and again.events == ()


def test_a_result_the_operator_could_not_read_counts_as_a_failure() -> None:
    body = {
        "metadata": {
            "name": "opt-prof-0123456789",
            "labels": {LABEL_NEED: "0123456789"},
            "annotations": {RESULT_ERROR_ANNOTATION: "the report container printed nothing"},
        },
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    found = observed_job(body)
    assert found is not None
    assert (found.complete, found.failed, found.reason) == (False, True, "ResultUnreadable")
    assert found.message == "the report container printed nothing"


def test_auto_plans_with_estimates_around_the_nodes_profiling_takes(
    make_job: Callable[..., TrainingJob], catalog: Catalog
) -> None:
    # two nodes more in zone b than the fixture: the A100 compute run (on the pool and zone
    # with the most nodes) and zone b's two zone pairs (to zone a, to us-west1) take three
    # of its nodes, and the plan gets the fourth
    pools = (
        pool("a100", "a100-ondemand", {"us-central1-a": 2, "us-central1-b": 4}),
        pool("v100", "v100-ondemand", {"us-west1-b": 3}, gpu_type="V100-16"),
    )
    job = job_with(make_job, "Auto")
    planner = RecordingPlanner(Planned(best=make_plan(catalog, estimated=True)))
    outcome = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    created = [o["kind"] for o in outcome.create]
    # Profiling objects first, then the plan, its Service and the workers.
    assert created.index("Pod") > max(i for i, k in enumerate(created) if k == "Job")
    assert "ConfigMap" in created
    assert condition(outcome.status, "Planned")[:2] == ("True", "PlanCreated")
    assert condition(outcome.status, "ProfilesMeasured")[:2] == ("False", "Estimated")
    (request,) = planner.requests
    taken = nodes_taken(needs_of(job, pools, catalog))
    assert sum(taken.values()) > 0
    free = {p.name: p.nodes for p in build_snapshot(pools).pools}
    assert {p.name: p.nodes for p in request.cluster.pools} == {
        name: max(0, nodes - taken.get(name, 0)) for name, nodes in free.items()
    }


def test_skip_never_profiles(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    job = job_with(make_job, "Skip")
    planner = RecordingPlanner(Planned(best=make_plan(catalog, estimated=True)))
    outcome = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    assert "Job" not in kinds(outcome)
    assert find_condition(outcome.status.conditions, "Profiling") is None
    assert sum(p.nodes for p in planner.requests[0].cluster.pools) == 2 + 2 + 3


@pytest.mark.parametrize("mode", ["Auto", "Required"])
def test_profiling_jobs_of_an_earlier_job_with_the_same_name_are_ignored(
    make_job: Callable[..., TrainingJob],
    pools: tuple[GPUPool, ...],
    catalog: Catalog,
    mode: str,
) -> None:
    job = job_with(make_job, mode)
    planner = RecordingPlanner(Planned(best=make_plan(catalog, estimated=True)))
    first = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    stale = tuple(
        dataclasses.replace(j, owner_uid="uid-of-an-earlier-job")
        for j in as_observed_jobs(first.create, "Complete")
    )
    outcome = reconcile(Observed(job=job, pools=pools, profiling_jobs=stale), planner, catalog, NOW)
    assert outcome.collect == ()  # their results belong to nobody here
    assert {o["kind"] for o in outcome.create} >= {"Job"}  # ours are (re)created


def test_switching_to_skip_stops_reporting_pending_profiling(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    job = job_with(make_job, "Required")
    first = reconcile(Observed(job=job, pools=pools), never, catalog, NOW)
    assert condition(first.status, "Profiling")[0] == "True"
    # The user gives up on measurements before any Job ran (they are deleted with the edit).
    skip = job_with(make_job, "Skip", first.status)
    planner = RecordingPlanner(Planned(best=make_plan(catalog, estimated=True)))
    outcome = reconcile(Observed(job=skip, pools=pools), planner, catalog, NOW)
    assert outcome.create and "Job" not in kinds(outcome)
    state, reason, message = condition(outcome.status, "Profiling")
    assert (state, reason) == ("False", "ProfilingSkipped")
    assert "Skip" in message


def test_busy_nodes_still_count_as_pools_to_profile(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    # Every node busy (e.g. with this job's own profiling pods): the pools are still the
    # job's, so what they lack is still missing, and Required keeps waiting for it rather
    # than calling the job unschedulable.
    def busy(pool: GPUPool) -> GPUPool:
        zones = tuple(z.model_copy(update={"nodes_free": 0}) for z in pool.status.zones)
        return pool.model_copy(update={"status": pool.status.model_copy(update={"zones": zones})})

    job = job_with(make_job, "Required")
    outcome = reconcile(Observed(job=job, pools=tuple(map(busy, pools))), never, catalog, NOW)
    assert outcome.status.phase == "Pending"
    assert condition(outcome.status, "Planned")[:2] == ("False", "AwaitingProfiles")
    launched = {o["metadata"]["labels"][LABEL_NEED] for o in outcome.create if o["kind"] == "Job"}
    assert launched == {need_id(n) for n in needs_of(job, pools, catalog)}


def zero_node_pools(ready_a100: int = 0) -> tuple[GPUPool, ...]:
    """An autoscaled A100 pool with `ready_a100` ready nodes in us-central1-a (none in b)
    that may add two per zone, and V100s that exist."""
    a100 = pool("a100", "a100-ondemand", {"us-central1-a": ready_a100, "us-central1-b": 0})
    zones = tuple(z.model_copy(update={"nodes_possible": 2}) for z in a100.status.zones)
    a100 = a100.model_copy(update={"status": a100.status.model_copy(update={"zones": zones})})
    return (a100, pool("v100", "v100-ondemand", {"us-west1-b": 3}, gpu_type="V100-16"))


def launched_keys(outcome: Outcome, job: TrainingJob, pools: tuple[GPUPool, ...]) -> set[str]:
    """The store keys of the needs whose profiling Jobs `outcome` creates."""
    model = default_catalog().model(job.spec.model.name or "")
    batch = job.spec.training.global_batch_size
    every = missing_profiles(model, batch, build_snapshot(pools, "possible"), ProfileSet())
    by_id = {need_id(n): n.key for n in every}
    return {
        by_id[o["metadata"]["labels"][LABEL_NEED]] for o in outcome.create if o["kind"] == "Job"
    }


A100_COMPUTE = "compute/OPT-350M/A100-40"


def test_auto_plans_a_pool_at_zero_nodes_with_estimates_and_profiles_it_once_a_node_is_ready(
    make_job: Callable[..., TrainingJob], catalog: Catalog
) -> None:
    job = job_with(make_job, "Auto")
    planner = RecordingPlanner(Planned(best=make_plan(catalog, estimated=True)))
    pools = zero_node_pools()
    outcome = reconcile(Observed(job=job, pools=pools), planner, catalog, NOW)
    # The V100s are measured now; nothing can measure an A100 before one exists.
    launched = launched_keys(outcome, job, pools)
    assert launched and A100_COMPUTE not in launched
    (request,) = planner.requests
    assert any(p.gpu_type == "A100-40" and p.obtainable_nodes for p in request.cluster.pools)
    assert condition(outcome.status, "Planned")[:2] == ("True", "PlanCreated")
    state, reason, message = condition(outcome.status, "ProfilesMeasured")
    assert (state, reason) == ("False", "Estimated") and "A100-40" in message

    # A node of the pool is Ready (the autoscaler added it): the next pass profiles it.
    job = with_status(job, outcome)
    ready = zero_node_pools(ready_a100=1)
    again = reconcile(
        Observed(job=job, pools=ready, profiling_jobs=as_observed_jobs(outcome.create)),
        RecordingPlanner(Planned(best=make_plan(catalog, estimated=True))),
        catalog,
        NOW,
    )
    assert A100_COMPUTE in launched_keys(again, job, ready)


def test_required_profiles_a_pool_at_zero_nodes_on_a_node_its_profiling_pod_brings(
    make_job: Callable[..., TrainingJob], catalog: Catalog
) -> None:
    job = job_with(make_job, "Required")
    pools = zero_node_pools()
    outcome = reconcile(Observed(job=job, pools=pools), never, catalog, NOW)
    assert A100_COMPUTE in launched_keys(outcome, job, pools)
    assert condition(outcome.status, "Planned")[:2] == ("False", "AwaitingProfiles")
    # Its pod is pinned to the pool and a zone that may add a node: what makes the
    # autoscaler add one.
    (compute,) = [
        o
        for o in outcome.create
        if o["kind"] == "Job"
        and launched_keys(Outcome(status=outcome.status, create=(o,)), job, pools) == {A100_COMPUTE}
    ]
    terms = compute["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    expressions = {e["key"]: e["values"] for term in terms for e in term["matchExpressions"]}
    assert expressions["cloud.google.com/gke-nodepool"] == ["a100-ondemand"]
    assert expressions["topology.kubernetes.io/zone"][0] in {"us-central1-a", "us-central1-b"}
