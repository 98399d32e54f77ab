"""A spot node is preempted under a training job: the operator replans and the loss curve goes on.

Everything is the real system except the kubelet (replan_harness.py): the local cluster's
API server and scheduler, the operator as a subprocess, the real planner, `sailplan-train`
processes for the pods the operator creates on two runner nodes (one GPU each) of two
GPUPools in two zones, checkpoints on a runner-backed PersistentVolumeClaim.

Once rank 0 has trained past two complete checkpoints, the node of rank 0 is preempted
(SIGTERM, DisruptionTarget, node deleted). Expected, against an uninterrupted
single-process run of the same model, seed and data (the trainer's loss is
plan-independent up to float32 summation order; tolerance as in
tests/trainer/test_resharding_resume.py):
- the operator replans within seconds onto the node that remains (plan generation 2, a
  history entry for the node loss, the preemption not counted as a restart);
- generation 2 restores the newest complete checkpoint generation 1 wrote and trains
  exactly the steps after it; every step's loss equals the reference.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from replan_harness import A100, INTERVAL, V100, Cluster, assert_continues, reference_losses
from runner_harness import events_of
from waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]


def test_preempted_node_replans_and_training_resumes_from_the_checkpoint(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.gpupool(A100)
    cluster.gpupool(V100)
    nodes = {cluster.add_node(A100), cluster.add_node(V100)}
    spec = cluster.job_spec()
    cluster.create_job(spec)

    first, old_log = cluster.rank0(1)
    cluster.wait_checkpoint(old_log, 2 * INTERVAL)

    # Preempt rank 0's node: the plan surely uses it.
    victim = first.spec.node_name
    preempted_at = time.monotonic()
    cluster.runner.preempt_node(victim, grace_s=5.0)
    second = wait_for("generation 2 pods", lambda: cluster.pods(2), 30, cluster.explain)
    replanned_after = time.monotonic() - preempted_at
    assert replanned_after < 15, f"replanned only after {replanned_after:.1f} s"
    _, new_log = cluster.rank0(2)
    # The new plan uses only what remains.
    placed = wait_for(
        "generation 2 placed",
        lambda: all(p.spec.node_name for p in cluster.pods(2)) and cluster.pods(2),
        30,
        cluster.explain,
    )
    assert {p.spec.node_name for p in placed} <= nodes - {victim}
    assert len(second) == len(placed)

    status = cluster.wait_finished()
    assert status["phase"] == "Succeeded", status
    assert (status["preemptions"], status["restarts"]) == (1, 0)
    assert status["plan"]["generation"] == 2
    # Whichever the operator saw first: the node going NotReady or the pod's DisruptionTarget.
    assert status["history"][-1]["reason"].startswith(("NodeLost", "WorkerPreempted"))

    reference = reference_losses(spec, tmp_path / "reference")
    assert_continues(events_of(old_log), events_of(new_log), reference)
