"""A large plan search with the operator against a real API server: the job says at once
that it is being planned, the search ends within its deadline, deleting the job kills the
search process, and SIGTERM stops the operator mid-search within seconds.

The job is the issue's case: OPT-30B over the example's four GPUPools (manifests/examples)
with a cost objective, a search of minutes without a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_process import OperatorProcess
from test_operator_cluster import get_job, job_body
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

EXAMPLE_NODE_POOLS = ("a100-ondemand", "a100-spot", "v100-ondemand", "v100-spot")
# The operator's kill of a search that overruns its deadline (replan.defaults).
GRACE_SECONDS = 30


@pytest.fixture
def example_pools(
    gpupools: Callable[..., str], k8s_api: Any, operator: OperatorProcess
) -> list[str]:
    """The example's four GPUPools, once the operator has written their status (so the
    operator is up and the jobs' timings below do not include its start)."""
    names = [gpupools(node_pool) for node_pool in EXAMPLE_NODE_POOLS]
    custom = client.CustomObjectsApi(k8s_api)

    def all_have_status() -> bool:
        return all(
            (
                custom.get_cluster_custom_object(GROUP, VERSION, "gpupools", n).get("status") or {}
            ).get("zones")
            for n in names
        )

    wait_for(
        "GPUPool statuses written by the operator",
        all_have_status,
        60,
        lambda: "\n".join(operator.log_tail()),
    )
    return names


def large_job(namespace: str, name: str, pools: list[str], deadline: int) -> dict[str, Any]:
    return job_body(
        namespace,
        name,
        pools,
        model={"name": "OPT-30B"},
        training={"globalBatchSize": 256, "steps": 10},
        objective={"kind": "Cost", "maxUsdPerHour": 1},
        planning={"deadlineSeconds": deadline},
    )


def create(k8s_api: Any, body: dict[str, Any]) -> None:
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, body["metadata"]["namespace"], "trainingjobs", body
    )


def planning_condition(k8s_api: Any, namespace: str, name: str) -> dict[str, Any] | None:
    conditions = (get_job(k8s_api, namespace, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Planning"), None)


def wait_planning(
    k8s_api: Any, namespace: str, name: str, status: str, timeout: float, *, log: OperatorProcess
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        condition = planning_condition(k8s_api, namespace, name)
        return condition if condition and condition["status"] == status else None

    found: dict[str, Any] = wait_for(
        f"Planning={status} on {name}", reached, timeout, lambda: "\n".join(log.log_tail())
    )
    return found


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def search_processes(operator: OperatorProcess) -> list[int]:
    """The operator's search processes: children of its forkserver process."""
    assert operator.process is not None
    return [
        search
        for child in _children(operator.process.pid)
        if b"forkserver" in Path(f"/proc/{child}/cmdline").read_bytes()
        for search in _children(child)
    ]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_a_large_search_says_so_at_once_and_ends_within_its_deadline(
    operator: OperatorProcess, example_pools: list[str], k8s_api: Any, namespace: str
) -> None:
    deadline = 10
    applied = time.monotonic()
    create(k8s_api, large_job(namespace, "opt-30b", example_pools, deadline))
    searching = wait_planning(k8s_api, namespace, "opt-30b", "True", 5, log=operator)
    assert searching["reason"] == "Searching"
    assert "OPT-30B" in searching["message"]
    assert f"deadline {deadline} s" in searching["message"]
    assert "maxUsdPerHour 1" in searching["message"]
    # The search runs in a process of its own (the first one starts the forkserver).
    wait_for("a search process", lambda: search_processes(operator), 10)
    ended = wait_planning(
        k8s_api, namespace, "opt-30b", "False", deadline + GRACE_SECONDS, log=operator
    )
    assert time.monotonic() - applied < deadline + GRACE_SECONDS
    status = get_job(k8s_api, namespace, "opt-30b")["status"]
    if ended["reason"] in ("PlanFound", "DeadlineReachedBestPlan"):
        assert status["plan"]["generation"] == 1
    else:
        assert ended["reason"] in ("Infeasible", "SearchFailed"), ended
        assert status["phase"] == "Unschedulable"
        unschedulable = next(c for c in status["conditions"] if c["type"] == "Unschedulable")
        assert unschedulable["status"] == "True" and unschedulable["message"]
    wait_for("the search process exited", lambda: not search_processes(operator), 10)


def test_deleting_the_job_kills_its_search(
    operator: OperatorProcess, example_pools: list[str], k8s_api: Any, namespace: str
) -> None:
    create(k8s_api, large_job(namespace, "opt-30b", example_pools, deadline=600))
    wait_planning(k8s_api, namespace, "opt-30b", "True", 5, log=operator)
    (pid,) = wait_for("one search process", lambda: search_processes(operator), 10)
    client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", "opt-30b"
    )
    wait_for(
        f"search process {pid} gone",
        lambda: not alive(pid),
        10,
        lambda: "\n".join(operator.log_tail()),
    )


def test_sigterm_during_a_search_stops_the_operator_within_seconds(
    operator: OperatorProcess, example_pools: list[str], k8s_api: Any, namespace: str
) -> None:
    create(k8s_api, large_job(namespace, "opt-30b", example_pools, deadline=600))
    wait_planning(k8s_api, namespace, "opt-30b", "True", 5, log=operator)
    (pid,) = wait_for("one search process", lambda: search_processes(operator), 10)
    assert operator.process is not None
    started = time.monotonic()
    operator.process.terminate()
    operator.process.wait(timeout=10)
    assert time.monotonic() - started < 5
    wait_for(f"search process {pid} gone", lambda: not alive(pid), 5)
