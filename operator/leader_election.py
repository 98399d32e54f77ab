"""Leader election over a coordination.k8s.io/v1 Lease, and running the operator only while
this replica leads: what `sailplan operator run --leader-elect` (operator/cli) does, so the
Deployment can run two replicas and a standby takes over within seconds of the leader dying.

Why not `kubernetes.leaderelection` from the official client: it cannot release the Lease on
a clean shutdown (a SIGTERMed leader would leave the standby waiting a full lease duration),
rejects retry periods under a second, builds its own API client from the global
configuration instead of the operator's, and calls sys.exit on bad settings. What it does is
small; the decision rules are in sailplan.operator.leader (pure), this module is the I/O.

The election runs in plain threads, not on Kopf's event loop: a handler that blocks the loop
must not stop the renewals, and Kopf cancels every task created after it starts when it
stops. A leader that cannot renew before its renew deadline exits the process at once
(exit code 1), as controller-runtime does: Kubernetes restarts it as a standby, and nothing
is lost because all state is in the cluster. Updates carry the Lease's resourceVersion, so
of two replicas writing the same Lease one gets 409 Conflict and does not lead.
"""

from __future__ import annotations

import http.server
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import urllib3.exceptions
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sailplan.operator import metrics
from sailplan.operator.leader import (
    Action,
    LeaseRecord,
    Observation,
    Timings,
    decide,
    observe,
    released,
    renew_overdue,
)

logger = logging.getLogger("sailplan.operator.leader")

# coordination.k8s.io MicroTime: RFC 3339 with exactly six fractional digits.
MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def default_identity() -> str:
    """The pod name where the Deployment provides it (POD_NAME), else hostname and pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


def _record_of(lease: client.V1Lease) -> LeaseRecord:
    spec = lease.spec or client.V1LeaseSpec()
    return LeaseRecord(
        holder=spec.holder_identity or "",
        duration_s=spec.lease_duration_seconds or 0,
        acquired_at=spec.acquire_time,
        renewed_at=spec.renew_time,
        transitions=spec.lease_transitions or 0,
    )


def _version_of(lease: client.V1Lease) -> str | None:
    return lease.metadata.resource_version if lease.metadata else None


def _spec_of(record: LeaseRecord) -> dict[str, Any]:
    def micro(at: datetime | None) -> str | None:
        return at.astimezone(UTC).strftime(MICRO_TIME) if at else None

    return {
        "holderIdentity": record.holder or None,
        "leaseDurationSeconds": record.duration_s,
        "acquireTime": micro(record.acquired_at),
        "renewTime": micro(record.renewed_at),
        "leaseTransitions": record.transitions,
    }


class LeaseElector:
    """One candidate for the Lease `namespace/name`.

    acquire() blocks until this candidate leads (or is stopped), hold() renews until stopped
    or lost, release() hands the Lease over on a clean shutdown.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        name: str,
        *,
        identity: str,
        timings: Timings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.coordination = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timings = timings
        self.clock = clock
        self.observed: Observation | None = None
        self.resource_version: str | None = None
        self.leading = False
        self.last_renewed = 0.0
        self._last_waiting_for: str | None = None

    def _request_timeout(self) -> float:
        # A hung request must not carry a leader past its renew deadline.
        if not self.leading:
            return self.timings.renew_deadline_s
        remaining = self.last_renewed + self.timings.renew_deadline_s - self.clock()
        return max(0.1, remaining)

    def _read(self) -> LeaseRecord | None:
        try:
            lease = self.coordination.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._request_timeout()
            )
        except ApiException as error:
            if error.status == 404:
                self.resource_version = None
                return None
            raise
        self.resource_version = _version_of(lease)
        return _record_of(lease)

    def _write(self, record: LeaseRecord, create: bool) -> bool:
        """Create or update (at the resourceVersion read) the Lease; False if another
        candidate wrote first."""
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata}
        body["spec"] = _spec_of(record)
        try:
            if create:
                lease = self.coordination.create_namespaced_lease(
                    self.namespace, cast(Any, body), _request_timeout=self._request_timeout()
                )
            else:
                metadata["resourceVersion"] = self.resource_version
                lease = self.coordination.replace_namespaced_lease(
                    self.name,
                    self.namespace,
                    cast(Any, body),
                    _request_timeout=self._request_timeout(),
                )
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        self.resource_version = _version_of(lease)
        return True

    def try_acquire_or_renew(self) -> Action:
        """One round: read the Lease, decide, write. Returns what was done; an I/O error or a
        lost write race counts as WAIT (not leading this round)."""
        started = self.clock()
        try:
            record = self._read()
            self.observed = observe(self.observed, record, started)
            decision = decide(
                self.observed,
                self.identity,
                leading=self.leading,
                now=started,
                wall=datetime.now(UTC),
                lease_duration_s=self.timings.lease_duration_s,
            )
            if decision.write is None:
                self._log_waiting(record)
                return decision.action
            if not self._write(decision.write, create=decision.action is Action.CREATE):
                return Action.WAIT
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            logger.warning("Lease %s/%s not read or written: %s", self.namespace, self.name, error)
            return Action.WAIT
        # What was written is what the next read sees: its first sighting is now.
        self.observed = Observation(decision.write, started)
        self.last_renewed = started
        if not self.leading:
            logger.info("%s leads: acquired Lease %s/%s", self.identity, self.namespace, self.name)
        self.leading = True
        metrics.LEADER.set(1)
        return decision.action

    def _log_waiting(self, record: LeaseRecord | None) -> None:
        holder = record.holder if record else ""
        if holder != self._last_waiting_for:
            logger.info(
                "%s is a standby, waiting for Lease %s/%s held by %s",
                self.identity,
                self.namespace,
                self.name,
                holder,
            )
            self._last_waiting_for = holder

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this candidate leads (True) or `stop` is set (False)."""
        metrics.LEADER.set(0)
        while not stop.is_set():
            if self.try_acquire_or_renew() in (Action.CREATE, Action.ACQUIRE, Action.RENEW):
                return True
            stop.wait(self.timings.retry_period_s)
        return False

    def hold(self, stop: threading.Event, on_lost: Callable[[str], None]) -> None:
        """Renew every retry period until `stop` is set; call `on_lost` with the reason when
        another replica took the Lease or no renewal succeeded within the renew deadline."""
        while not stop.wait(self.timings.retry_period_s):
            try:
                action = self.try_acquire_or_renew()
            except Exception as error:  # fail safe: a renewer that died must not keep a leader
                self._lose(on_lost, f"renewing failed: {error!r}")
                return
            if action is Action.RENEW:
                continue
            if action is Action.STEP_DOWN:
                holder = (
                    self.observed.record.holder if self.observed and self.observed.record else ""
                )
                self._lose(on_lost, f"the Lease is held by {holder}")
                return
            if renew_overdue(self.last_renewed, self.clock(), self.timings):
                self._lose(
                    on_lost, f"not renewed within the {self.timings.renew_deadline_s}s deadline"
                )
                return

    def _lose(self, on_lost: Callable[[str], None], reason: str) -> None:
        self.leading = False
        metrics.LEADER.set(0)
        on_lost(reason)

    def release(self) -> None:
        """Hand the Lease over (no holder) if this candidate still holds it."""
        if not self.leading:
            return
        self.leading = False
        metrics.LEADER.set(0)
        try:
            record = self._read()
            if record is None or record.holder != self.identity:
                return
            if self._write(released(record, datetime.now(UTC)), create=False):
                logger.info("%s released Lease %s/%s", self.identity, self.namespace, self.name)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            logger.warning("Lease %s/%s not released: %s", self.namespace, self.name, error)


def exit_on_lost_leadership(reason: str) -> None:
    """Stop handling at once: exit the process without any cleanup, so no handler of a
    former leader writes after another replica took over. Kubernetes restarts the container
    and it comes back as a standby."""
    logger.error("leadership lost (%s): exiting", reason)
    logging.shutdown()
    os._exit(1)


class _StandbyHealth(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        healthy = self.path.split("?")[0] == "/healthz"
        self.send_response(200 if healthy else 404)
        self.end_headers()
        self.wfile.write(b"standby\n" if healthy else b"")

    def log_message(self, format: str, *args: Any) -> None:
        """The probes every few seconds are not news."""


def run_while_leading(
    elector: LeaseElector, operate: Callable[[], None], health_port: int | None
) -> None:
    """Wait as a standby (answering /healthz on `health_port` so the kubelet keeps it), then
    run `operate` (the operator, blocking until it stops) while renewing the Lease, and
    release the Lease once it returned. SIGTERM or SIGINT while waiting returns at once."""
    stop_waiting = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda *_: stop_waiting.set())
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    standby: http.server.ThreadingHTTPServer | None = None
    if health_port:
        standby = http.server.ThreadingHTTPServer(("0.0.0.0", health_port), _StandbyHealth)
        threading.Thread(target=standby.serve_forever, name="standby-healthz", daemon=True).start()
    try:
        leading = elector.acquire(stop_waiting)
    finally:
        if standby is not None:
            standby.shutdown()
            standby.server_close()  # the operator's own liveness endpoint takes the port
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if not leading:
        logger.info("%s stopped while a standby", elector.identity)
        return
    stop_renewing = threading.Event()
    renewer = threading.Thread(
        target=elector.hold,
        args=(stop_renewing, exit_on_lost_leadership),
        name="lease-renewer",
        daemon=True,
    )
    renewer.start()
    try:
        operate()
    finally:
        # Only once the operator stopped handling: then the standby may start.
        stop_renewing.set()
        renewer.join()
        elector.release()
