"""New capacity worth switching to: a planned switch through a checkpoint, with the real trainer.

Same real system as test_replan_preemption.py. The job starts on the only node there is, in
a V100 pool; then an A100 node joins the other selected pool. The planner's best plan on the
A100 predicts far more samples/s than the running plan re-priced on the grown cluster, well
above the job's minimum gain (the default +10%), so the operator must: record the switch
(trigger CapacityAdded, predicted gain) in the history, ask the running worker for a
checkpoint through the CHECKPOINT_REQUEST_ANNOTATION, wait for its clean exit (the trainer
stops at a step boundary with a complete checkpoint and exits 0 -- which must NOT read as
the job having succeeded), then start plan generation 2 on the A100, which restores exactly
the checkpoint taken for the switch: no step lost, none twice, and the loss curve equal to
an uninterrupted single-process run's. The other half, a gain below the minimum keeping the
plan, is tests/operator/test_reconcile_trainingjob.py::test_new_capacity_below_the_min_gain_keeps_the_plan.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from replan_harness import A100, INTERVAL, V100, Cluster, assert_continues, reference_losses
from runner_harness import events_of
from waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]


def _running_on_a_v100(cluster: Cluster) -> tuple[dict[str, Any], Path]:
    """Both pools selected, only a V100 node: generation 1 trains there until its first
    complete checkpoint. Returns the job's spec and rank 0's log."""
    cluster.gpupool(A100)
    cluster.gpupool(V100)
    cluster.add_node(V100)
    spec = cluster.job_spec()
    cluster.create_job(spec)
    _, old_log = cluster.rank0(1)
    cluster.wait_checkpoint(old_log, INTERVAL)
    return spec, old_log


def test_added_node_worth_it_switches_through_a_checkpoint(
    cluster: Cluster, tmp_path: Path
) -> None:
    spec, old_log = _running_on_a_v100(cluster)
    a100 = cluster.add_node(A100)

    second, new_log = cluster.rank0(2, timeout_s=60)
    assert second.spec.node_name == a100
    # The old worker was asked for a checkpoint (it read the annotation through its
    # downward-API file) and stopped cleanly after writing it.
    old = events_of(old_log)
    stopped = next(e for e in old if e.get("event") == "stopped")
    assert stopped["reason"] == "checkpoint-request"
    assert stopped["last_checkpoint_step"] == max(e["step"] for e in old if e["event"] == "step")

    status = cluster.wait_finished()
    assert status["phase"] == "Succeeded", status
    assert (status["preemptions"], status["restarts"]) == (0, 0)
    assert status["plan"]["generation"] == 2
    switch = status["history"][-1]
    assert switch["generation"] == 2
    assert switch["reason"].startswith("CapacityAdded")
    assert "predicted gain +" in switch["reason"]
    assert wait_for("no pods of generation 1 left", lambda: not cluster.pods(1), 10)

    reference = reference_losses(spec, tmp_path / "reference")
    restored = assert_continues(old, events_of(new_log), reference)
    assert restored == stopped["last_checkpoint_step"]  # the checkpoint taken for the switch


def test_operator_killed_during_a_switch_converges_to_one_plan(
    cluster: Cluster, tmp_path: Path
) -> None:
    """SIGKILL the operator the moment its memory says a switch is under way (Draining or
    Switching: the checkpoint was requested, the old pods may or may not be gone), start it
    again: it resumes the switch from the job's state ConfigMap instead of planning anew, so
    the job ends on generation 2 alone -- no generation 3, no pod of generation 1 left, one
    pod per worker of the plan -- and the loss curve still continues from the switch
    checkpoint."""
    spec, old_log = _running_on_a_v100(cluster)
    cluster.add_node(A100)

    def switching() -> bool:
        replan = cluster.memory().get("replan") or {}
        return replan.get("phase") in ("Draining", "Switching") or replan.get("generation") == 2

    wait_for("the switch to start", switching, 30, cluster.explain)
    cluster.operator.kill()
    phase_at_kill = (cluster.memory().get("replan") or {}).get("phase")
    time.sleep(2.0)  # the old worker finishes its checkpoint while no operator runs
    cluster.operator.start()

    status = cluster.wait_finished()
    assert status["phase"] == "Succeeded", (phase_at_kill, status)
    assert status["plan"]["generation"] == 2
    assert [h["generation"] for h in status["history"]] == [1, 2]
    assert not cluster.pods(1)
    names = [p.metadata.name for p in cluster.pods()]
    assert names == [f"tiny-g2-a0-w{i}" for i in range(status["plan"]["workers"])]

    _, new_log = cluster.rank0(2)
    reference = reference_losses(spec, tmp_path / "reference")
    assert_continues(events_of(old_log), events_of(new_log), reference)
