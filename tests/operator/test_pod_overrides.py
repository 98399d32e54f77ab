"""spec.podTemplateOverrides: rendered worker pods carry the user's pod fields, and the
plan's placement, GPU count and worker contract always hold (pure); the API server
rejects bad overrides naming the field (cluster)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_builders import JOB_SPEC, RecordingPlanner
from pydantic import ValidationError
from test_operator_cluster import get_job, job_body, pods_of
from test_reconcile_trainingjob import NOW
from waiting import wait_for

from sailplan.operator.api import kubeschema
from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import RESERVED_MOUNT_PATHS, RESERVED_VOLUMES, TrainingJob
from sailplan.operator.reconcile.children import TERMINATION_GRACE_SECONDS, desired_children
from sailplan.operator.reconcile.overrides import IGNORED_ANNOTATION
from sailplan.operator.reconcile.trainingjob import Observed, reconcile
from sailplan.planner.api import Planned
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import Plan
from sailplan_dev.localcluster import build

NODEPOOL = "cloud.google.com/gke-nodepool"
ZONE = "topology.kubernetes.io/zone"

OVERRIDES: dict[str, Any] = {
    "metadata": {
        "labels": {"kueue.x-k8s.io/queue-name": "team-a", "cost-center": "ml"},
        "annotations": {"example.com/owner": "alice"},
    },
    "spec": {
        "nodeSelector": {"example.com/disk": "ssd"},
        "tolerations": [{"key": "example.com/dedicated", "operator": "Exists"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "example.com/rack", "operator": "In", "values": ["r1"]}
                            ]
                        },
                        {
                            "matchExpressions": [
                                {"key": "example.com/rack", "operator": "In", "values": ["r2"]}
                            ]
                        },
                    ]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "preference": {
                            "matchExpressions": [{"key": "example.com/fast", "operator": "Exists"}]
                        },
                    }
                ],
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
                ]
            },
        },
        "priorityClassName": "training-high",
        "imagePullSecrets": [{"name": "registry"}],
        "securityContext": {"runAsUser": 2000, "supplementalGroups": [3000]},
        "terminationGracePeriodSeconds": 600,
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "corpus"}}],
        "containers": [
            {
                "name": "trainer",
                "env": [{"name": "HF_HOME", "value": "/data/hf"}],
                "envFrom": [{"secretRef": {"name": "wandb"}}],
                "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
                "securityContext": {"readOnlyRootFilesystem": False},
                "resources": {
                    "requests": {"cpu": "8", "example.com/nic": "1"},
                    "limits": {"memory": "32Gi", "example.com/nic": "1"},
                },
            }
        ],
    },
}


def _pods(
    make_job: Callable[..., TrainingJob],
    plan: Plan,
    pools: tuple[GPUPool, ...],
    overrides: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    spec = JOB_SPEC | ({"podTemplateOverrides": overrides} if overrides is not None else {})
    job = make_job(spec)
    return list(desired_children(job, plan, 1, 0, {p.name: p for p in pools}).pods)


def test_rendered_pods_carry_the_overrides(
    make_job: Callable[..., TrainingJob], plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    plain = _pods(make_job, plan, pools, None)[0]
    pod = _pods(make_job, plan, pools, OVERRIDES)[0]
    metadata, spec = pod["metadata"], pod["spec"]
    assert metadata["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert metadata["labels"]["sailplan.dev/job"] == "opt"  # the operator's labels stay
    assert metadata["annotations"]["example.com/owner"] == "alice"
    assert "sailplan.dev/worker" in metadata["annotations"]
    assert IGNORED_ANNOTATION not in metadata["annotations"]
    assert spec["nodeSelector"] == {"example.com/disk": "ssd"}
    # The GPUPool's tolerations and the user's.
    assert spec["tolerations"] == [
        *plain["spec"]["tolerations"],
        {"key": "example.com/dedicated", "operator": "Exists"},
    ]
    # Every required term keeps the plan's pin: pin AND (rack r1 OR rack r2).
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    pin = plain["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"]
    assert [t["matchExpressions"][: len(pin)] for t in terms] == [pin, pin]
    assert [t["matchExpressions"][len(pin) :][0]["values"] for t in terms] == [["r1"], ["r2"]]
    assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    # The user's pod anti-affinity joins the operator's (one job per node), the packing
    # affinity to the job's own workers stays.
    assert spec["affinity"]["podAntiAffinity"] == (
        plain["spec"]["affinity"]["podAntiAffinity"]
        | OVERRIDES["spec"]["affinity"]["podAntiAffinity"]
    )
    assert spec["affinity"]["podAffinity"] == plain["spec"]["affinity"]["podAffinity"]
    assert spec["priorityClassName"] == "training-high"
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    # Merged: the user's uid, the operator's non-root and seccomp stay.
    assert spec["securityContext"]["runAsUser"] == 2000
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["securityContext"]["supplementalGroups"] == [3000]
    assert spec["terminationGracePeriodSeconds"] == 600
    assert [v["name"] for v in spec["volumes"]] == [
        *(v["name"] for v in plain["spec"]["volumes"]),
        "data",
    ]
    (container,) = spec["containers"]
    names = [e["name"] for e in container["env"]]
    assert names == [*(e["name"] for e in plain["spec"]["containers"][0]["env"]), "HF_HOME"]
    assert container["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    assert container["volumeMounts"][-1] == {"name": "data", "mountPath": "/data", "readOnly": True}
    assert container["securityContext"]["readOnlyRootFilesystem"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    resources = container["resources"]
    # spec.trainer gave cpu 4 and memory 16Gi; the override wins, the GPUs are the plan's.
    assert resources["requests"] == {
        "cpu": "8",
        "memory": "16Gi",
        "nvidia.com/gpu": "2",
        "example.com/nic": "1",
    }
    assert resources["limits"] == {"memory": "32Gi", "nvidia.com/gpu": "2", "example.com/nic": "1"}


def test_without_overrides_the_pod_keeps_its_defaults(
    make_job: Callable[..., TrainingJob], plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    plain = _pods(make_job, plan, pools, None)
    assert plain == _pods(make_job, plan, pools, {})
    assert plain == _pods(make_job, plan, pools, {"metadata": {}, "spec": {}})
    assert plain[0]["spec"]["terminationGracePeriodSeconds"] == TERMINATION_GRACE_SECONDS == 120
    assert "nodeSelector" not in plain[0]["spec"]


def test_a_conflicting_node_selector_keeps_the_plans_pin_and_says_so(
    make_job: Callable[..., TrainingJob],
    plan: Plan,
    pools: tuple[GPUPool, ...],
    catalog: Catalog,
) -> None:
    overrides = {
        "spec": {
            "nodeSelector": {ZONE: "europe-west4-a", NODEPOOL: "a100-ondemand", "disk": "ssd"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": ZONE, "operator": "NotIn", "values": ["us-central1-a"]}
                                ]
                            }
                        ]
                    }
                }
            },
            "containers": [
                {
                    "name": "trainer",
                    "env": [{"name": "WORLD_SIZE", "value": "1"}],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        }
    }
    pod = _pods(make_job, plan, pools, overrides)[0]  # worker 0: a100-ondemand, us-central1-a
    # Only the entry on a label the plan does not pin is kept; a matching pin is redundant.
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}
    (term,) = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    zones = [e for e in term["matchExpressions"] if e["key"] == ZONE]
    assert zones == [{"key": ZONE, "operator": "In", "values": ["us-central1-a"]}]
    container = pod["spec"]["containers"][0]
    assert [e["value"] for e in container["env"] if e["name"] == "WORLD_SIZE"] == ["6"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    said = pod["metadata"]["annotations"][IGNORED_ANNOTATION]
    assert f"nodeSelector {ZONE}=europe-west4-a (the plan pins {ZONE}=us-central1-a)" in said
    assert f"affinity: {ZONE} NotIn ['us-central1-a']" in said
    assert "env WORLD_SIZE" in said and "nvidia.com/gpu=8 (the plan gives 2)" in said
    # The reconcile that creates the pods says it in a Warning Event too.
    job = make_job(JOB_SPEC | {"podTemplateOverrides": overrides})
    outcome = reconcile(
        Observed(job=job, pools=pools), RecordingPlanner(Planned(best=plan)), catalog, NOW
    )
    (warning,) = [e for e in outcome.events if e.reason == "OverridesIgnored"]
    assert warning.type == "Warning" and "europe-west4-a" in warning.message


def test_user_pod_affinity_terms_join_the_operators(
    make_job: Callable[..., TrainingJob], plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    """The user's pod affinity and anti-affinity terms, required and preferred, are added
    after the operator's: a node still holds one job's workers, packed, and the user's
    rules hold as well."""
    cache = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": ZONE}
    noisy = {
        "labelSelector": {"matchLabels": {"app": "noisy"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    overrides = {
        "spec": {
            "affinity": {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [cache],
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 5, "podAffinityTerm": cache}
                    ],
                },
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [noisy],
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 7, "podAffinityTerm": noisy}
                    ],
                },
            }
        }
    }
    plain = _pods(make_job, plan, pools, None)[0]["spec"]["affinity"]
    affinity = _pods(make_job, plan, pools, overrides)[0]["spec"]["affinity"]
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    preferred = "preferredDuringSchedulingIgnoredDuringExecution"
    assert affinity["nodeAffinity"] == plain["nodeAffinity"]
    assert affinity["podAffinity"] == {
        required: [cache],
        preferred: [*plain["podAffinity"][preferred], {"weight": 5, "podAffinityTerm": cache}],
    }
    assert affinity["podAntiAffinity"] == {
        required: [*plain["podAntiAffinity"][required], noisy],
        preferred: [{"weight": 7, "podAffinityTerm": noisy}],
    }
    # Only node affinity: the operator's pod terms stay as they are.
    only_node = {"spec": {"affinity": {"nodeAffinity": {}}}}
    assert _pods(make_job, plan, pools, only_node)[0]["spec"]["affinity"] == plain


def test_the_reserved_names_are_the_operators_volumes_and_mounts(
    make_job: Callable[..., TrainingJob], plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    # With a claim, the pod has every volume the operator ever adds.
    claim = {"persistentVolumeClaim": {"claimName": "ckpt"}}
    job = make_job(JOB_SPEC | {"checkpoint": {"storage": claim}})
    pod = desired_children(job, plan, 1, 0, {p.name: p for p in pools}).pods[0]
    volumes = [v["name"] for v in pod["spec"]["volumes"]]
    mounts = [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]]
    assert sorted(volumes) == sorted(RESERVED_VOLUMES)
    assert sorted(mounts) == sorted(RESERVED_MOUNT_PATHS)


@pytest.mark.parametrize(
    ("where", "context"),
    [("spec", {"runAsNonRoot": False}), ("container", {"runAsUser": 0})],
)
def test_root_is_refused_naming_the_field(
    make_job: Callable[..., TrainingJob], where: str, context: dict[str, Any]
) -> None:
    spec: dict[str, Any] = (
        {"securityContext": context}
        if where == "spec"
        else {"containers": [{"name": "trainer", "securityContext": context}]}
    )
    with pytest.raises(ValidationError) as error:
        make_job(JOB_SPEC | {"podTemplateOverrides": {"spec": spec}})
    assert "is not allowed (worker pods run as non-root)" in str(error.value)


@pytest.mark.cluster
def test_the_api_server_rejects_bad_overrides_naming_the_field(
    k8s_api: Any, namespace: str, crds: None
) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"spec": {"securityContext": {"runAsNonRoot": False}}},
            "spec.podTemplateOverrides.spec.securityContext.runAsNonRoot",
        ),
        (
            {"spec": {"containers": [{"name": "trainer", "securityContext": {"runAsUser": 0}}]}},
            "spec.podTemplateOverrides.spec.containers[0].securityContext.runAsUser",
        ),
        (
            {"spec": {"tolerations": [{"key": "a", "tolerationSeconds": "soon"}]}},
            "spec.podTemplateOverrides.spec.tolerations[0].tolerationSeconds",
        ),
        (
            {"spec": {"volumes": [{"name": "plan", "emptyDir": {}}]}},
            "spec.podTemplateOverrides.spec.volumes",
        ),
        (
            {"spec": {"containers": [{"name": "sidecar"}]}},
            "spec.podTemplateOverrides.spec.containers[0].name",
        ),
        (
            {"metadata": {"labels": {"sailplan.dev/job": "other"}}},
            "spec.podTemplateOverrides.metadata.labels",
        ),
    ]
    for number, (overrides, field) in enumerate(cases):
        body = job_body(namespace, f"bad{number}", None, podTemplateOverrides=overrides)
        with pytest.raises(ApiException) as error:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", body)
        assert error.value.status == 422, overrides
        assert field in str(error.value.body), (field, error.value.body)
    # The full example is accepted as it is.
    body = job_body(namespace, "good", None, podTemplateOverrides=OVERRIDES)
    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", body
    )
    assert created["spec"]["podTemplateOverrides"] == OVERRIDES


def test_the_vendored_kubernetes_schemas_are_the_local_clusters_release() -> None:
    """api/data/kubernetes-core-v1.json is the closure of the embedded types in the OpenAPI
    document of the Kubernetes release the local cluster runs (its Go module is in the
    build cache once `sailplan cluster build` ran)."""
    assert build.K8S_VERSION in kubeschema.SOURCE
    upstream = (
        build.cache_root()
        / "go/mod/k8s.io"
        / f"kubernetes@{build.K8S_VERSION}"
        / "api/openapi-spec/v3/api__v1_openapi.json"
    )
    if not upstream.exists():
        pytest.skip(f"{upstream} missing: run `sailplan cluster build`")
    vendored = json.loads(kubeschema.DATA.read_text())
    assert vendored["definitions"] == kubeschema.closure(json.loads(upstream.read_text())), (
        "regenerate with `python -m sailplan.operator.api.kubeschema " + str(upstream) + "`"
    )


@pytest.mark.cluster
@pytest.mark.slow
def test_pods_the_api_server_refuses_are_a_condition_with_its_message(
    k8s_api: Any, namespace: str, operator: Any, gpupools: Callable[..., str]
) -> None:
    pool = gpupools("a100-ondemand")
    overrides = {"spec": {"priorityClassName": "no-such-class"}}
    body = job_body(namespace, "refused", [pool], podTemplateOverrides=overrides)
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", body
    )

    def refused() -> dict[str, Any] | None:
        status = get_job(k8s_api, namespace, "refused").get("status") or {}
        running = {c["type"]: c for c in status.get("conditions", [])}.get("Running", {})
        return running if running.get("reason") == "PodCreateFailed" else None

    running = wait_for("Running=False/PodCreateFailed", refused, 120)
    assert running["status"] == "False"
    assert "no-such-class" in running["message"]
    assert not pods_of(k8s_api, namespace, "refused")
