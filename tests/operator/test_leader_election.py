"""Leader election against a real API server: the Lease elector on its own (optimistic
concurrency, release), and two operator subprocesses with --leader-elect, the leader SIGKILLed
mid-reconcile or SIGTERMed, the standby taking over (tests/conftest.py fixtures).

Durations are short (lease 4 s, renew deadline 2 s, retry 0.5 s) so a takeover after a
SIGKILL happens within seconds; the margins allow for a loaded two-core machine.
"""

from __future__ import annotations

import re
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from operator_process import ClusterRbac, OperatorProcess, service_account_kubeconfig
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.leader import Action, LeaseRecord, Timings
from sailplan.operator.leader_election import LeaseElector
from sailplan.operator.reconcile.trainingjob import observed_plan

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

LEASE = "sailplan-operator"  # the default --lease-name, the one rbac.yaml's Role names
TIMINGS = Timings(lease_duration_s=4, renew_deadline_s=2.0, retry_period_s=0.5)
JOB_LABEL = "sailplan.dev/job"


def election_args(namespace: str, timings: Timings = TIMINGS) -> list[str]:
    return [
        "--leader-elect",
        f"--lease-namespace={namespace}",
        f"--lease-duration={timings.lease_duration_s}",
        f"--renew-deadline={timings.renew_deadline_s}",
        f"--retry-period={timings.retry_period_s}",
    ]


def lease_holder(k8s_api: Any, namespace: str) -> str:
    try:
        lease = client.CoordinationV1Api(k8s_api).read_namespaced_lease(LEASE, namespace)
    except ApiException as error:
        if error.status == 404:
            return ""
        raise
    return str(lease.spec.holder_identity or "")


def holds(operator: OperatorProcess, holder: str) -> bool:
    """Identities are hostname_pid outside a pod."""
    assert operator.process is not None
    return holder.endswith(f"_{operator.process.pid}")


# -- the elector alone --------------------------------------------------------------------


class RacingElector(LeaseElector):
    """Holds every write at a barrier, so two candidates write from the same read."""

    def __init__(self, barrier: threading.Barrier, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.barrier = barrier

    def _write(self, record: LeaseRecord, create: bool) -> bool:
        self.barrier.wait(timeout=10)
        return super()._write(record, create)


def race(candidates: list[RacingElector]) -> dict[str, Action]:
    """One round of every candidate at once; what each did."""
    outcomes: dict[str, Action] = {}

    def one_round(candidate: LeaseElector) -> None:
        outcomes[candidate.identity] = candidate.try_acquire_or_renew()

    threads = [threading.Thread(target=one_round, args=(c,)) for c in candidates]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    return outcomes


def test_two_candidates_writing_from_the_same_read_never_both_win(
    k8s_api: Any, namespace: str
) -> None:
    barrier = threading.Barrier(2)
    a, b = (
        RacingElector(barrier, k8s_api, namespace, LEASE, identity=name, timings=TIMINGS)
        for name in ("a", "b")
    )
    # Both create the missing Lease: one create fails with AlreadyExists.
    created = race([a, b])
    assert sorted(created.values(), key=str) == [Action.CREATE, Action.WAIT], created
    (winner,) = [c for c in (a, b) if created[c.identity] is Action.CREATE]
    loser = b if winner is a else a
    assert lease_holder(k8s_api, namespace) == winner.identity and not loser.leading
    # The loser sees the Lease, then its clock runs an hour ahead: to it the Lease expired
    # while the winner renews. Both write from the same resourceVersion; one gets 409.
    assert loser.try_acquire_or_renew() is Action.WAIT
    loser.clock = lambda: time.monotonic() + 3600
    contested = race([a, b])
    (wrote,) = [name for name, action in contested.items() if action is not Action.WAIT]
    assert contested[wrote] in (Action.RENEW, Action.ACQUIRE), contested
    assert lease_holder(k8s_api, namespace) == wrote


def test_a_released_lease_is_taken_at_the_next_try_and_counts_a_transition(
    k8s_api: Any, namespace: str
) -> None:
    first = LeaseElector(k8s_api, namespace, LEASE, identity="first", timings=TIMINGS)
    second = LeaseElector(k8s_api, namespace, LEASE, identity="second", timings=TIMINGS)
    assert first.acquire(threading.Event())
    assert second.try_acquire_or_renew() is Action.WAIT
    first.release()
    assert lease_holder(k8s_api, namespace) == ""
    assert second.try_acquire_or_renew() is Action.ACQUIRE  # no lease duration waited
    lease = client.CoordinationV1Api(k8s_api).read_namespaced_lease(LEASE, namespace)
    assert (lease.spec.holder_identity, lease.spec.lease_transitions) == ("second", 1)
    # The former leader, renewing now, finds another holder and steps down.
    first.leading = True
    assert first.try_acquire_or_renew() is Action.STEP_DOWN


# -- two operators ---------------------------------------------------------------------


@pytest.fixture
def two_operators(
    kubeconfig: str, namespace: str, crds: None, k8s_api: Any, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    operators = [
        OperatorProcess(
            kubeconfig, namespace, tmp_path / f"operator-{i}.log", *election_args(namespace)
        )
        for i in (1, 2)
    ]
    for operator in operators:
        operator.start()
    try:
        yield operators
    finally:
        for operator in operators:
            operator.stop()
        custom = client.CustomObjectsApi(k8s_api)
        for job in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs")[
            "items"
        ]:
            custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, "trainingjobs", job["metadata"]["name"]
            )
        core = client.CoreV1Api(k8s_api)
        wait_for(
            "test pods gone",
            lambda: not core.list_namespaced_pod(namespace, label_selector=JOB_LABEL).items,
            60,
        )


def leader_and_standby(
    k8s_api: Any, namespace: str, operators: list[OperatorProcess]
) -> tuple[OperatorProcess, OperatorProcess]:
    holder = wait_for(
        "one operator holding the Lease",
        lambda: lease_holder(k8s_api, namespace),
        60,
        lambda: "\n".join(line for o in operators for line in o.log_tail(15)),
    )
    (leader,) = [o for o in operators if holds(o, holder)]
    (standby,) = [o for o in operators if o is not leader]
    wait_for(
        "the standby saying it waits",
        lambda: "is a standby, waiting for Lease" in standby.log.read_text(),
        30,
        lambda: "\n".join(standby.log_tail(15)),
    )
    return leader, standby


def many_workers_job(namespace: str, name: str, pool: str) -> dict[str, Any]:
    """A job with one pod per GPU of the a100-ondemand pool (16 on the local cluster's four
    nodes), so the leader is killed with pods still to create."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            # A large batch: data parallelism over every GPU beats tensor parallelism.
            "model": {"name": "OPT-350M"},
            "training": {"globalBatchSize": 512, "steps": 10},
            "pools": {"names": [pool]},
            "trainer": {"image": "sailplan-trainer:test"},
            "checkpoint": {"storage": {"uri": "gs://bucket/test"}},
            "profiling": {"mode": "Skip"},
        },
    }


def worker_pods(k8s_api: Any, namespace: str, job: str) -> list[Any]:
    selector = f"{JOB_LABEL}={job},sailplan.dev/role=worker"
    pods: list[Any] = (
        client.CoreV1Api(k8s_api).list_namespaced_pod(namespace, label_selector=selector).items
    )
    return pods


def test_the_standby_takes_over_a_sigkilled_leader_without_duplicates_or_lost_status(
    k8s_api: Any, namespace: str, two_operators: list[OperatorProcess], gpupools: Any
) -> None:
    leader, standby = leader_and_standby(k8s_api, namespace, two_operators)
    pool = gpupools("a100-ondemand")
    core = client.CoreV1Api(k8s_api)
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingjobs", many_workers_job(namespace, "failover", pool)
    )
    # SIGKILL the moment the first worker pod exists (a watch, not a poll: the leader creates
    # the rest within a fraction of a second): the others are still to create, status unwritten.
    watcher = watch.Watch()
    for _ in watcher.stream(
        core.list_namespaced_pod,
        namespace,
        label_selector=f"{JOB_LABEL}=failover,sailplan.dev/role=worker",
        timeout_seconds=120,
    ):
        break
    watcher.stop()
    assert "leads: acquired Lease" not in standby.log.read_text()
    leader.kill()
    killed_at = time.monotonic()
    before = {p.metadata.name for p in worker_pods(k8s_api, namespace, "failover")}
    wait_for(
        "the standby holding the Lease",
        lambda: holds(standby, lease_holder(k8s_api, namespace)),
        TIMINGS.lease_duration_s + 10,
        lambda: "\n".join(standby.log_tail(20)),
    )
    takeover_s = time.monotonic() - killed_at
    # A standby must wait out the lease from its last sighting of a renewal, no longer.
    assert takeover_s <= TIMINGS.lease_duration_s + TIMINGS.retry_period_s + 3, takeover_s

    def running() -> dict[str, Any] | None:
        job: dict[str, Any] = client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", "failover"
        )
        return job if (job.get("status") or {}).get("phase") == "Running" else None

    job = wait_for("the job Running", running, 180, lambda: "\n".join(standby.log_tail(20)))
    plan_maps = core.list_namespaced_config_map(
        namespace, label_selector=f"{JOB_LABEL}=failover,sailplan.dev/role=plan"
    ).items
    assert len(plan_maps) == 1, [m.metadata.name for m in plan_maps]
    observed = observed_plan(
        {
            "metadata": {
                "name": plan_maps[0].metadata.name,
                "labels": plan_maps[0].metadata.labels,
            },
            "data": plan_maps[0].data,
        }
    )
    assert observed is not None
    workers = observed.plan.workers()
    assert len(workers) >= 8, "a job with many workers"
    pods = worker_pods(k8s_api, namespace, "failover")
    names = [p.metadata.name for p in pods]
    assert len(names) == len(set(names)) == len(workers)
    assert sorted(int(p.metadata.labels["sailplan.dev/worker-index"]) for p in pods) == sorted(
        w.index for w in workers
    )
    assert 0 < len(before) < len(workers), "killed while creating pods"
    assert before <= set(names)  # nothing the dead leader created was replaced
    status = job["status"]
    assert status["plan"]["generation"] == 1 and status["plan"]["gpus"] == observed.plan.world_size
    assert [h["generation"] for h in status["history"]] == [1]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions.get("Planned") == "True", status["conditions"]


def test_a_sigtermed_leader_releases_the_lease_and_the_standby_takes_over_at_once(
    k8s_api: Any, namespace: str, two_operators: list[OperatorProcess]
) -> None:
    leader, standby = leader_and_standby(k8s_api, namespace, two_operators)
    assert leader.process is not None
    leader.process.send_signal(signal.SIGTERM)
    assert leader.process.wait(timeout=30) == 0
    exited_at = time.monotonic()
    wait_for(
        "the standby holding the Lease",
        lambda: holds(standby, lease_holder(k8s_api, namespace)),
        TIMINGS.lease_duration_s,
        lambda: "\n".join(standby.log_tail(20)),
    )
    # Well under the lease duration: the Lease was released, not waited out.
    assert time.monotonic() - exited_at <= TIMINGS.retry_period_s + 1.5
    assert "released Lease" in leader.log.read_text()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except OSError as error:
        return 0, str(error)


def test_a_standby_is_healthy_and_reports_itself_not_leading_until_it_takes_over(
    kubeconfig: str, namespace: str, crds: None, k8s_api: Any, tmp_path: Path
) -> None:
    ports = [(free_port(), free_port()) for _ in range(2)]
    operators = [
        OperatorProcess(
            kubeconfig,
            namespace,
            tmp_path / f"operator-{health}.log",
            *election_args(namespace),
            f"--health-port={health}",
            f"--metrics-port={metrics}",
        )
        for health, metrics in ports
    ]
    for operator in operators:
        operator.start()
    try:
        leader, standby = leader_and_standby(k8s_api, namespace, operators)
        (leader_health, leader_metrics), (standby_health, standby_metrics) = (
            ports[operators.index(o)] for o in (leader, standby)
        )

        def gauge(port: int) -> str | None:
            status, text = get(f"http://127.0.0.1:{port}/metrics")
            found = re.search(r"^sailplan_operator_leader (\S+)$", text, re.MULTILINE)
            return found.group(1) if status == 200 and found else None

        def kopf_probe(port: int) -> bool:
            """Kopf's liveness endpoint (not the standby's) answers healthy on `port`."""
            status, body = get(f"http://127.0.0.1:{port}/healthz")
            return status == 200 and body != "standby\n"

        # The kubelet must not restart a standby: its /healthz answers while it waits.
        assert get(f"http://127.0.0.1:{standby_health}/healthz") == (200, "standby\n")
        assert wait_for("the leader's gauge", lambda: gauge(leader_metrics), 30) == "1.0"
        assert gauge(standby_metrics) == "0.0"
        assert wait_for("the leader's Kopf probe", lambda: kopf_probe(leader_health), 30)
        leader.stop()
        # Taking over, the standby hands its port to Kopf's liveness endpoint.
        wait_for("the new leader's gauge", lambda: gauge(standby_metrics) == "1.0", 30)
        wait_for(
            "Kopf's probe on the former standby's port",
            lambda: kopf_probe(standby_health),
            30,
            lambda: "\n".join(standby.log_tail(20)),
        )
    finally:
        for operator in operators:
            operator.stop()


def test_a_leader_whose_lease_is_taken_exits_at_once(
    k8s_api: Any, namespace: str, two_operators: list[OperatorProcess]
) -> None:
    leader, _ = leader_and_standby(k8s_api, namespace, two_operators)
    coordination = client.CoordinationV1Api(k8s_api)
    lease = coordination.read_namespaced_lease(LEASE, namespace)
    lease.spec.holder_identity = "intruder"
    coordination.replace_namespaced_lease(LEASE, namespace, lease)
    assert leader.process is not None
    assert leader.process.wait(timeout=TIMINGS.renew_deadline_s + 5) == 1
    assert "leadership lost (the Lease is held by intruder)" in leader.log.read_text()


def test_leader_election_runs_with_exactly_the_manifest_rbac(
    kubeconfig: str, k8s_api: Any, namespace: str, crds: None, tmp_path: Path
) -> None:
    """The Role in manifests/base/rbac.yaml lets the operator create, read and renew its
    Lease in its own namespace, and release it on SIGTERM."""
    rbac = ClusterRbac(k8s_api, namespace)
    try:
        token = rbac.grant()
        limited = service_account_kubeconfig(kubeconfig, token, tmp_path / "operator.kubeconfig")
        operator = OperatorProcess(
            limited, namespace, tmp_path / "operator.log", *election_args(namespace)
        )
        operator.start()
        try:
            holder = wait_for(
                "the operator holding the Lease",
                lambda: lease_holder(k8s_api, namespace),
                60,
                lambda: "\n".join(operator.log_tail(20)),
            )
            assert holds(operator, holder)
            renewed = client.CoordinationV1Api(k8s_api).read_namespaced_lease(LEASE, namespace)
            wait_for(
                "a renewal",
                lambda: (
                    client.CoordinationV1Api(k8s_api)
                    .read_namespaced_lease(LEASE, namespace)
                    .spec.renew_time
                    > renewed.spec.renew_time
                ),
                10,
            )
        finally:
            operator.stop()
        assert lease_holder(k8s_api, namespace) == ""
        log = operator.log.read_text()
        assert "Forbidden" not in log and "not read or written" not in log, log[-2000:]
    finally:
        rbac.revoke()
