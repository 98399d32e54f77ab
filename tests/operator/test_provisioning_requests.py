"""ProvisioningRequests for GPUPools that ask for capacity atomically: one request per pool
and zone of a plan generation, pod sets shaped like the workers, the workers annotated to
consume it, its state read from the autoscaler's conditions, the capacity a waiting
request reserves, and which requests no current plan consumes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from operator_builders import JOB_SPEC, make_plan, pool

from sailplan.operator.api.gpupool import ProvisioningRequestOptions
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.children import desired_children
from sailplan.operator.reconcile.nodes import pod_gpu_reservation
from sailplan.operator.reconcile.provisioning import (
    CONSUME_ANNOTATION,
    GPUS_ANNOTATION,
    capacity_requests,
    consuming,
    pod_template_names,
    request_reservations,
    request_state,
    stale_requests,
    waiting_requests,
)
from sailplan.planner.catalog import default_catalog

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
DWS = ProvisioningRequestOptions(parameters={"maxRunDurationSeconds": "86400"})


def workers() -> tuple[Any, list[dict[str, Any]]]:
    """The test plan's worker pods (operator_builders.make_plan: two A100 pools' zones and
    a V100 pool), rendered by the operator's own renderer."""
    plan = make_plan(default_catalog())
    job = TrainingJob.model_validate(
        {"name": "opt", "namespace": "team-a", "uid": "uid-1", "spec": JOB_SPEC}
    )
    pools = {
        "a100": pool("a100", "a100-ondemand", {"us-central1-a": 2, "us-central1-b": 2}),
        "v100": pool("v100", "v100-ondemand", {"us-west1-b": 3}, gpu_type="V100-16"),
    }
    return plan, list(desired_children(job, plan, 3, 1, pools).pods)


def test_one_request_per_pool_and_zone_covering_exactly_its_workers() -> None:
    _, pods = workers()
    requests = capacity_requests(pods, {"a100": DWS})
    by_zone: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pod in pods:
        reservation = pod_gpu_reservation(pod)
        assert reservation is not None
        by_zone.setdefault(reservation[:2], []).append(pod)
    a100_zones = sorted(key for key in by_zone if key[0] == "a100")
    assert [(r.gpupool, r.zone) for r in requests] == a100_zones
    for request in requests:
        members = by_zone[(request.gpupool, request.zone)]
        assert set(request.pods) == {p["metadata"]["name"] for p in members}
        spec = request.request["spec"]
        assert spec["provisioningClassName"] == "queued-provisioning.gke.io"
        assert spec["parameters"] == {"maxRunDurationSeconds": "86400"}
        # the pod sets count every worker once; each template is shaped like its workers
        assert sum(s["count"] for s in spec["podSets"]) == len(members)
        templates = {t["metadata"]["name"]: t for t in request.pod_templates}
        for pod_set in spec["podSets"]:
            template = templates[pod_set["podTemplateRef"]["name"]]["template"]
            gpus = template["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
            shaped = [
                p
                for p in members
                if p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == gpus
            ]
            assert pod_set["count"] == len(shaped)
            assert template["spec"]["affinity"] == shaped[0]["spec"]["affinity"]
            assert template["spec"]["tolerations"] == shaped[0]["spec"]["tolerations"]
        reserved = sum(pod_gpu_reservation(p)[2] for p in members)  # type: ignore[index]
        assert request.request["metadata"]["annotations"][GPUS_ANNOTATION] == str(reserved)
        # owned by the job, named for the job, generation and attempt
        assert request.request["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert request.name.startswith("opt-g3-a1-c")
    assert len({r.name for r in requests}) == len(requests)


def test_pools_without_the_option_get_no_request() -> None:
    _, pods = workers()
    assert capacity_requests(pods, {}) == []
    assert {r.gpupool for r in capacity_requests(pods, {"v100": DWS})} == {"v100"}


def test_a_worker_consuming_a_request_carries_both_annotation_generations() -> None:
    _, pods = workers()
    request = capacity_requests(pods, {"a100": DWS})[0]
    pod = next(p for p in pods if p["metadata"]["name"] == request.pods[0])
    annotated = consuming(pod, request)
    annotations = annotated["metadata"]["annotations"]
    assert annotations[CONSUME_ANNOTATION] == request.name
    assert annotations["cluster-autoscaler.kubernetes.io/consume-provisioning-request"] == (
        request.name
    )
    assert annotations["autoscaling.x-k8s.io/provisioning-class-name"] == (
        "queued-provisioning.gke.io"
    )
    assert CONSUME_ANNOTATION not in (pod["metadata"].get("annotations") or {})  # a copy


def with_conditions(*conditions: dict[str, str], **metadata: Any) -> dict[str, Any]:
    return {"metadata": metadata, "status": {"conditions": list(conditions)}}


def test_state_follows_the_autoscalers_conditions() -> None:
    assert request_state(None)[0] == "Pending"
    accepted = {"type": "Accepted", "status": "True", "message": "queued for capacity"}
    assert request_state(with_conditions(accepted)) == ("Pending", "queued for capacity")
    provisioned = {"type": "Provisioned", "status": "True", "message": "booked"}
    assert request_state(with_conditions(accepted, provisioned))[0] == "Provisioned"
    failed = {"type": "Failed", "status": "True", "message": "GCE_STOCKOUT in us-central1-a"}
    assert request_state(with_conditions(accepted, failed)) == (
        "Failed",
        "GCE_STOCKOUT in us-central1-a",
    )


def request_body(state: dict[str, str] | None, created: datetime, gpus: int) -> dict[str, Any]:
    labels = {naming.LABEL_GPUPOOL: "a100", "sailplan.dev/zone": "us-central1-a"}
    return {
        "metadata": {
            "labels": labels,
            "annotations": {GPUS_ANNOTATION: str(gpus)},
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "status": {"conditions": [state] if state else []},
    }


def test_waiting_requests_reserve_capacity_and_age_their_zone() -> None:
    waiting = request_body(None, NOW - timedelta(seconds=100), 8)
    provisioned = request_body(
        {"type": "Provisioned", "status": "True"}, NOW - timedelta(seconds=500), 16
    )
    failed = request_body({"type": "Failed", "status": "True"}, NOW - timedelta(seconds=10), 4)
    # Only a waiting request reserves: a Provisioned one's workers exist (and reserve as
    # unbound pods), a Failed one books nothing.
    assert request_reservations([waiting, provisioned, failed]) == [("a100", "us-central1-a", 8)]
    # The zone waits since the older waiting request; a Failed one counts as having waited
    # the pool's whole timeout, so the zone is backed off at once.
    assert waiting_requests([waiting, provisioned], {"a100": 900}) == {
        "a100": {"us-central1-a": NOW - timedelta(seconds=100)}
    }
    assert waiting_requests([waiting, failed], {"a100": 900}) == {
        "a100": {"us-central1-a": NOW - timedelta(seconds=910)}
    }


def test_requests_of_other_generations_and_attempts_or_of_an_ended_job_are_stale() -> None:
    plan, pods = workers()  # generation 3, attempt 1
    job = TrainingJob.model_validate(
        {"name": "opt", "namespace": "team-a", "uid": "uid-1", "spec": JOB_SPEC}
    )
    pools = {
        "a100": pool("a100", "a100-ondemand", {"us-central1-a": 2, "us-central1-b": 2}),
        "v100": pool("v100", "v100-ondemand", {"us-west1-b": 3}, gpu_type="V100-16"),
    }
    older = list(desired_children(job, plan, 2, 0, pools).pods)
    retried = list(desired_children(job, plan, 3, 0, pools).pods)
    current = [r.request for r in capacity_requests(pods, {"a100": DWS})]
    earlier = [
        r.request for shaped in (older, retried) for r in capacity_requests(shaped, {"a100": DWS})
    ]
    everything = current + earlier

    def names(bodies: list[Any]) -> set[str]:
        return {b["metadata"]["name"] for b in bodies}

    assert len(current) == 2 and len(earlier) == 4
    stale = stale_requests(everything, generation=3, attempt=1, active=True)
    assert names(stale) == names(earlier)
    assert [b["metadata"]["name"] for b in stale] == sorted(names(earlier))
    # A job that ended, or was suspended, or has no plan, keeps none.
    assert names(stale_requests(everything, generation=3, attempt=1, active=False)) == names(
        everything
    )
    assert names(stale_requests(everything, generation=None, attempt=0, active=True)) == names(
        everything
    )
    # Deleting a request deletes the PodTemplates its pod sets reference.
    for request in capacity_requests(pods, {"a100": DWS}):
        templates = [t["metadata"]["name"] for t in request.pod_templates]
        assert templates and pod_template_names(request.request) == templates
