"""spec.managedBy: a job another controller manages is left alone (pure), and the API
server keeps the field immutable (cluster)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_builders import JOB_SPEC, RecordingPlanner
from test_operator_cluster import job_body
from test_reconcile_trainingjob import NOW, refuse

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import MANAGED_BY, TrainingJob
from sailplan.operator.reconcile.trainingjob import Observed, manages, reconcile
from sailplan.planner.api import Planned
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import Plan


def test_a_job_managed_by_another_controller_is_left_alone(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], catalog: Catalog
) -> None:
    job = make_job(JOB_SPEC | {"managedBy": "kueue.x-k8s.io/multikueue"})
    outcome = reconcile(Observed(job=job, pools=pools), refuse, catalog, NOW)
    assert not outcome.managed
    assert (outcome.create, outcome.delete_pods, outcome.events) == ((), (), ())
    assert outcome.status == job.status  # not even observedGeneration is written


def test_unset_or_the_operators_own_name_is_reconciled(
    make_job: Callable[..., TrainingJob], pools: tuple[GPUPool, ...], plan: Plan, catalog: Catalog
) -> None:
    assert MANAGED_BY == "sailplan.dev/operator"
    job = make_job(JOB_SPEC | {"managedBy": MANAGED_BY})
    outcome = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, NOW
    )
    assert outcome.managed and outcome.create


@pytest.mark.parametrize(
    ("spec", "ours"),
    [
        ({}, True),
        ({"managedBy": "sailplan.dev/operator"}, True),
        ({"managedBy": "kueue.x-k8s.io/multikueue"}, False),
        # Read before parsing: a spec the operator could not parse is still not its own.
        ({"managedBy": "example.com/other", "training": "not an object"}, False),
    ],
)
def test_manages_reads_the_unparsed_spec(spec: dict[str, Any], ours: bool) -> None:
    assert manages(spec) is ours


@pytest.mark.cluster
def test_the_api_server_keeps_managed_by_immutable(
    k8s_api: Any, namespace: str, crds: None
) -> None:
    custom = client.CustomObjectsApi(k8s_api)

    def create(name: str, **spec: Any) -> None:
        body = job_body(namespace, name, None, **spec)
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", body)

    def rejected(name: str, spec: dict[str, Any]) -> str:
        with pytest.raises(ApiException) as error:
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, "trainingjobs", name, {"spec": spec}
            )
        assert error.value.status == 422
        return str(error.value.body)

    create("handed", managedBy="kueue.x-k8s.io/multikueue")
    assert "managedBy is immutable" in rejected("handed", {"managedBy": "example.com/other"})
    assert "managedBy is immutable" in rejected("handed", {"managedBy": None})
    create("plain")
    assert "managedBy is immutable" in rejected("plain", {"managedBy": "example.com/other"})
    with pytest.raises(ApiException) as error:
        create("bad", managedBy="no-slash")
    assert error.value.status == 422 and "spec.managedBy" in str(error.value.body)
