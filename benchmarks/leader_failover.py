"""Leader failover on the local cluster: how long TrainingJobs go unhandled when the leading
operator replica dies (SIGKILL: its node crashed) or is stopped (SIGTERM: a rollout, a drain).

Two real operators (subprocesses, `operator run --leader-elect`, as the Deployment's two
replicas run) against the local control plane's API server. Per run, once one holds the
Lease and the other waits, the leader gets the signal; right after it has exited a
TrainingJob naming an unknown model is created, which any serving operator marks Invalid
within a fraction of a second. Columns (medians over the runs, wall-clock seconds from the
signal; min and max in parentheses):

  leader exited   the leader's process gone (SIGTERM: Kopf stopped, then the Lease released)
  Lease taken     the standby's identity in the Lease (polled every 20 ms)
  job handled     the new TrainingJob's status.phase Invalid: Kopf started, watching and
                  reconciling in the new leader

    python benchmarks/leader_failover.py [--runs 3] [--timings 15/10/2 --timings 4/2/0.5]
                                         [--kubeconfig PATH]

--timings is lease duration / renew deadline / retry period in seconds (repeatable; the
default is the Deployment's 15/10/2 and the tests' 4/2/0.5). Without --kubeconfig a local
cluster `failoverbench` is brought up (and left running for reuse).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' helpers, as pytest's `pythonpath` gives them

from operator_process import OperatorProcess, install_crds  # noqa: E402
from waiting import wait_for  # noqa: E402

from sailplan.operator.api.common import GROUP, VERSION  # noqa: E402
from sailplan.operator.leader import Timings  # noqa: E402

LEASE = "sailplan-operator"
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM}


def parse_timings(text: str) -> Timings:
    lease, renew, retry = text.split("/")
    return Timings(int(lease), float(renew), float(retry))


def lease_holder(api: Any, namespace: str) -> str:
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace)
    except ApiException as error:
        if error.status == 404:
            return ""
        raise
    return str(lease.spec.holder_identity or "")


def identity_of(operator: OperatorProcess) -> str:
    assert operator.process is not None
    return f"_{operator.process.pid}"  # hostname_pid outside a pod


def unknown_model_job(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": "after-failover", "namespace": namespace},
        "spec": {
            "model": {"name": "OPT-305M"},
            "training": {"globalBatchSize": 16, "steps": 10},
            "trainer": {"image": "sailplan-trainer:test"},
            "checkpoint": {"storage": {"uri": "gs://bucket/test"}},
            "profiling": {"mode": "Skip"},
        },
    }


def one_run(
    api: Any, kubeconfig: str, timings: Timings, signum: signal.Signals, workdir: Path
) -> dict[str, float]:
    namespace = f"failover-bench-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    core.create_namespace({"metadata": {"name": namespace}})
    election = [
        "--leader-elect",
        f"--lease-namespace={namespace}",
        f"--lease-duration={timings.lease_duration_s}",
        f"--renew-deadline={timings.renew_deadline_s}",
        f"--retry-period={timings.retry_period_s}",
    ]
    operators = [
        OperatorProcess(kubeconfig, namespace, workdir / f"{namespace}-{i}.log", *election)
        for i in (1, 2)
    ]
    try:
        for operator in operators:
            operator.start()
        holder = wait_for("a leader", lambda: lease_holder(api, namespace), 60)
        (leader,) = [o for o in operators if holder.endswith(identity_of(o))]
        (standby,) = [o for o in operators if o is not leader]
        wait_for(
            "the standby waiting",
            lambda: "is a standby, waiting" in standby.log.read_text(),
            30,
        )
        # Let the standby see a few renewals, as in a cluster running for a while.
        time.sleep(3 * timings.retry_period_s)
        assert leader.process is not None
        signalled = time.monotonic()
        leader.process.send_signal(signum)
        leader.process.wait(timeout=30)
        exited = time.monotonic() - signalled
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", unknown_model_job(namespace)
        )
        wait_for(
            "the standby holding the Lease",
            lambda: lease_holder(api, namespace).endswith(identity_of(standby)),
            timings.lease_duration_s + 30,
            interval_s=0.02,
        )
        taken = time.monotonic() - signalled

        def invalid() -> bool:
            job = custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "trainingjobs", "after-failover"
            )
            return bool((job.get("status") or {}).get("phase") == "Invalid")

        wait_for("the job handled", invalid, 60, interval_s=0.02)
        handled = time.monotonic() - signalled
        # Deleted while an operator serves it: Kopf's finalizer would keep it (and its
        # namespace) otherwise.
        custom.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", "after-failover"
        )
        wait_for(
            "the job deleted",
            lambda: (
                not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs")[
                    "items"
                ]
            ),
            60,
        )
        return {"exited": exited, "taken": taken, "handled": handled}
    finally:
        for operator in operators:
            operator.stop()
        core.delete_namespace(namespace)


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timings", action="append", type=parse_timings, default=None)
    parser.add_argument("--kubeconfig", type=Path, default=None)
    args = parser.parse_args()
    all_timings: list[Timings] = args.timings or [Timings(15, 10, 2), Timings(4, 2, 0.5)]
    console = Console(width=120)
    from sailplan_dev.localcluster.cluster import LocalCluster

    cluster = (
        LocalCluster.attach(args.kubeconfig)
        if args.kubeconfig
        else LocalCluster.up(name="failoverbench", log=console.print)
    )
    install_crds(cluster.api)
    table = Table(
        title=f"Leader failover, local cluster, median of {args.runs} runs "
        "(seconds from the signal; min-max)"
    )
    columns = ("signal", "lease / renew / retry (s)", "leader exited", "Lease taken", "job handled")
    for column in columns:
        table.add_column(column, justify="left" if column == "signal" else "right")
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as tmp:
        for timings in all_timings:
            for name, signum in SIGNALS.items():
                runs = []
                for index in range(args.runs):
                    run = one_run(cluster.api, str(cluster.kubeconfig), timings, signum, Path(tmp))
                    console.print(f"{name} {timings} run {index + 1}: {run}")
                    runs.append(run)
                table.add_row(
                    name,
                    f"{timings.lease_duration_s} / {timings.renew_deadline_s:g} / "
                    f"{timings.retry_period_s:g}",
                    *(summary([r[key] for r in runs]) for key in ("exited", "taken", "handled")),
                )
    console.print(table)


if __name__ == "__main__":
    main()
