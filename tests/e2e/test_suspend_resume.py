"""Suspend and resume with the real trainer: spec.suspend on a running job checkpoints and
stops its worker through the planned-switch drain and releases the node; unsetting it plans
generation 2, which restores exactly that checkpoint, and the loss curve equals an
uninterrupted single-process run's. Same real system as test_replan_switch.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from replan_harness import INTERVAL, JOB, V100, Cluster, assert_continues, reference_losses
from runner_harness import events_of
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]


def _suspend(cluster: Cluster, suspend: bool) -> None:
    cluster.custom.patch_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, "trainingjobs", JOB, {"spec": {"suspend": suspend}}
    )


def _condition(status: dict[str, Any], type_: str) -> tuple[str, str] | None:
    found = [c for c in status.get("conditions", []) if c["type"] == type_]
    return (found[0]["status"], found[0]["reason"]) if found else None


def test_suspend_checkpoints_and_resume_continues_from_it(cluster: Cluster, tmp_path: Path) -> None:
    cluster.gpupool(V100)
    cluster.add_node(V100)
    spec = cluster.job_spec()
    cluster.create_job(spec)
    _, old_log = cluster.rank0(1)
    cluster.wait_checkpoint(old_log, INTERVAL)

    _suspend(cluster, True)

    def suspended() -> dict[str, Any] | None:
        status = cluster.status()
        gone = _condition(status, "Suspended") == ("True", "JobSuspended")
        return status if gone and not cluster.pods() else None

    status = wait_for("suspended with no pods", suspended, 120, cluster.explain)
    assert status["phase"] == "Suspended"
    # The worker was asked for a checkpoint and stopped cleanly after writing it: the
    # suspension is not the job succeeding.
    old = events_of(old_log)
    stopped = next(e for e in old if e.get("event") == "stopped")
    assert stopped["reason"] == "checkpoint-request"
    assert stopped["last_checkpoint_step"] == max(e["step"] for e in old if e["event"] == "step")
    assert _condition(status, "Complete") is None

    _suspend(cluster, False)
    _, new_log = cluster.rank0(2, timeout_s=60)
    status = cluster.wait_finished()
    assert status["phase"] == "Succeeded", status
    assert _condition(status, "Suspended") == ("False", "JobResumed")
    assert [h["generation"] for h in status["history"]] == [1, 2]
    assert status["history"][-1]["reason"].startswith("Resumed")
    assert (status["preemptions"], status["restarts"]) == (0, 0)

    reference = reference_losses(spec, tmp_path / "reference")
    restored = assert_continues(old, events_of(new_log), reference)
    assert restored == stopped["last_checkpoint_step"]  # the checkpoint taken on suspend
