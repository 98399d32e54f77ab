"""Kueue for the local cluster without a cluster: how `sailplan cluster build` builds it and
what configuration the manager gets (sailplan_dev.localcluster.kueue). The manager itself
runs in tests/operator/test_kueue_cluster.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from sailplan_dev.localcluster import build
from sailplan_dev.localcluster.kueue import CERT_SECRET, NAMESPACE, WEBHOOK_SERVICE, config_document


def kueue_group() -> build.Group:
    (group,) = [g for g in build.GROUPS if g.name == "kueue"]
    return group


def test_kueue_is_built_with_its_crds_and_checked_by_its_module_version() -> None:
    group = kueue_group()
    (binary,) = group.binaries
    assert group.packages == ("sigs.k8s.io/kueue/cmd/kueue",)
    assert binary.from_build_info and f"sigs.k8s.io/kueue\t{build.KUEUE_VERSION}" == binary.expect
    names = {p.rsplit("/", 1)[-1] for p in group.shared}
    # What the operator's Workloads and a cluster admin's queues need, among them.
    assert {
        f"kueue.x-k8s.io_{plural}.yaml"
        for plural in ("workloads", "clusterqueues", "localqueues", "resourceflavors")
    } <= names
    # `sailplan cluster up` does not need it: the control plane starts without Kueue.
    assert "kueue" not in build.CONTROL_PLANE_NAMES


def test_every_crd_the_build_copies_is_in_the_pinned_module() -> None:
    if not build.go_available():
        pytest.skip("the Go toolchain is not installed: the module cannot be fetched")
    group = kueue_group()
    for relative in group.shared:
        path = build.module_file(group.module, group.version, relative)
        assert path.is_file(), relative
        assert "kind: CustomResourceDefinition" in path.read_text()


def test_the_manager_runs_alone_on_loopback_with_its_own_certificates(tmp_path: Path) -> None:
    config = config_document(18081, 19443, tmp_path)
    assert config["namespace"] == NAMESPACE
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:18081"
    assert config["webhook"] == {"host": "127.0.0.1", "port": 19443, "certDir": str(tmp_path)}
    # The Secret the stand-ins create and the certificate copier reads.
    assert config["internalCertManagement"] == {
        "enable": True,
        "webhookServiceName": WEBHOOK_SERVICE,
        "webhookSecretName": CERT_SECRET,
    }
