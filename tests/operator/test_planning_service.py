"""The planning service with real worker processes: answers, callbacks, cancellation,
deadlines and crashes (sailplan.operator.planning)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from waiting import wait_for

from sailplan.operator.planning import PlanningService
from sailplan.operator.search import PlannerAnswer, SearchFailed, Searching
from sailplan.planner.api import Objective, Planned, PlanRequest
from sailplan.planner.catalog import Catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.profiles.types import ProfileSet

JOB = ("ns", "job", "uid-1")

# The example GPUPools of manifests/examples over the default local cluster's nodes.
EXAMPLE_POOLS = (
    Pool(name="a100-ondemand/us-central1-a", gpu_type="A100-40", zone="us-central1-a",
         region="us-central1", gpus_per_node=4, nodes=2),
    Pool(name="a100-ondemand/us-central1-b", gpu_type="A100-40", zone="us-central1-b",
         region="us-central1", gpus_per_node=4, nodes=2),
    Pool(name="a100-spot/us-central1-a", gpu_type="A100-40", zone="us-central1-a",
         region="us-central1", gpus_per_node=4, nodes=3, spot=True),
    Pool(name="v100-ondemand/us-central1-a", gpu_type="V100-16", zone="us-central1-a",
         region="us-central1", gpus_per_node=4, nodes=3),
    Pool(name="v100-ondemand/us-west1-b", gpu_type="V100-16", zone="us-west1-b",
         region="us-west1", gpus_per_node=4, nodes=3),
    Pool(name="v100-spot/us-west1-b", gpu_type="V100-16", zone="us-west1-b",
         region="us-west1", gpus_per_node=2, nodes=2, spot=True),
)  # fmt: skip


def small_request(catalog: Catalog, batch: int = 8) -> PlanRequest:
    """A search of well under a second: OPT-350M on one A100 node."""
    return PlanRequest(
        model=catalog.model("OPT-350M"),
        global_batch_size=batch,
        cluster=ClusterSnapshot(pools=EXAMPLE_POOLS[:1]),
    )


def large_request(catalog: Catalog, deadline: float | None) -> PlanRequest:
    """A search of minutes without a deadline: OPT-30B over every example pool."""
    return PlanRequest(
        model=catalog.model("OPT-30B"),
        global_batch_size=256,
        cluster=ClusterSnapshot(pools=EXAMPLE_POOLS),
        objective=Objective(kind="throughput"),
        deadline_seconds=deadline,
    )


class Notified:
    def __init__(self) -> None:
        self.jobs: list[tuple[str, str]] = []
        self.event = threading.Event()

    def __call__(self, namespace: str, name: str) -> None:
        self.jobs.append((namespace, name))
        self.event.set()


@pytest.fixture
def notified() -> Notified:
    return Notified()


@pytest.fixture
def service(catalog: Catalog, notified: Notified) -> Iterator[PlanningService]:
    service = PlanningService(catalog, notified, max_searches=2, grace_seconds=20)
    yield service
    service.shutdown()


def answer_after_notify(
    service: PlanningService, notified: Notified, request: PlanRequest, timeout: float
) -> PlannerAnswer:
    assert notified.event.wait(timeout), "the service never called back"
    return service.plan(JOB, request, ProfileSet())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); the service reaps its children, so check the state.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def running_pid(service: PlanningService) -> int:
    wait_for("the search process started", lambda: JOB in service.running_pids(), 30)
    return service.running_pids()[JOB]


def test_answer_comes_back_and_calls_back(
    service: PlanningService, notified: Notified, catalog: Catalog
) -> None:
    request = small_request(catalog)
    first = service.plan(JOB, request, ProfileSet())
    assert isinstance(first, Searching)
    assert (
        "OPT-350M" in first.what and "8 A100-40 in pools a100-ondemand/us-central1-a" in first.what
    )
    answer = answer_after_notify(service, notified, request, 60)
    assert isinstance(answer, Planned)
    assert notified.jobs == [("ns", "job")]
    # The same request again is answered from the cache: no second search, no callback.
    notified.event.clear()
    assert service.plan(JOB, request, ProfileSet()) == answer
    assert service.running_pids() == {}
    assert not notified.event.wait(1)


def test_cancel_kills_the_search_process(
    service: PlanningService, notified: Notified, catalog: Catalog
) -> None:
    service.plan(JOB, large_request(catalog, deadline=300), ProfileSet())
    pid = running_pid(service)
    assert alive(pid)
    service.cancel("ns", "job")
    wait_for("the search process is gone", lambda: not alive(pid), 10)
    assert service.running_pids() == {}
    assert not notified.event.wait(1), "a cancelled search must not call back"


def test_a_new_request_for_the_job_replaces_its_search(
    service: PlanningService, notified: Notified, catalog: Catalog
) -> None:
    service.plan(JOB, large_request(catalog, deadline=300), ProfileSet())
    old = running_pid(service)
    smaller = small_request(catalog)
    assert isinstance(service.plan(JOB, smaller, ProfileSet()), Searching)
    wait_for("the old search process is gone", lambda: not alive(old), 10)
    assert isinstance(answer_after_notify(service, notified, smaller, 60), Planned)


def test_deadline_returns_the_best_plan_so_far(
    service: PlanningService, notified: Notified, catalog: Catalog
) -> None:
    request = large_request(catalog, deadline=10)
    started = time.monotonic()
    service.plan(JOB, request, ProfileSet())
    answer = answer_after_notify(service, notified, request, 10 + 20 + 5)
    assert isinstance(answer, Planned)
    assert not answer.exhaustive
    assert time.monotonic() - started < 10 + 20


def test_a_search_past_deadline_and_grace_is_killed(catalog: Catalog, notified: Notified) -> None:
    # Profile completion runs before the planner looks at its deadline: with a tiny
    # deadline and no grace the process is still busy when its hard limit comes.
    service = PlanningService(catalog, notified, grace_seconds=0.5)
    try:
        request = large_request(catalog, deadline=0.01)
        service.plan(JOB, request, ProfileSet())
        pid = running_pid(service)
        answer = answer_after_notify(service, notified, request, 15)
        assert isinstance(answer, SearchFailed)
        assert "deadline" in answer.message
        assert not alive(pid)
    finally:
        service.shutdown()


def test_a_crashed_worker_is_a_failure_not_a_hang(
    service: PlanningService, notified: Notified, catalog: Catalog
) -> None:
    request = large_request(catalog, deadline=300)
    service.plan(JOB, request, ProfileSet())
    os.kill(running_pid(service), signal.SIGKILL)  # as the kernel's OOM killer would
    answer = answer_after_notify(service, notified, request, 15)
    assert isinstance(answer, SearchFailed)
    assert "killed by signal 9" in answer.message


def test_searches_beyond_the_limit_wait_for_a_free_process(
    catalog: Catalog, notified: Notified
) -> None:
    service = PlanningService(catalog, notified, max_searches=1)
    try:
        service.plan(JOB, large_request(catalog, deadline=300), ProfileSet())
        running_pid(service)
        other = ("ns", "other", "uid-2")
        queued = service.plan(other, small_request(catalog), ProfileSet())
        assert isinstance(queued, Searching) and queued.queued
        service.cancel("ns", "job")
        wait_for("the queued search ran", lambda: ("ns", "other") in notified.jobs, 60)
        assert isinstance(service.plan(other, small_request(catalog), ProfileSet()), Planned)
    finally:
        service.shutdown()


def test_shutdown_stops_every_search(service: PlanningService, catalog: Catalog) -> None:
    service.plan(JOB, large_request(catalog, deadline=300), ProfileSet())
    pid = running_pid(service)
    started = time.monotonic()
    service.shutdown()
    assert time.monotonic() - started < 5
    assert not alive(pid)
    # A pass during shutdown records nothing final: the next operator searches again.
    after = service.plan(JOB, small_request(catalog), ProfileSet())
    assert isinstance(after, Searching) and after.queued
    assert service.running_pids() == {}
