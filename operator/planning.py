"""The planning service: plan searches in worker processes, off the operator's event loop.

A search for a large model over several pools can run for minutes and take gigabytes; in
the operator's own process it held a core, grew its memory and kept it from exiting on
SIGTERM. Here every search runs in a process of its own (multiprocessing, forkserver
context, so the child is not a fork of a process with an event loop and threads), at most
`max_searches` at a time, and the operator process only waits on a pipe.

`planner(job)` binds the service to one TrainingJob (namespace, name, uid) as the
`Planner` the pure reconcile takes (sailplan.operator.search). Asked for a plan, it answers
at once: the cached answer when a search for the same content (`content_key`: the request
and the measured profiles) finished, else `Searching` while a search runs.

Which requests supersede a running search. A request has two identities: its content and
its spec (`spec_key`: the request without its cluster snapshot, nothing of the measured
profiles). The snapshot (free GPUs per pool and zone) and the measured profiles move on
their own: pods bind and finish, profiling pods come and go, measurements land, every few
seconds on a busy cluster. When every new content cancelled the running search, a search
longer than that interval was restarted forever and the job never got a plan (a livelock).
So, per job:
- a request with a different spec key (the user edited the spec) terminates the running
  search's process and drops the follow-up; so does `cancel(...)` (the job was deleted);
- a request with the same spec key but another content does not: it becomes the job's one
  pending follow-up (a newer one replaces it; an ask the running search or the cache
  already answers drops it), started as soon as the running search ends, whose answer is
  cached as usual. At most one running search and one follow-up per job.
- while a job has no answer for the content asked, `Searching.interim` carries the newest
  finished `Planned` for the same job and spec key whose plan fits the cluster asked about
  (`search.plan_fits`), with the snapshot and profiles it was made from: the best known plan
  that is valid now. An Infeasible or SearchFailed answer is never carried over to another
  content. A job's first plan starts on it, a replan for lost capacity switches to it, and
  both record the inputs it was made from as judged; a voluntary replan waits for the exact
  answer. The reconcile asks again when the search ends (`notify`) and on its triggers
  (new capacity or measurements against those recorded inputs), and then finds the exact
  answer in the cache.

Every search carries a deadline (the request's, from spec.planning.deadlineSeconds, else
`default_deadline_seconds`) which the planner honours by returning its best plans so far; a
search still running `grace_seconds` after it is killed and answers `SearchFailed`, as does
a worker process that dies. When a search ends, `notify(namespace, name)` is called (from a
supervisor thread) so the handler reconciles the job again and finds the answer.

Processes rather than a ProcessPoolExecutor: a pool cannot stop one running task, and
cancelling is the point. Created and driven by sailplan.operator.controller.runtime.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import logging
import multiprocessing
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from sailplan.operator import metrics
from sailplan.operator.planning_worker import run_search
from sailplan.operator.replan.defaults import PLANNING_DEADLINE_SECONDS, PLANNING_GRACE_SECONDS
from sailplan.operator.search import (
    Interim,
    Planner,
    PlannerAnswer,
    SearchFailed,
    Searching,
    describe,
    plan_fits,
)
from sailplan.planner.api import Infeasible, Planned, PlanRequest
from sailplan.planner.catalog import Catalog
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.profiles.types import ProfileSet

log = logging.getLogger("sailplan.operator.planning")

JobRef = tuple[str, str, str]  # namespace, name, uid

# Finished answers kept (per job and request); one per job is what the reconcile re-asks.
DEFAULT_CACHE_SIZE = 256
# How long a terminated search process may take to exit before it is SIGKILLed.
_TERMINATE_WAIT_SECONDS = 2.0

_CONTEXT = multiprocessing.get_context("forkserver")
# The forkserver imports the planner once; each search's process forks from it warm.
_CONTEXT.set_forkserver_preload(["sailplan.operator.planning_worker"])


def content_key(request: PlanRequest, measured: ProfileSet) -> str:
    """Identity of what a search computes: the request and the measured profiles."""
    digest = hashlib.sha256(request.model_dump_json().encode())
    digest.update(measured.model_dump_json().encode())
    return digest.hexdigest()


def spec_key(request: PlanRequest) -> str:
    """Identity of what the user asked for: the request without its cluster snapshot, and
    nothing of the measured profiles. Only a change of this supersedes a running search;
    capacity and measurements change on their own, too often to restart on."""
    return hashlib.sha256(request.model_dump_json(exclude={"cluster"}).encode()).hexdigest()


@dataclass(frozen=True)
class _Finished:
    """A cached answer with what it was computed from (to serve it as an interim plan)."""

    answer: PlannerAnswer
    spec: str
    cluster: ClusterSnapshot
    measured: ProfileSet
    order: int  # finishing order within the service: the newest fitting plan is served


@dataclass
class _Search:
    job: JobRef
    content: str
    spec: str
    request: PlanRequest
    measured: ProfileSet
    asked_at: datetime
    what: str
    cancelled: threading.Event = field(default_factory=threading.Event)
    process: BaseProcess | None = None

    @property
    def deadline_seconds(self) -> float:
        assert self.request.deadline_seconds is not None  # the service always sets one
        return self.request.deadline_seconds

    def view(self) -> Searching:
        return Searching(
            started_at=self.asked_at,
            deadline_seconds=self.deadline_seconds,
            what=self.what,
            queued=self.process is None,
        )


def _interim(candidates: list[_Finished], cluster: ClusterSnapshot) -> Interim | None:
    """The newest finished plan among `candidates` (one job's, same spec key) that fits
    `cluster`; None if none does. Only Planned answers qualify: an Infeasible or failed
    search says nothing about another content, which may well have a plan."""
    for finished in sorted(candidates, key=lambda f: f.order, reverse=True):
        answer = finished.answer
        if isinstance(answer, Planned) and plan_fits(answer.best, cluster):
            return Interim(answer, finished.cluster, finished.measured)
    return None


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class PlanningService:
    def __init__(
        self,
        catalog: Catalog,
        notify: Callable[[str, str], None],
        *,
        max_searches: int | None = None,
        default_deadline_seconds: float = PLANNING_DEADLINE_SECONDS,
        grace_seconds: float = PLANNING_GRACE_SECONDS,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        self._catalog = catalog
        self._notify = notify
        self._default_deadline = default_deadline_seconds
        self._grace = grace_seconds
        self._cache_size = cache_size
        self._slots = threading.BoundedSemaphore(max_searches or os.cpu_count() or 1)
        self._lock = threading.Lock()
        self._running: dict[JobRef, _Search] = {}
        self._pending: dict[JobRef, _Search] = {}  # the follow-up of a running search
        self._answers: OrderedDict[tuple[JobRef, str], _Finished] = OrderedDict()
        self._finished = itertools.count()
        self._supervisors: set[threading.Thread] = set()
        self._closed = False

    # -- what the reconcile calls --------------------------------------------------------
    def planner(self, job: JobRef) -> Planner:
        """The Planner a reconcile pass of `job` is handed."""
        return functools.partial(self.plan, job)

    def plan(self, job: JobRef, request: PlanRequest, measured: ProfileSet) -> PlannerAnswer:
        if request.deadline_seconds is None:
            request = request.model_copy(update={"deadline_seconds": self._default_deadline})
        content, spec = content_key(request, measured), spec_key(request)
        started: threading.Thread | None = None
        with self._lock:
            if self._closed:
                # Not a failure the job should record: the next operator searches again.
                return Searching(
                    _utcnow(), request.deadline_seconds or 0.0, describe(request), queued=True
                )
            finished = self._answers.get((job, content))
            if finished is not None:
                self._answers.move_to_end((job, content))
                self._pending.pop(job, None)  # the newest ask needs no follow-up
                return finished.answer
            search = self._running.get(job)
            if search is not None and search.spec != spec:
                log.info(
                    "search superseded: the job's spec changed",
                    extra={"namespace": job[0], "trainingjob": job[1]},
                )
                self._cancel(search)
                del self._running[job]
                self._pending.pop(job, None)
                search = None
            if search is None:
                search = self._search(job, content, spec, request, measured)
                self._running[job] = search
                started = self._supervisor(search)
                view = search.view()
            elif search.content == content:
                self._pending.pop(job, None)
                view = search.view()
            else:
                view = self._follow_up(job, content, spec, request, measured).view()
            interim = _interim(
                [f for (owner, _), f in self._answers.items() if owner == job and f.spec == spec],
                request.cluster,
            )
        if started is not None:
            started.start()
        return dataclasses.replace(view, interim=interim) if interim is not None else view

    # -- what the handlers call ----------------------------------------------------------
    def cancel(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Stop the job's search and forget its answers (the job was deleted); uid None
        means every job of that name."""

        def matches(job: JobRef) -> bool:
            return job[:2] == (namespace, name) and uid in (None, job[2])

        with self._lock:
            for job, search in list(self._running.items()):
                if matches(job):
                    self._cancel(search)
                    del self._running[job]
            for job in [j for j in self._pending if matches(j)]:
                del self._pending[job]
            for key in [k for k in self._answers if matches(k[0])]:
                del self._answers[key]

    def running_pids(self) -> dict[JobRef, int]:
        """PIDs of the search processes now running, by job (metrics, tests)."""
        with self._lock:
            return {
                job: s.process.pid
                for job, s in self._running.items()
                if s.process is not None and s.process.pid is not None
            }

    def shutdown(self, timeout: float = 5.0) -> None:
        """Terminate every search and wait (at most `timeout`) for their processes to go."""
        with self._lock:
            self._closed = True
            for search in self._running.values():
                self._cancel(search)
            self._running.clear()
            self._pending.clear()
            supervisors = list(self._supervisors)
        end = time.monotonic() + timeout
        for supervisor in supervisors:
            supervisor.join(max(0.0, end - time.monotonic()))

    # -- inside -----------------------------------------------------------------------------
    def _search(
        self, job: JobRef, content: str, spec: str, request: PlanRequest, measured: ProfileSet
    ) -> _Search:
        return _Search(job, content, spec, request, measured, _utcnow(), describe(request))

    def _supervisor(self, search: _Search) -> threading.Thread:
        """The thread that will run `search` (under self._lock; the caller starts it once
        the lock is released)."""
        supervisor = threading.Thread(
            target=self._supervise,
            args=(search,),
            name=f"plan-{search.job[0]}/{search.job[1]}",
            daemon=True,
        )
        self._supervisors.add(supervisor)
        return supervisor

    def _follow_up(
        self, job: JobRef, content: str, spec: str, request: PlanRequest, measured: ProfileSet
    ) -> _Search:
        """The job's pending follow-up for this content, replacing an older one (under
        self._lock): it runs when the running search ends, which is left alone."""
        follow = self._pending.get(job)
        if follow is None or follow.content != content:
            follow = self._search(job, content, spec, request, measured)
            self._pending[job] = follow
            log.info(
                "new capacity or profiles: searching again when the running search ends",
                extra={"namespace": job[0], "trainingjob": job[1]},
            )
        return follow

    def _cancel(self, search: _Search) -> None:
        # Under self._lock. The supervisor thread sees the process end and reaps it.
        search.cancelled.set()
        if search.process is not None and search.process.is_alive():
            search.process.terminate()

    def _supervise(self, search: _Search) -> None:
        try:
            while not self._slots.acquire(timeout=0.2):
                if search.cancelled.is_set():
                    return
            try:
                answer = self._run(search)
            finally:
                self._slots.release()
            if answer is None:
                return
            follow_up: threading.Thread | None = None
            with self._lock:
                if self._running.get(search.job) is search:
                    del self._running[search.job]
                if search.cancelled.is_set():
                    return
                self._answers[(search.job, search.content)] = _Finished(
                    answer,
                    search.spec,
                    search.request.cluster,
                    search.measured,
                    next(self._finished),
                )
                while len(self._answers) > self._cache_size:
                    self._answers.popitem(last=False)
                pending = self._pending.pop(search.job, None)
                if pending is not None and not self._closed:
                    self._running[search.job] = pending
                    follow_up = self._supervisor(pending)
            if follow_up is not None:
                follow_up.start()
            self._notify(search.job[0], search.job[1])
        finally:
            with self._lock:
                self._supervisors.discard(threading.current_thread())

    def _run(self, search: _Search) -> PlannerAnswer | None:
        """Run the search in a process; None when it was cancelled."""
        if search.cancelled.is_set():
            return None
        reader, writer = _CONTEXT.Pipe(duplex=False)
        process = _CONTEXT.Process(
            target=run_search,
            args=(search.request, search.measured, self._catalog, writer),
            name=f"sailplan-plan-{search.job[0]}-{search.job[1]}",
            daemon=True,
        )
        started = time.monotonic()
        process.start()
        writer.close()  # only the child writes: its exit reads as EOF here
        with self._lock:
            search.process = process
            if search.cancelled.is_set():
                process.terminate()
        try:
            answer = self._await(search, process, reader)
        finally:
            reader.close()
            _reap(process)
        seconds = time.monotonic() - started
        if search.cancelled.is_set():
            log.info(
                "search cancelled",
                extra={"namespace": search.job[0], "trainingjob": search.job[1]},
            )
            return None
        metrics.PLANNING_SECONDS.observe(seconds)
        result = (
            "error"
            if isinstance(answer, SearchFailed)
            else "infeasible"
            if isinstance(answer, Infeasible)
            else "planned"
        )
        metrics.PLANS.labels(result=result).inc()
        log.info(
            "search finished",
            extra={
                "namespace": search.job[0],
                "trainingjob": search.job[1],
                "result": result,
                "seconds": round(seconds, 2),
            },
        )
        return answer

    def _await(self, search: _Search, process: BaseProcess, reader: Connection) -> PlannerAnswer:
        limit = search.deadline_seconds + self._grace
        ready = wait([reader, process.sentinel], timeout=limit)
        if not ready:
            return SearchFailed(
                f"the search did not stop at its {search.deadline_seconds:g} s deadline and "
                f"was killed after {limit:g} s"
            )
        try:
            if reader.poll():
                kind, payload = reader.recv()
                if kind == "ok":
                    result: PlannerAnswer = payload
                    return result
                return SearchFailed(f"the planner failed: {payload}")
        except (EOFError, OSError):
            pass  # the process died without an answer: reported below
        process.join(_TERMINATE_WAIT_SECONDS)
        return SearchFailed(
            f"the search process died without an answer ({_exit_text(process.exitcode)})"
        )


def _reap(process: BaseProcess) -> None:
    """Wait for the process to exit, terminating and then killing it if it does not."""
    process.join(_TERMINATE_WAIT_SECONDS)
    if process.is_alive():
        process.terminate()
        process.join(_TERMINATE_WAIT_SECONDS)
    if process.is_alive():
        process.kill()
        process.join()


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit code {code}"
