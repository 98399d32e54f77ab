"""Progress leaves the trainer as the operator and Prometheus expect it."""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any

import pytest
from trainer_harness import free_port

from sailplan.planner.workerenv import PROGRESS_ANNOTATION, TrainerProgress
from sailplan.trainer.progress import PodAnnotator, Reporter


class FakeCoreV1:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.patched = threading.Event()

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.patches.append((name, namespace, body))
        self.patched.set()


def test_rank_zero_patches_its_own_pod_with_trainer_progress() -> None:
    api = FakeCoreV1()
    annotator = PodAnnotator(api, "job-w0", "team-a")
    annotator.publish(TrainerProgress(step=7, loss=2.5, last_checkpoint_step=5, plan_generation=3))
    assert api.patched.wait(timeout=10)
    name, namespace, body = api.patches[0]
    assert (name, namespace) == ("job-w0", "team-a")
    progress = TrainerProgress.model_validate_json(
        body["metadata"]["annotations"][PROGRESS_ANNOTATION]
    )
    assert progress == TrainerProgress(step=7, loss=2.5, last_checkpoint_step=5, plan_generation=3)


def test_outside_a_cluster_the_annotation_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("SAILPLAN_POD_NAME", "job-w0")
    monkeypatch.setenv("SAILPLAN_POD_NAMESPACE", "team-a")
    assert PodAnnotator.from_environment() is None


def test_step_is_logged_as_json_and_served_as_metrics(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    monkeypatch.setenv("SAILPLAN_METRICS_PORT", str(port))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    reporter = Reporter(rank=0, local_rank=0, generation=2)
    reporter.step(12, 3.25, 100.0, 10, 0.08)
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["event"] == "step" and line["step"] == 12 and line["loss"] == 3.25
    assert line["last_checkpoint_step"] == 10 and line["generation"] == 2
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert "sailplan_trainer_step 12.0" in text
    assert "sailplan_trainer_loss 3.25" in text
    assert "sailplan_trainer_last_checkpoint_step 10.0" in text
