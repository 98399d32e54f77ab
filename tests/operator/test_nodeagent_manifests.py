"""The node agent's manifests: `kubectl kustomize manifests/nodeagent` and the chart with
nodeAgent.enabled render the same DaemonSet and RBAC, on GPU nodes only, read-only RBAC,
and the chart renders none of it by default.

kubectl and helm are the ones `sailplan cluster build` builds (as tests/operator/
test_helm_chart.py uses them).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sailplan_dev.localcluster import build

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "manifests" / "helm" / "sailplan"
NAMESPACE = "sailplan-system"
AGENT = "sailplan-nodeagent"


# helm and kubectl come from the local cluster build (tests/conftest.py waits for them).
pytestmark = pytest.mark.go_build("helm", "kubernetes")


def _tool(name: str, *args: str) -> str:
    binary = build.binary_path(name)
    if not binary.exists():
        pytest.skip(f"the built {name} is missing ({binary}): run `sailplan cluster build`")
    done = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _objects(text: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}


def _chart(*args: str) -> dict[tuple[str, str], dict[str, Any]]:
    return _objects(_tool("helm", "template", "sailplan", str(CHART), "-n", NAMESPACE, *args))


@pytest.fixture(scope="module")
def kustomized() -> dict[tuple[str, str], dict[str, Any]]:
    return _objects(_tool("kubectl", "kustomize", str(ROOT / "manifests" / "nodeagent")))


def _pod(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = objects[("DaemonSet", AGENT)]["spec"]["template"]["spec"]
    return spec


def test_the_daemonset_runs_on_gpu_nodes_only_as_its_own_service_account(
    kustomized: dict[tuple[str, str], dict[str, Any]],
) -> None:
    assert set(kustomized) == {
        ("ServiceAccount", AGENT),
        ("ClusterRole", AGENT),
        ("ClusterRoleBinding", AGENT),
        ("DaemonSet", AGENT),
    }
    pod = _pod(kustomized)
    assert pod["serviceAccountName"] == AGENT
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "cloud.google.com/gke-accelerator", "operator": "Exists"}
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "sailplan.operator.nodeagent"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # the driver and the kubelet's socket are mounted read-only; the only writable host path
    # is the agent's state
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["nvidia"]["readOnly"] is True
    assert mounts["pod-resources"]["readOnly"] is True
    assert not mounts["state"].get("readOnly")
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {
        "nvidia": "/home/kubernetes/bin/nvidia",
        "pod-resources": "/var/lib/kubelet/pod-resources",
        "state": "/var/lib/sailplan-nodeagent",
    }
    binding = kustomized[("ClusterRoleBinding", AGENT)]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": AGENT, "namespace": NAMESPACE}
    ]


def test_the_cluster_role_only_reads_pods_configmaps_and_trainingjobs(
    kustomized: dict[tuple[str, str], dict[str, Any]],
) -> None:
    rules = kustomized[("ClusterRole", AGENT)]["rules"]
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("", "pods", "list"),
        ("", "configmaps", "get"),
        ("sailplan.dev", "trainingjobs", "get"),
    }


def test_the_chart_renders_no_agent_unless_enabled() -> None:
    assert not [key for key in _chart() if AGENT in key[1]]


def test_the_enabled_chart_renders_the_kustomize_agent_in_substance(
    kustomized: dict[tuple[str, str], dict[str, Any]],
) -> None:
    chart = _chart("--set", "nodeAgent.enabled=true")
    agent = {key: value for key, value in chart.items() if key[1] == AGENT}
    assert set(agent) == set(kustomized)
    assert agent[("ClusterRole", AGENT)]["rules"] == kustomized[("ClusterRole", AGENT)]["rules"]
    assert (
        agent[("ClusterRoleBinding", AGENT)]["subjects"]
        == kustomized[("ClusterRoleBinding", AGENT)]["subjects"]
    )
    pod, expected = _pod(agent), _pod(kustomized)
    (container,), (base,) = pod["containers"], expected["containers"]
    assert container["image"] == "sailplan-operator:0.1.0" == base["image"]
    assert container == base
    assert pod == expected
    # neither the operator's Deployment nor its Service selects the agent's pods
    labels = chart[("DaemonSet", AGENT)]["spec"]["template"]["metadata"]["labels"]
    operator = chart[("Deployment", "sailplan-operator")]["spec"]["selector"]["matchLabels"]
    assert not operator.items() <= labels.items()


def test_chart_values_reach_the_agent() -> None:
    chart = _chart(
        "--set",
        "nodeAgent.enabled=true,nodeAgent.fakeNVML=A100-40:4,nodeAgent.metricsPort=9500",
        "--set",
        "nodeAgent.image.repository=registry.example/agent,nodeAgent.image.tag=2.0",
        "--set",
        "nodeAgent.gpuNodeLabel=example.com/gpu",
    )
    pod = _pod(chart)
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/agent:2.0"
    assert "--fake-nvml=A100-40:4" in container["args"]
    assert "--metrics-port=9500" in container["args"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9500}]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "example.com/gpu"


def test_the_chart_with_the_agent_lints_clean() -> None:
    linted = _tool("helm", "lint", "--strict", str(CHART), "--set", "nodeAgent.enabled=true")
    assert "1 chart(s) linted, 0 chart(s) failed" in linted
