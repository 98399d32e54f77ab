"""Progress leaves the trainer as the operator and Prometheus expect it."""

from __future__ import annotations

import json
import urllib.request

import pytest
from trainer_harness import free_port

from sailplan.trainer.progress import Reporter


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
