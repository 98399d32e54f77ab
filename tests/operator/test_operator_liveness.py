"""The operator process supervises itself and stops promptly (real API server, operator
as a subprocess): `/healthz` reports its background tasks through Kopf's liveness
endpoint, and SIGTERM ends it within seconds even while a plan search is running.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_process import OperatorProcess
from waiting import wait_for

from sailplan.operator.api.common import GROUP, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WORKERS = 4  # OperatorConfig.workers' default


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _healthz(port: int) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None
    except OSError:
        return 0, None  # not listening yet


def _operator(kubeconfig: str, namespace: str, log: Path, health_port: int) -> OperatorProcess:
    # The later --health-port overrides OperatorProcess's "0" (off).
    return OperatorProcess(kubeconfig, namespace, log, "--health-port", str(health_port))


def test_healthz_reports_every_background_task_running(
    kubeconfig: str, namespace: str, crds: None, tmp_path: Path
) -> None:
    port = _free_port()
    operator = _operator(kubeconfig, namespace, tmp_path / "operator.log", port)
    operator.start()
    try:
        expected = {f"queue-worker-{n}": "running" for n in range(WORKERS)} | {
            "resync": "running",
            "progress": "running",
        }

        def tasks_reported() -> Any:
            # The local cluster has nodes: their watch events start the tasks at once.
            status, body = _healthz(port)
            return body if status == 200 and body.get("background-tasks") == expected else None

        wait_for("/healthz listing every background task running", tasks_reported, 60)
    finally:
        operator.stop()


@pytest.mark.usefixtures("crds")
def test_sigterm_stops_the_operator_within_seconds_while_a_search_runs(
    kubeconfig: str,
    namespace: str,
    k8s_api: Any,
    gpupools: Callable[..., str],
    tmp_path: Path,
) -> None:
    pools = [gpupools(p) for p in ("a100-ondemand", "a100-spot", "v100-ondemand", "v100-spot")]
    operator = OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log")
    operator.start()
    try:
        # The report: a large model over four pools and a tight budget keeps the
        # search busy for minutes.
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingJob",
            "metadata": {"name": "big", "namespace": namespace},
            "spec": {
                "model": {"name": "OPT-30B"},
                "training": {"globalBatchSize": 512, "steps": 10},
                "pools": {"names": pools},
                "objective": {"kind": "Throughput", "maxUsdPerHour": 1},
                "trainer": {"image": "sailplan-trainer:test"},
                "checkpoint": {"storage": {"uri": "gs://bucket/test"}},
                "profiling": {"mode": "Skip"},
            },
        }
        client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", body
        )
        custom = client.CustomObjectsApi(k8s_api)

        def searching() -> bool:
            job = custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "trainingjobs", "big"
            )
            conditions = (job.get("status") or {}).get("conditions") or []
            return any(
                c["type"] == "Planning" and c["status"] == "True" and c["reason"] == "Searching"
                for c in conditions
            )

        wait_for("the job's search under way", searching, 60)
        time.sleep(2)  # well into the search
        process = operator.process
        assert process is not None and process.poll() is None, operator.log_tail()
        started = time.monotonic()
        process.terminate()
        process.wait(timeout=30)
        took = time.monotonic() - started
        print(f"operator exited {took:.2f} s after SIGTERM")
    finally:
        operator.kill()
        client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", "big"
        )
    assert took < 5, f"exit took {took:.1f} s after SIGTERM\n" + "\n".join(operator.log_tail())
