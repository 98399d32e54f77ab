"""Fixtures of the end-to-end tests that run trainer pods: `runner` (the pod runner as the
kubelet, runner_harness.py) and `cluster` (the operator and the replanning tests' view of
the job, replan_harness.py). A test module's own fixture of the same name wins over these
(test_podrunner.py has its own `runner`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from replan_harness import Cluster, replan_cluster
from runner_harness import pod_runner

from sailplan_dev.localcluster.podrunner import PodRunner


@pytest.fixture
def runner(k8s_api: Any, tmp_path: Path) -> Iterator[PodRunner]:
    with pod_runner(k8s_api, tmp_path / "runner") as running:
        yield running


@pytest.fixture
def cluster(
    k8s_api: Any, kubeconfig: str, namespace: str, runner: PodRunner, tmp_path: Path
) -> Iterator[Cluster]:
    with replan_cluster(k8s_api, kubeconfig, namespace, runner, tmp_path / "operator.log") as view:
        yield view
