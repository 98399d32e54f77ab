"""Worker pods, plan ConfigMap and Service rendered for a plan: placement, GPUs, env, owners."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from sailplan.operator.api.gpupool import GPUPool, Taint
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.children import RenderError, desired_children
from sailplan.planner.plan import Plan
from sailplan.planner.workerenv import TrainerConfig


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }


def _affinity(pod: dict[str, Any]) -> dict[str, list[str]]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    (term,) = terms["nodeSelectorTerms"]
    return {e["key"]: e["values"] for e in term["matchExpressions"] if e["operator"] == "In"}


@pytest.fixture
def job(make_job: Callable[..., TrainingJob]) -> TrainingJob:
    return make_job()


def test_one_pod_per_tensor_parallel_group_pinned_to_pool_and_zone(
    job: TrainingJob, plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    children = desired_children(job, plan, 3, 0, {p.name: p for p in pools})
    # Stage 0 has 2 replicas at TP 2, stage 1 has 2 replicas at TP 1: four pods, stage-major.
    expected = [
        ("opt-g3-a0-w0", "a100-ondemand", "us-central1-a", "2"),
        ("opt-g3-a0-w1", "a100-ondemand", "us-central1-b", "2"),
        ("opt-g3-a0-w2", "v100-ondemand", "us-west1-b", "1"),
        ("opt-g3-a0-w3", "v100-ondemand", "us-west1-b", "1"),
    ]
    got = []
    for pod in children.pods:
        affinity = _affinity(pod)
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]
        got.append(
            (
                pod["metadata"]["name"],
                affinity["cloud.google.com/gke-nodepool"][0],
                affinity["topology.kubernetes.io/zone"][0],
                resources["limits"]["nvidia.com/gpu"],
            )
        )
    assert got == expected


def test_worker_env_follows_the_workerenv_contract(
    job: TrainingJob, plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    children = desired_children(job, plan, 3, 0, {p.name: p for p in pools})
    env = _env(children.pods[2])
    assert env["SAILPLAN_WORKER_INDEX"] == "2"
    assert env["SAILPLAN_PLAN_GENERATION"] == "3"
    # World size counts GPUs (ranks): 2 replicas x TP 2 + 2 replicas x TP 1.
    assert env["WORLD_SIZE"] == "6"
    # Rendezvous at worker 0's stable name: hostname.subdomain.namespace.svc.
    assert env["MASTER_ADDR"] == "opt-g3-a0-w0.opt.team-a.svc"
    assert env["MASTER_PORT"] == "29500"
    assert env["SAILPLAN_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["SAILPLAN_PLAN_PATH"] == "/etc/sailplan/plan/plan.json"
    pod = children.pods[0]
    assert pod["spec"]["hostname"] == "opt-g3-a0-w0"
    assert pod["spec"]["subdomain"] == children.service["metadata"]["name"] == "opt"
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert {"/etc/sailplan/plan", "/etc/podinfo"} <= mounts
    podinfo = next(v for v in pod["spec"]["volumes"] if v["name"] == "podinfo")
    assert {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}} in podinfo[
        "downwardAPI"
    ]["items"]


def test_pods_are_owned_tolerate_gpus_and_run_restricted(
    job: TrainingJob, plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    children = desired_children(job, plan, 1, 0, {p.name: p for p in pools})
    for obj in children.in_creation_order():
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "sailplan.dev/v1beta1",
            "kind": "TrainingJob",
            "name": "opt",
            "uid": "uid-1234",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    pod = children.pods[0]
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert {
        "key": "nvidia.com/gpu",
        "operator": "Equal",
        "value": "present",
        "effect": "NoSchedule",
    } in spec["tolerations"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = spec["containers"][0]["securityContext"]
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}
    # The service publishes not-ready addresses: rendezvous happens before readiness.
    assert children.service["spec"]["clusterIP"] == "None"
    assert children.service["spec"]["publishNotReadyAddresses"] is True


def test_configmap_holds_the_plan_and_trainer_config(
    job: TrainingJob, plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    configmap = desired_children(job, plan, 2, 0, {p.name: p for p in pools}).configmap
    assert configmap["metadata"]["name"] == "opt-plan-g2"
    assert configmap["immutable"] is True
    assert Plan.from_json(configmap["data"]["plan.json"]) == plan
    trainer = TrainerConfig.model_validate_json(configmap["data"]["trainer.json"])
    # From the job spec: steps 100, seed 7, interval 25, checkpoint URI as given.
    assert (trainer.steps, trainer.seed, trainer.checkpoint_interval_steps) == (100, 7, 25)
    assert trainer.checkpoint_dir == "gs://bucket/ckpt"


def test_pvc_checkpoints_are_mounted(
    make_job: Callable[..., TrainingJob], plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    from operator_builders import JOB_SPEC

    spec = JOB_SPEC | {
        "checkpoint": {
            "storage": {"persistentVolumeClaim": {"claimName": "ckpt", "subPath": "opt"}}
        }
    }
    children = desired_children(make_job(spec), plan, 1, 0, {p.name: p for p in pools})
    pod = children.pods[0]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "checkpoints")
    assert volume["persistentVolumeClaim"] == {"claimName": "ckpt"}
    trainer = TrainerConfig.model_validate_json(children.configmap["data"]["trainer.json"])
    assert trainer.checkpoint_dir == "/checkpoints/opt"


def test_selector_pools_and_spot_pools_render_their_own_affinity(
    job: TrainingJob, plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    v100 = GPUPool.model_validate(
        {
            "name": "v100",
            "spec": {"selector": {"matchLabels": {"pool": "v", "tier": "spot"}}},
            "status": {"gpuType": "V100-16", "spot": True},
        }
    )
    children = desired_children(job, plan, 1, 0, {"a100": pools[0], "v100": v100})
    pod = children.pods[3]
    assert _affinity(pod) == {
        "pool": ["v"],
        "tier": ["spot"],
        "topology.kubernetes.io/zone": ["us-west1-b"],
    }
    assert any(t["key"] == "cloud.google.com/gke-spot" for t in pod["spec"]["tolerations"])


def test_a_vanished_pool_is_a_clear_error(
    job: TrainingJob, plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    with pytest.raises(RenderError, match="GPUPool 'v100'"):
        desired_children(job, plan, 1, 0, {"a100": pools[0]})


def test_pods_tolerate_exactly_the_taints_of_their_pool(
    job: TrainingJob, plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    a100 = pools[0].model_copy(
        update={
            "spec": pools[0].spec.model_copy(
                update={
                    "taints": (
                        Taint(key="example.com/dedicated", value="training", effect="NoSchedule"),
                        Taint(key="example.com/maintenance", effect="NoExecute"),
                    )
                }
            )
        }
    )
    untainted = GPUPool.model_validate(
        {
            "name": "v100",
            "spec": {"nodePool": "v100-pool", "taints": []},
            "status": {"gpuType": "V100-16", "spot": True},
        }
    )
    pods = desired_children(job, plan, 1, 0, {"a100": a100, "v100": untainted}).pods
    on_a100 = [p for p in pods if p["metadata"]["labels"]["sailplan.dev/gpupool"] == "a100"]
    assert on_a100
    for pod in on_a100:
        assert pod["spec"]["tolerations"] == [
            {
                "key": "example.com/dedicated",
                "operator": "Equal",
                "value": "training",
                "effect": "NoSchedule",
            },
            {"key": "example.com/maintenance", "operator": "Exists", "effect": "NoExecute"},
        ]
    on_v100 = [p for p in pods if p["metadata"]["labels"]["sailplan.dev/gpupool"] == "v100"]
    # An explicit empty list: untainted nodes, not GKE's defaults (even for a spot pool).
    assert on_v100 and all(p["spec"]["tolerations"] == [] for p in on_v100)
    # Unset: GKE's GPU taint, plus the spot taint on a spot pool.
    default_spot = untainted.model_copy(
        update={"spec": untainted.spec.model_copy(update={"taints": None})}
    )
    pods = desired_children(job, plan, 1, 0, {"a100": pools[0], "v100": default_spot}).pods
    keys = {
        p["metadata"]["labels"]["sailplan.dev/gpupool"]: [
            t["key"] for t in p["spec"]["tolerations"]
        ]
        for p in pods
    }
    assert keys == {
        "a100": ["nvidia.com/gpu"],
        "v100": ["nvidia.com/gpu", "cloud.google.com/gke-spot"],
    }


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector (matchExpressions only) selects `labels`."""
    for expression in selector["matchExpressions"]:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


def test_a_node_holds_the_workers_of_one_job_packed(
    make_job: Callable[..., TrainingJob], plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    """Required anti-affinity, over all namespaces, to every other job's workers; preferred
    affinity to the job's own (so they fill the nodes the plan counted, not spread)."""
    by_name = {p.name: p for p in pools}
    ours = desired_children(make_job(), plan, 3, 0, by_name).pods
    # Same name in another namespace: another job, told apart by its uid.
    other = make_job().model_copy(update={"namespace": "team-b", "uid": "uid-5678"})
    theirs = desired_children(other, plan, 1, 0, by_name).pods
    assert {p["metadata"]["labels"]["sailplan.dev/job-uid"] for p in ours} == {"uid-1234"}
    own_workers = [p["metadata"]["labels"] for p in ours]
    other_workers = [p["metadata"]["labels"] for p in theirs]
    not_workers = [
        desired_children(make_job(), plan, 3, 0, by_name).configmap["metadata"]["labels"],
        # A worker of an operator version before the uid label.
        {k: v for k, v in other_workers[0].items() if k != "sailplan.dev/job-uid"},
    ]
    for pod in ours:
        affinity = pod["spec"]["affinity"]
        (repel,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert repel["topologyKey"] == "kubernetes.io/hostname"
        assert repel["namespaceSelector"] == {}  # every namespace
        assert all(_selects(repel["labelSelector"], labels) for labels in other_workers)
        assert not any(_selects(repel["labelSelector"], labels) for labels in own_workers)
        assert not any(_selects(repel["labelSelector"], labels) for labels in not_workers)
        (attract,) = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert attract["weight"] == 100
        term = attract["podAffinityTerm"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert all(_selects(term["labelSelector"], labels) for labels in own_workers)
        assert not any(_selects(term["labelSelector"], labels) for labels in other_workers)
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["podAffinity"]


def test_a_job_without_a_uid_is_told_apart_by_namespace_and_name(
    make_job: Callable[..., TrainingJob], plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    by_name = {p.name: p for p in pools}

    def uid_label(namespace: str) -> str:
        job = make_job().model_copy(update={"namespace": namespace, "uid": ""})
        (value,) = {
            p["metadata"]["labels"]["sailplan.dev/job-uid"]
            for p in desired_children(job, plan, 1, 0, by_name).pods
        }
        return value

    first = uid_label("team-a")
    assert re.fullmatch(r"[a-z0-9]{1,63}", first)  # a valid label value
    assert first == uid_label("team-a") != uid_label("team-b")
