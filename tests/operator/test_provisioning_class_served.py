"""ProvisioningRequests of a class no autoscaler serves: such a request never gets a
condition, so one still without any past its pool's acceptanceTimeoutSeconds (while no
request of its class has one) is unanswered. Its zone backs off like a Failed request's, it
reserves nothing, and the pool's ProvisioningClassServed condition says so, naming the class
and the field to change; a class that is none of the known ones is flagged before any
request is made."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from sailplan.operator.api import gpupool as api
from sailplan.operator.api.common import find_condition
from sailplan.operator.api.gpupool import GPUPool, ProvisioningRequestOptions
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.gpupool import pool_status
from sailplan.operator.reconcile.provisioning import (
    CLASS_FIELD,
    CLASS_SERVED,
    GPUS_ANNOTATION,
    KNOWN_CLASSES,
    REASON_ANSWERED,
    REASON_CLASS_NOT_SERVED,
    REASON_NOT_ASKED_YET,
    REASON_UNKNOWN_CLASS,
    Verdicts,
    request_key,
    request_reservations,
    requester,
    verdicts,
    waiting_requests,
)
from sailplan.planner.catalog import default_catalog

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
ZONE = "us-central1-a"
NOBODY = "nobody-serves-this.example.com"
DWS = "queued-provisioning.gke.io"


def request(
    name: str,
    class_name: str,
    age_seconds: int,
    *,
    gpupool: str = "a100",
    conditions: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    created = NOW - timedelta(seconds=age_seconds)
    return {
        "metadata": {
            "namespace": "team-a",
            "name": name,
            "labels": {naming.LABEL_GPUPOOL: gpupool, "sailplan.dev/zone": ZONE},
            "annotations": {GPUS_ANNOTATION: "8"},
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "spec": {"provisioningClassName": class_name},
        "status": {"conditions": conditions or []},
    }


ACCEPTED = {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "queued"}


def pool(class_name: str, *, generation: int = 1, timeout: int = 60) -> GPUPool:
    return GPUPool.model_validate(
        {
            "name": "a100",
            "generation": generation,
            "spec": {
                "nodePool": "a100",
                "autoscaling": {
                    "zones": [ZONE],
                    "machineType": "a2-highgpu-4g",
                    "maxNodesPerZone": 2,
                    "provisioningRequest": {
                        "className": class_name,
                        "acceptanceTimeoutSeconds": timeout,
                    },
                },
            },
        }
    )


def test_a_request_without_any_condition_past_the_timeout_is_unanswered() -> None:
    old = request("old", NOBODY, 61)
    young = request("young", NOBODY, 59)
    found = verdicts([old, young], {"a100": 60}, NOW)
    assert set(found.unanswered) == {request_key(old)}
    unanswered = found.unanswered[request_key(old)]
    assert (unanswered.gpupool, unanswered.zone, unanswered.class_name) == ("a100", ZONE, NOBODY)
    # The pool is refreshed when the younger one reaches its timeout.
    assert found.next_due == NOW + timedelta(seconds=1)


def test_a_served_class_request_that_waits_its_turn_is_not_unanswered() -> None:
    # The autoscaler accepts one request per loop: a burst's last request may wait long
    # without a condition while an earlier one of its class was answered.
    queued = request("queued", DWS, 600)
    accepted = request("accepted", DWS, 600, gpupool="other", conditions=[ACCEPTED])
    found = verdicts([queued, accepted], {"a100": 60, "other": 60}, NOW)
    assert found.unanswered == {}
    assert DWS in found.answered
    # Without the answered one, the same request is unanswered.
    assert set(verdicts([queued], {"a100": 60}, NOW).unanswered) == {request_key(queued)}


def test_requests_of_pools_without_a_timeout_are_not_judged() -> None:
    assert verdicts([request("r", NOBODY, 10_000)], {}, NOW) == Verdicts()


def test_an_unanswered_request_backs_its_zone_off_at_once_and_reserves_nothing() -> None:
    ignored = request("ignored", NOBODY, 61)
    found = verdicts([ignored], {"a100": 60}, NOW)
    assert request_reservations([ignored]) == [("a100", ZONE, 8)]
    assert request_reservations([ignored], found.unanswered) == []
    waiting = waiting_requests([ignored], {"a100": 900}, found.unanswered)
    assert waiting == {"a100": {ZONE: NOW - timedelta(seconds=61 + 900)}}

    status = pool_status(
        pool(NOBODY),
        [],
        {},
        default_catalog(),
        NOW,
        waiting_since=waiting["a100"],
        verdicts=found,
    )
    (zone,) = status.zones
    assert zone.nodes_possible == 0 and zone.scale_up_backoff_until is not None
    scale_up = find_condition(status.conditions, api.SCALE_UP_AVAILABLE)
    assert scale_up is not None and scale_up.status == "False"
    served = find_condition(status.conditions, CLASS_SERVED)
    assert served is not None
    assert (served.status, served.reason) == ("False", REASON_CLASS_NOT_SERVED)
    assert NOBODY in served.message and CLASS_FIELD in served.message


def test_the_pool_condition_stays_until_the_spec_changes_or_a_request_is_answered() -> None:
    catalog = default_catalog()
    not_served = verdicts([request("ignored", NOBODY, 61)], {"a100": 60}, NOW)
    first = pool(NOBODY)
    first = first.model_copy(
        update={"status": pool_status(first, [], {}, catalog, NOW, verdicts=not_served)}
    )
    # The job replanned and its request is gone: the pool still says why.
    later = pool_status(first, [], {}, catalog, NOW + timedelta(minutes=1), verdicts=Verdicts())
    kept = find_condition(later.conditions, CLASS_SERVED)
    assert kept is not None and kept.reason == REASON_CLASS_NOT_SERVED

    # The user fixes the class (a new generation): judged afresh, nothing asked yet.
    fixed = pool(DWS, generation=2).model_copy(update={"status": first.status})
    fresh = pool_status(fixed, [], {}, catalog, NOW, verdicts=Verdicts())
    condition = find_condition(fresh.conditions, CLASS_SERVED)
    assert condition is not None
    assert (condition.status, condition.reason) == ("Unknown", REASON_NOT_ASKED_YET)

    answered = verdicts([request("r", DWS, 5, conditions=[ACCEPTED])], {"a100": 60}, NOW)
    served = pool_status(fixed, [], {}, catalog, NOW, verdicts=answered)
    condition = find_condition(served.conditions, CLASS_SERVED)
    assert condition is not None and (condition.status, condition.reason) == (
        "True",
        REASON_ANSWERED,
    )


def test_a_class_no_autoscaler_is_known_to_serve_is_flagged_not_refused() -> None:
    status = pool_status(pool(NOBODY), [], {}, default_catalog(), NOW)
    condition = find_condition(status.conditions, CLASS_SERVED)
    assert condition is not None
    assert (condition.status, condition.reason) == ("Unknown", REASON_UNKNOWN_CLASS)
    assert NOBODY in condition.message and all(c in condition.message for c in KNOWN_CLASSES)
    for known in KNOWN_CLASSES:
        status = pool_status(pool(known), [], {}, default_catalog(), NOW)
        condition = find_condition(status.conditions, CLASS_SERVED)
        assert condition is not None and condition.reason == REASON_NOT_ASKED_YET


def test_pools_without_provisioning_requests_have_no_class_condition() -> None:
    plain = GPUPool.model_validate(
        {
            "name": "a100",
            "spec": {
                "nodePool": "a100",
                "autoscaling": {"zones": [ZONE], "gpusPerNode": 4, "maxNodesPerZone": 1},
            },
        }
    )
    status = pool_status(plain, [], {}, default_catalog(), NOW)
    assert find_condition(status.conditions, CLASS_SERVED) is None


def test_the_acceptance_timeout_defaults_to_twelve_autoscaler_loops_and_has_bounds() -> None:
    assert ProvisioningRequestOptions().acceptance_timeout_seconds == 120
    for bad in (9, 3601):
        with pytest.raises(ValidationError):
            ProvisioningRequestOptions(acceptance_timeout_seconds=bad)


def test_a_class_name_the_provisioning_request_crd_would_refuse_is_refused() -> None:
    # provisioningClassName must be a DNS subdomain (the request CRD's pattern).
    for bad in ("example.com/dws", "Queued.GKE.io", "-dws"):
        with pytest.raises(ValidationError):
            ProvisioningRequestOptions(class_name=bad)
    assert ProvisioningRequestOptions(class_name=NOBODY).class_name == NOBODY


def test_the_job_told_is_the_requests_controlling_owner() -> None:
    body = request("r", NOBODY, 61)
    body["metadata"]["labels"][naming.LABEL_JOB] = "opt"
    assert requester(body) is None  # no owner reference: no one to tell
    body["metadata"]["ownerReferences"] = [
        {"kind": "Other", "uid": "uid-0"},
        {"kind": "TrainingJob", "uid": "uid-1", "controller": True},
    ]
    assert requester(body) == ("team-a", "opt", "uid-1")


def test_a_jobs_own_waiting_requests_do_not_reserve_against_its_plan() -> None:
    # Its withheld workers are its own plan's capacity, as its unbound workers are: counted
    # against that plan they made it not fit, and the job replanned away from its request.
    mine = request("mine", DWS, 5)
    mine["metadata"]["labels"][naming.LABEL_JOB] = "opt"
    theirs = request("theirs", DWS, 5)
    theirs["metadata"]["labels"][naming.LABEL_JOB] = "other"
    assert request_reservations([mine, theirs], besides=("team-a", "opt")) == [("a100", ZONE, 8)]
    assert len(request_reservations([mine, theirs])) == 2
