"""controller.storage's decisions, without a cluster: when a CRD still needs its objects
rewritten, and which jobs' memory must move out of their v1alpha1 status first."""

from __future__ import annotations

from typing import Any

from sailplan.operator.api.memory import JobMemory
from sailplan.operator.controller.storage import memories_to_move, needs_migration


def _crd(storage: str, stored: list[str]) -> dict[str, Any]:
    return {
        "spec": {
            "versions": [
                {"name": "v1beta1", "storage": storage == "v1beta1"},
                {"name": "v1alpha1", "storage": storage == "v1alpha1"},
            ]
        },
        "status": {"storedVersions": stored},
    }


def test_migration_runs_until_only_v1beta1_is_stored_and_not_before_the_crds_store_it() -> None:
    assert needs_migration(_crd("v1beta1", ["v1alpha1", "v1beta1"]))
    assert needs_migration(_crd("v1beta1", ["v1alpha1"]))
    assert not needs_migration(_crd("v1beta1", ["v1beta1"]))
    # The CRDs are not upgraded yet (an older release's, storing v1alpha1): wait for them.
    assert not needs_migration(_crd("v1alpha1", ["v1alpha1"]))
    assert not needs_migration(None)


def _job(name: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"}, "status": status}


def test_only_jobs_whose_status_holds_memory_have_it_moved() -> None:
    replan = {"phase": "Running", "generation": 3, "attempt": 1}
    jobs = [
        _job("old", {"phase": "Running", "replan": replan}),
        _job("infeasible", {"phase": "Unschedulable", "unschedulableInputs": "2:abc"}),
        _job("new", {"phase": "Running", "plan": {"generation": 1}}),
        _job("fresh", {}),
        _job("unreadable", {"replan": {"phase": "Nonsense"}}),
    ]
    moved = {
        name: (namespace, uid, found) for namespace, name, uid, found in memories_to_move(jobs)
    }
    assert set(moved) == {"old", "infeasible"}
    namespace, uid, found = moved["old"]
    assert (namespace, uid) == ("ns", "uid-old")
    assert isinstance(found, JobMemory)
    assert found.replan is not None and (found.replan.generation, found.replan.attempt) == (3, 1)
    assert moved["infeasible"][2] == JobMemory(unschedulable_inputs="2:abc")
