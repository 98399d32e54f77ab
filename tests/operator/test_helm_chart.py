"""The Helm chart (manifests/helm/sailplan) linted, rendered and installed with the real helm.

helm is built from its Go module into the local cluster's binary cache (`sailplan cluster
build`). The chart must install what the kustomize base installs: the rendered RBAC rules
and the operator's pod spec are compared with `kubectl kustomize manifests/base`, and the
chart's crds/ with crds/ (both generated from the pydantic models).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from sailplan_dev.localcluster import build

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "manifests" / "helm" / "sailplan"
NAMESPACE = "sailplan-system"


# helm and kubectl come from the local cluster build (tests/conftest.py waits for them).
pytestmark = pytest.mark.go_build("helm", "kubernetes")


def _tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    binary = build.binary_path(name)
    if not binary.exists():
        pytest.skip(f"the built {name} is missing ({binary}): run `sailplan cluster build`")
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=120, check=False
    )


def _objects(text: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}


def _render(*args: str) -> dict[tuple[str, str], dict[str, Any]]:
    rendered = _tool("helm", "template", "sailplan", str(CHART), "-n", NAMESPACE, *args)
    assert rendered.returncode == 0, rendered.stderr
    return _objects(rendered.stdout)


@pytest.fixture(scope="module")
def base() -> dict[tuple[str, str], dict[str, Any]]:
    rendered = _tool("kubectl", "kustomize", str(ROOT / "manifests" / "base"))
    assert rendered.returncode == 0, rendered.stderr
    return _objects(rendered.stdout)


def test_chart_lints_clean() -> None:
    linted = _tool("helm", "lint", "--strict", str(CHART))
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in linted.stdout


def test_chart_crds_are_the_generated_ones() -> None:
    chart_crds = {p.name: p.read_text() for p in (CHART / "crds").iterdir()}
    generated = {p.name: p.read_text() for p in (ROOT / "crds").glob("sailplan.dev_*.yaml")}
    assert chart_crds == generated, (
        "the chart's CRDs drifted from crds/: "
        "cp crds/sailplan.dev_*.yaml manifests/helm/sailplan/crds/"
    )


def test_rendered_chart_is_the_kustomize_base_in_substance(
    base: dict[tuple[str, str], dict[str, Any]],
) -> None:
    chart = _render()
    # The Namespace is Helm's to make (`--create-namespace`); CRDs come from crds/.
    assert {key for key in base if key[0] not in {"Namespace", "CustomResourceDefinition"}} == set(
        chart
    )
    for key in [
        ("ClusterRole", "sailplan-operator"),
        ("Role", "sailplan-operator-leader-election"),
    ]:
        assert chart[key]["rules"] == base[key]["rules"], key
    for key in [
        ("ClusterRoleBinding", "sailplan-operator"),
        ("RoleBinding", "sailplan-operator-leader-election"),
    ]:
        assert chart[key]["subjects"] == base[key]["subjects"], key
        assert chart[key]["roleRef"] == base[key]["roleRef"], key
    deployment = chart[("Deployment", "sailplan-operator")]
    expected = base[("Deployment", "sailplan-operator")]
    assert deployment["spec"]["replicas"] == expected["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == expected["spec"]["strategy"]
    pod, base_pod = deployment["spec"]["template"]["spec"], expected["spec"]["template"]["spec"]
    # Same container (image, args with --leader-elect, env, ports, probes, resources,
    # security); the spread constraints differ only in the chart's extra instance label.
    assert pod["containers"] == base_pod["containers"]
    assert {k: v for k, v in pod.items() if k != "topologySpreadConstraints"} == {
        k: v for k, v in base_pod.items() if k != "topologySpreadConstraints"
    }
    assert [c["topologyKey"] for c in pod["topologySpreadConstraints"]] == [
        c["topologyKey"] for c in base_pod["topologySpreadConstraints"]
    ]
    service = chart[("Service", "sailplan-operator-metrics")]["spec"]
    assert service["ports"] == base[("Service", "sailplan-operator-metrics")]["spec"]["ports"]
    # The Service and the spread constraints select the pods the Deployment makes.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_values_reach_the_operator_arguments() -> None:
    chart = _render(
        "--set",
        "name=sailplan-b,image.repository=registry.example/op,image.tag=1.2.3",
        "--set",
        "watchNamespaces={team-a,team-b},profileNamespace=profiles,metricsPort=9191",
        "--set",
        "healthPort=8181,resources.requests.cpu=2",
    )
    (container,) = chart[("Deployment", "sailplan-b")]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/op:1.2.3"
    assert container["args"] == [
        "operator",
        "run",
        "--leader-elect",
        "--lease-name=sailplan-b",
        "--metrics-port=9191",
        "--health-port=8181",
        "--log-format=json",
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["SAILPLAN_PROFILE_NAMESPACE"] == {
        "name": "SAILPLAN_PROFILE_NAMESPACE",
        "value": "profiles",
    }
    assert [p["containerPort"] for p in container["ports"]] == [9191, 8181]
    assert container["resources"]["requests"]["cpu"] == 2
    # The Lease the Role allows is the one the operator is told to use.
    role = chart[("Role", "sailplan-b-leader-election")]
    assert role["rules"][0]["resourceNames"] == ["sailplan-b"]
    assert chart[("Service", "sailplan-b-metrics")]["spec"]["ports"][0]["port"] == 9191


def test_without_leader_election_there_is_no_lease_role() -> None:
    chart = _render("--set", "leaderElection=false,replicas=1")
    assert not [key for key in chart if key[0] in {"Role", "RoleBinding"}]
    deployment = chart[("Deployment", "sailplan-operator")]
    assert deployment["spec"]["replicas"] == 1
    assert "--leader-elect" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.cluster
@pytest.mark.slow
def test_helm_installs_and_uninstalls_the_chart_on_the_api_server(
    kubeconfig: str, k8s_api: Any, namespace: str, crds: None
) -> None:
    # Another name than the kustomize base's, whose cluster-scoped objects a test may have
    # applied to the same cluster.
    name = f"sp-{namespace}"[:50]
    release = ["--kubeconfig", kubeconfig, "-n", namespace]
    installed = _tool("helm", "install", "sailplan", str(CHART), *release, "--set", f"name={name}")
    assert installed.returncode == 0, installed.stderr
    try:
        rbac = client.RbacAuthorizationV1Api(k8s_api)
        role = rbac.read_cluster_role(name)
        assert role.metadata.labels["app.kubernetes.io/managed-by"] == "Helm"
        binding = rbac.read_cluster_role_binding(name)
        assert [(s.name, s.namespace) for s in binding.subjects] == [(name, namespace)]
        deployment = client.AppsV1Api(k8s_api).read_namespaced_deployment(name, namespace)
        assert deployment.spec.replicas == 2
        assert "--leader-elect" in deployment.spec.template.spec.containers[0].args
        listed = _tool("helm", "list", *release, "-o", "yaml")
        assert [(r["name"], r["status"]) for r in yaml.safe_load(listed.stdout)] == [
            ("sailplan", "deployed")
        ]
    finally:
        uninstalled = _tool("helm", "uninstall", "sailplan", *release, "--wait")
    assert uninstalled.returncode == 0, uninstalled.stderr
    names = [
        r.metadata.name for r in client.RbacAuthorizationV1Api(k8s_api).list_cluster_role().items
    ]
    assert name not in names
