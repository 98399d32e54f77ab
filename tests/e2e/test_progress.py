"""Progress without pod patches: a real trainer pod with no API credentials at all (the
example ServiceAccount, which has no Role, and no mounted token) trains while the operator
reads rank 0's metrics endpoint at the pod's IP; the TrainingJob's status.progress
advances, and every step, loss and samples/s it shows is one rank 0 logged itself.
Same real system as test_replan_switch.py (API server, scheduler, pod runner, operator
subprocess)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from replan_harness import STEPS, V100, Cluster
from runner_harness import events_of

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

EXAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "20-trainer-rbac.yaml"


def test_status_progress_advances_from_rank_zeros_metrics_with_no_api_access(
    cluster: Cluster,
) -> None:
    # The trainer's RBAC example: a ServiceAccount and nothing it may do.
    documents = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    assert [d["kind"] for d in documents] == ["ServiceAccount"]
    account = documents[0] | {
        "metadata": documents[0]["metadata"] | {"namespace": cluster.namespace}
    }
    cluster.core.create_namespaced_service_account(cluster.namespace, account)
    cluster.gpupool(V100)
    cluster.add_node(V100)
    spec = cluster.job_spec()
    spec["trainer"]["serviceAccountName"] = account["metadata"]["name"]
    cluster.create_job(spec)
    pod, log = cluster.rank0(1)
    # No token reaches the trainer: it could not patch its pod if it tried.
    assert pod.spec.automount_service_account_token is False
    assert pod.spec.service_account_name == account["metadata"]["name"]
    mounts = [m.mount_path for c in pod.spec.containers for m in c.volume_mounts or ()]
    assert "/var/run/secrets/kubernetes.io/serviceaccount" not in mounts
    assert not (pod.metadata.annotations or {}).get("sailplan.dev/progress")

    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 240
    while True:
        status = cluster.status()
        progress = status.get("progress")
        if progress and (not seen or progress["step"] != seen[-1]["step"]):
            seen.append(progress)
        if status.get("phase") in ("Succeeded", "Failed"):
            break
        assert time.monotonic() < deadline, cluster.explain()
        time.sleep(0.2)
    assert status["phase"] == "Succeeded", cluster.explain()

    steps = [p["step"] for p in seen]
    assert len(steps) >= 3, (steps, cluster.explain())  # it advanced while training
    assert steps == sorted(steps) and steps[-1] <= STEPS
    # Each one is what rank 0 logged for that step (its own JSON line, not the metrics).
    logged = {e["step"]: e for e in events_of(log) if e.get("event") == "step"}
    for progress in seen:
        line = logged[progress["step"]]
        assert progress["loss"] == pytest.approx(line["loss"], rel=1e-9)
        assert progress["samplesPerSecond"] == pytest.approx(line["samples_per_second"], rel=1e-2)
        assert progress.get("lastCheckpointStep") == line["last_checkpoint_step"]
        assert progress["time"]  # when the operator read it: its age
