"""A TrainingJob says ProvisioningClassNotServed for as long as a GPUPool it may use asks for
capacity of a class no autoscaler answers: the job's ProvisioningClassServed condition is
re-derived from its pools each pass (reconcile.provisioning.job_class_condition), so it
holds across the replan that moves the job onto other capacity, and turns True once no
pool says so any more."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from operator_builders import JOB_SPEC
from operator_builders import pool as plain_pool
from test_provisioning_class_served import DWS, NOBODY, NOW, pool, request
from test_reconcile_planning import SearchingPlanner

from sailplan.operator.api.common import Condition, find_condition
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.gpupool import pool_status
from sailplan.operator.reconcile.provisioning import (
    CLASS_SERVED,
    REASON_CLASS_NOT_SERVED,
    REASON_NONE_UNANSWERED,
    Verdicts,
    verdicts,
)
from sailplan.operator.reconcile.trainingjob import Observed, reconcile
from sailplan.planner.catalog import Catalog


def with_status(spec: GPUPool, catalog: Catalog, found: Verdicts) -> GPUPool:
    status = pool_status(spec, [], {}, catalog, NOW, verdicts=found)
    return spec.model_copy(update={"status": status})


def job_condition(
    job: TrainingJob, pools: tuple[GPUPool, ...], catalog: Catalog
) -> Condition | None:
    """The job's ProvisioningClassServed condition after one pass (a plan search under way)."""
    outcome = reconcile(Observed(job=job, pools=pools), SearchingPlanner(), catalog, NOW)
    return find_condition(outcome.status.conditions, CLASS_SERVED)


def test_the_job_says_so_while_its_pool_is_not_served_then_true(
    make_job: Callable[..., TrainingJob], catalog: Catalog
) -> None:
    v100 = plain_pool("v100", "v100-ondemand", {"us-west1-b": 3}, gpu_type="V100-16")
    not_served = verdicts([request("ignored", NOBODY, 61)], {"a100": 60}, NOW)
    a100 = with_status(pool(NOBODY), catalog, not_served)
    # Its request is gone (the job replanned onto the V100s): the pool still says why, and
    # so does every pass of the job, whatever else it does.
    a100 = a100.model_copy(
        update={
            "status": pool_status(
                a100, [], {}, catalog, NOW + timedelta(minutes=1), verdicts=Verdicts()
            )
        }
    )
    job = make_job()
    shown = job_condition(job, (a100, v100), catalog)
    assert shown is not None
    assert (shown.status, shown.reason) == ("False", REASON_CLASS_NOT_SERVED)
    assert shown.message.startswith("GPUPool a100: ") and NOBODY in shown.message
    assert shown.observed_generation == job.generation

    # The next pass, with the condition in the job's status: unchanged, same time.
    status = job.status.model_copy(update={"conditions": (shown,)})
    again = job_condition(job.model_copy(update={"status": status}), (a100, v100), catalog)
    assert again == shown

    # The user fixes the class (the pool judges it afresh): the job says none is unanswered.
    fixed = with_status(pool(DWS, generation=2), catalog, Verdicts())
    cleared = job_condition(job.model_copy(update={"status": status}), (fixed, v100), catalog)
    assert cleared is not None
    assert (cleared.status, cleared.reason) == ("True", REASON_NONE_UNANSWERED)


def test_only_the_pools_the_job_may_use_count(
    make_job: Callable[..., TrainingJob], catalog: Catalog
) -> None:
    v100 = plain_pool("v100", "v100-ondemand", {"us-west1-b": 3}, gpu_type="V100-16")
    not_served = verdicts([request("ignored", NOBODY, 61)], {"a100": 60}, NOW)
    a100 = with_status(pool(NOBODY), catalog, not_served)
    elsewhere = make_job(JOB_SPEC | {"pools": {"names": ["v100"]}})
    assert job_condition(elsewhere, (a100, v100), catalog) is None
    # A job whose pools never said so shows nothing.
    assert (
        job_condition(make_job(), (with_status(pool(DWS), catalog, Verdicts()), v100), catalog)
        is None
    )
