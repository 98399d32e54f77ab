"""The Argo CD health checks (manifests/argocd) run in a real Lua interpreter (lupa) on
hand-written TrainingJob and GPUPool status objects, one per state the checks tell apart
(states the operator's cluster tests reach are also checked there, on the objects the API
server returns: test_operator_cluster.py, test_autoscaled_pools_bad_input_cluster.py)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from argocd_lua import ARGOCD, health


def _job(phase: str | None, *conditions: tuple[str, str, str, str]) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions
        ]
    }
    if phase is not None:
        status["phase"] = phase
    return {"kind": "TrainingJob", "status": status}


@pytest.mark.parametrize(
    ("job", "expected", "says"),
    [
        (_job("Running", ("Running", "True", "AllWorkersRunning", "4 workers")), "Healthy", ""),
        (_job("Succeeded", ("Complete", "True", "Completed", "")), "Healthy", "complete"),
        (
            _job("Pending", ("Planning", "True", "Searching", "searching for 3 s")),
            "Progressing",
            "searching",
        ),
        (
            _job("Replanning", ("Replanning", "True", "Draining", "checkpoint")),
            "Progressing",
            "checkpoint",
        ),
        (
            _job("Suspended", ("Suspended", "True", "JobSuspended", "no workers run")),
            "Suspended",
            "JobSuspended: no workers run",
        ),
        (_job(None), "Progressing", "waiting"),
        ({"kind": "TrainingJob"}, "Progressing", "waiting"),
        (
            _job("Failed", ("Failed", "True", "RestartsExhausted", "3 restarts")),
            "Degraded",
            "RestartsExhausted: 3 restarts",
        ),
        (
            _job("Unschedulable", ("Schedulable", "False", "OutOfMemory", "41 GB")),
            "Degraded",
            "OutOfMemory: 41 GB",
        ),
        (
            _job("Invalid", ("Valid", "False", "UnknownModel", "GPT-5")),
            "Degraded",
            "UnknownModel: GPT-5",
        ),
    ],
)
def test_trainingjob_health(job: dict[str, Any], expected: str, says: str) -> None:
    status, message = health(job)
    assert status == expected
    assert says in message


def test_gpupool_health() -> None:
    def pool(*conditions: tuple[str, str, str]) -> dict[str, Any]:
        listed = [{"type": t, "status": s, "reason": r, "message": ""} for t, s, r in conditions]
        return {"kind": "GPUPool", "status": {"conditions": listed}}

    assert health({"kind": "GPUPool"})[0] == "Progressing"
    ready = pool(("Ready", "True", "NodesReady"), ("GPUTypeResolved", "True", "Resolved"))
    assert health(ready)[0] == "Healthy"
    none_ready = pool(("Ready", "False", "NoReadyNodes"))
    assert health(none_ready) == ("Degraded", "NoReadyNodes: ")
    unknown = pool(("Ready", "True", "NodesReady"), ("GPUTypeResolved", "False", "UnknownGPUType"))
    assert health(unknown)[0] == "Degraded"


def test_argocd_cm_carries_the_lua_files_under_argocds_keys() -> None:
    data = yaml.safe_load((ARGOCD / "argocd-cm.yaml").read_text())["data"]
    assert data == {
        "resource.customizations.health.sailplan.dev_TrainingJob": (
            ARGOCD / "trainingjob-health.lua"
        ).read_text(),
        "resource.customizations.health.sailplan.dev_GPUPool": (
            ARGOCD / "gpupool-health.lua"
        ).read_text(),
    }
