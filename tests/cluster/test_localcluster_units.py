"""Pure checks of the local cluster's building blocks: node file, generator, Go wrappers, CLI errors.

No control plane needed; these guard the formats a user writes and the wrapper go.mod that a
Kubernetes upgrade regenerates.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from sailplan_dev.cli import register
from sailplan_dev.localcluster import build, kwokctl
from sailplan_dev.localcluster.nodes import (
    ACCELERATOR_LABEL,
    GPU_RESOURCE,
    MANAGER_LABEL,
    NodeFileError,
    generate_node_file,
    load_node_file,
    node_manifests,
)


def _cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    # A second command keeps typer from collapsing the app into its only sub-group.
    app.command("noop")(lambda: None)
    return app


def test_default_node_file_is_the_documented_gke_cluster() -> None:
    node_file = load_node_file()
    # Header of data/gke-default.yaml: 16 nodes, two GPU types, three zones in two regions.
    assert node_file.node_count == 16
    nodes = node_manifests(node_file)
    accelerators = {n["metadata"]["labels"].get(ACCELERATOR_LABEL) for n in nodes}
    assert accelerators == {None, "nvidia-tesla-a100", "nvidia-tesla-v100"}
    zones = {n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes}
    assert zones == {"us-central1-a", "us-central1-b", "us-west1-b"}
    spot_a100 = [
        n for n in nodes if n["metadata"]["labels"]["cloud.google.com/gke-nodepool"] == "a100-spot"
    ]
    assert len(spot_a100) == 3
    assert all(n["metadata"]["labels"]["cloud.google.com/gke-spot"] == "true" for n in spot_a100)
    # The CPU-only system pool must not attract or repel GPU pods.
    cpu_only = [n for n in nodes if ACCELERATOR_LABEL not in n["metadata"]["labels"]]
    assert cpu_only and all("taints" not in n["spec"] for n in cpu_only)
    assert all(GPU_RESOURCE not in n["status"]["allocatable"] for n in cpu_only)
    assert len({n["metadata"]["name"] for n in nodes}) == len(nodes)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("pools: [", "not valid YAML"),
        ("pools: []", "pools"),
        (
            "pools: [{name: a, machine_type: m, accelerator: nvidia-l4, zones: {z: 1}}]",
            "accelerator and gpus_per_node",
        ),
        ("pools: [{name: a, machine_type: m, zones: {z: 1}, colour: red}]", "colour"),
        ("pools: [{name: Bad_Name, machine_type: m, zones: {z: 1}}]", "name"),
    ],
)
def test_bad_node_files_get_a_one_line_reason(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(content)
    with pytest.raises(NodeFileError) as error:
        load_node_file(path)
    assert fragment in str(error.value)
    assert "\n" not in str(error.value)


def test_generated_cluster_has_exact_size_and_is_reproducible() -> None:
    big = generate_node_file(500, seed=7)
    assert big.node_count == 500
    assert big == generate_node_file(500, seed=7)
    assert big != generate_node_file(500, seed=8)
    names = [n["metadata"]["name"] for n in node_manifests(big)]
    assert len(set(names)) == 500
    # Every pool spans at least two zones and both spot and on-demand exist for each GPU.
    assert all(len(p.zones) >= 2 for p in big.pools)
    for accelerator in {p.accelerator for p in big.pools}:
        assert {p.spot for p in big.pools if p.accelerator == accelerator} == {True, False}


def test_staging_modules_are_pinned_to_their_published_release() -> None:
    upstream = """module k8s.io/kubernetes

go 1.26.0

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
)
replace go.etcd.io/etcd => ./FORBIDDEN_DEPENDENCY
replace example.com/kept => example.com/fork v1.2.3
"""
    assert build.local_replaces(upstream, "v0.36.3") == [
        "\tk8s.io/api => k8s.io/api v0.36.3",
        "\tk8s.io/client-go => k8s.io/client-go v0.36.3",
    ]
    group = next(g for g in build.GROUPS if g.name == "kubernetes")
    wrapper = build.render_wrapper(group, upstream)
    assert "require k8s.io/kubernetes v1.36.3" in wrapper
    assert "\tk8s.io/kubernetes/cmd/kube-apiserver\n" in wrapper
    assert "go 1.26.0" in wrapper


def test_kwok_only_manages_labelled_nodes() -> None:
    config = yaml.safe_load(kwokctl.configuration(Path("/cache")))
    patch = next(p for p in config["componentsPatches"] if p["name"] == "kwok-controller")
    args = {a["key"]: a["value"] for a in patch["extraArgs"]}
    assert args["manage-all-nodes"] == "false"
    assert args["manage-nodes-with-label-selector"] == f"{MANAGER_LABEL}=kwok"
    assert config["options"]["kubeApiserverBinary"].startswith("/cache/k8s/")


def test_up_without_binaries_says_to_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAILPLAN_CACHE", str(tmp_path))
    result = CliRunner().invoke(_cli(), ["cluster", "up", "--name", "nope"])
    assert result.exit_code == 2
    assert "run `sailplan cluster build`" in result.output
    assert "Traceback" not in result.output


def test_env_for_unknown_cluster_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAILPLAN_CACHE", str(tmp_path))
    result = CliRunner().invoke(_cli(), ["cluster", "env", "--name", "nope"])
    assert result.exit_code == 2
    assert "sailplan cluster up --name nope" in result.output


def test_bad_node_file_on_up_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAILPLAN_CACHE", str(tmp_path))
    path = tmp_path / "nodes.yaml"
    path.write_text("pools: 3")
    result = CliRunner().invoke(_cli(), ["cluster", "up", "--nodes", str(path)])
    assert result.exit_code == 2
    assert "node file" in result.output


def test_invalid_cluster_name_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAILPLAN_CACHE", str(tmp_path))
    result = CliRunner().invoke(_cli(), ["cluster", "up", "--name", "../Evil"])
    assert result.exit_code == 2
    assert "invalid cluster name" in result.output
    assert not (tmp_path / "kwok").exists()
