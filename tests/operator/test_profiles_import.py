"""`sailplan profiles import`: grouping into store ConfigMaps (pure), the CLI's user errors, and
against a real API server: imported profiles are what the operator's store reads back, and a
TrainingJob planned afterwards uses them (ProfilesMeasured True)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_process import OperatorProcess
from test_operator_cluster import (
    get_job,
    job_body,
)
from test_profiling import CLUSTER, MODEL, compute, network
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.kube import Kube
from sailplan.operator.profilestore import parse_profile_configmaps
from sailplan.operator.profiling import results
from sailplan.operator.profiling.importing import import_configmaps
from sailplan.operator.profiling.needs import ComputeNeed, missing_profiles
from sailplan.planner.profiles.store import load_profile_dir, write_profile
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT.parent / "shared" / "reference" / "sailor-artifact"
ESTIMATED = Provenance(source="estimated", tool="roofline")


def _tp(profile: ComputeProfile, tp: int) -> ComputeProfile:
    return profile.model_copy(update={"tensor_parallel": tp})


def test_profiles_group_by_the_key_a_profiling_job_would_write() -> None:
    a100 = compute()
    profiles = ProfileSet(
        compute=(a100, _tp(a100, 2), compute("V100-16"), compute("V100-16", ESTIMATED)),
        network=(network("inter-zone", "A100-40", "A100-40"),),
    )
    batch = import_configmaps(profiles, "store", "lab")
    keys = [c["metadata"]["annotations"][results.KEY_ANNOTATION] for c in batch.configmaps]
    # Both A100 TP degrees share one key (model x GPU, as needs.ComputeNeed.key); the estimate
    # is not a measurement and stays out.
    assert keys == [
        "compute/OPT-350M/A100-40",
        "compute/OPT-350M/V100-16",
        "network/inter-zone/A100-40/A100-40",
    ]
    assert (batch.imported, batch.skipped_estimated) == (4, 1)
    # Same object name as the profiling Job's result for that need: an import replaces it.
    need = next(
        n for n in missing_profiles(MODEL, 32, CLUSTER, ProfileSet()) if isinstance(n, ComputeNeed)
    )
    assert need.key == "compute/OPT-350M/A100-40"
    job_result = results.store_configmap(ProfileSet(compute=(a100,)), need, "store", "job")
    assert batch.configmaps[0]["metadata"]["name"] == job_result["metadata"]["name"]
    # The operator's store reader gets back exactly the measured profiles.
    stored, problems = parse_profile_configmaps(batch.configmaps)
    assert problems == []
    assert set(stored.compute) == {a100, _tp(a100, 2), compute("V100-16")}
    # ...and no longer asks for an A100 compute profiling run.
    assert "compute/OPT-350M/A100-40" not in [
        n.key for n in missing_profiles(MODEL, 32, CLUSTER, stored)
    ]


def _sailplan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sailplan.operator", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_import_user_mistakes_exit_2_with_one_line(tmp_path: Path) -> None:
    missing = _sailplan("profiles", "import", str(tmp_path / "nope"), "--dry-run")
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: no profile directory at {tmp_path / 'nope'}"
    write_profile(tmp_path, compute(provenance=ESTIMATED))
    only_estimates = _sailplan("profiles", "import", str(tmp_path), "--dry-run")
    assert only_estimates.returncode == 2
    assert "no measured profile (1 estimated)" in only_estimates.stderr
    assert "Traceback" not in only_estimates.stderr


@pytest.mark.cluster
@pytest.mark.slow
def test_imported_sailor_artifact_is_read_back_and_used_for_planning(
    kubeconfig: str,
    k8s_api: Any,
    namespace: str,
    operator: OperatorProcess,
    gpupools: Callable[..., str],
) -> None:
    if not (ARTIFACT / "profiles").is_dir():
        pytest.skip(f"Sailor reference artifact not found at {ARTIFACT}")
    args = ("profiles", "import", str(ARTIFACT), "-n", namespace, "--kubeconfig", kubeconfig)
    first = _sailplan(*args)
    assert first.returncode == 0, first.stderr
    # Re-importing replaces every ConfigMap instead of failing or duplicating.
    again = _sailplan(*args)
    assert again.returncode == 0, again.stderr
    assert ": 0 created, " in again.stdout, again.stdout

    expected = load_profile_dir(ARTIFACT)
    stored, problems = parse_profile_configmaps(Kube(k8s_api).list_profile_configmaps(namespace))
    assert problems == []
    assert set(stored.compute) == set(expected.compute)
    assert set(stored.network) == set(expected.network)
    assert all(p.provenance.source == "measured" for p in stored.compute)

    pool = gpupools("a100-ondemand")
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", job_body(namespace, "imported", [pool])
    )

    # The first status says Planning (the search runs in a worker process); ProfilesMeasured
    # comes with the search's answer.
    def planned() -> dict[str, Any] | None:
        job = get_job(k8s_api, namespace, "imported")
        found = (job.get("status") or {}).get("conditions") or []
        return job if any(c["type"] == "ProfilesMeasured" for c in found) else None

    job = wait_for("TrainingJob imported with a ProfilesMeasured condition", planned, 120)
    conditions = {c["type"]: c for c in job["status"]["conditions"]}
    # The artifact measured OPT-350M on A100-40 and the A100 links: nothing left to estimate.
    assert conditions["ProfilesMeasured"]["status"] == "True", conditions["ProfilesMeasured"]
    assert conditions["ProfilesMeasured"]["reason"] == "AllMeasured"
