"""Init containers and container logs of the pod runner, through the real API server.

The operator's profiling Jobs (operator/profiling/jobs.py) run the profiler as an init
container writing into an emptyDir, then a `report` container printing the results, whose
log the operator reads with `read_namespaced_pod_log(..., container="report")`. These tests
check each link of that path on the real control plane: init containers run in order and
share the pod's emptyDir with the app container, each with its own env and resources; a
failing init container fails the pod (restartPolicy Never) without starting the app
container; kube-apiserver proxies `pods/log` to the runner's /containerLogs endpoint,
options included; and the Job controller completes a Job whose pod the runner ran.
Expected values are the ones written into the pod specs here, or the Kubernetes API
documentation's where it decides (quoted).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client
from runner_harness import add_runner_node
from test_podrunner import ZONE, Pods, RunnerNode
from waiting import wait_for

from sailplan_dev.localcluster.podrunner import PodRunner

pytestmark = pytest.mark.cluster


@pytest.fixture
def runner_node(runner: PodRunner) -> RunnerNode:
    pool = f"pl-{uuid.uuid4().hex[:8]}"
    name = add_runner_node(runner, pool, "nvidia-tesla-a100", ZONE, gpus=4)
    return RunnerNode(name=name, pool=pool)


@pytest.fixture
def pods(k8s_api: Any, namespace: str) -> Pods:
    found = Pods(k8s_api)
    # Pod admission needs the namespace's `default` ServiceAccount, which the controller
    # manager adds a moment after the namespace: the Job controller would back off on it.
    wait_for("the default ServiceAccount", lambda: found._service_account(namespace), 30.0)
    return found


WORK = {"name": "work", "emptyDir": {}}
WORK_MOUNT = {"name": "work", "mountPath": "/work"}

# Each container says who it is from its own env and resourceFieldRef (its own cpu limit).
_INIT = """
import os
open("/work/msg", "w").write(f"{os.environ['WHO']} saw cpus={os.environ['CPUS']}")
print("init done")
"""
_MAIN = """
import os
print(open("/work/msg").read())
print(f"{os.environ['WHO']} saw cpus={os.environ['CPUS']}")
print("last line")
"""


def _env(name: str) -> list[dict[str, Any]]:
    return [
        {"name": "WHO", "value": name},
        {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
    ]


def _container(name: str, script: str, cpus: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": "sailplan/test:none",
        "command": ["python", "-c", script],
        "env": _env(name),
        "resources": {"requests": {"cpu": cpus}, "limits": {"cpu": cpus}},
        "volumeMounts": [WORK_MOUNT],
    }


def _init_pod(pods: Pods, name: str, pool: str, init: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod of `pool` with the `init` containers and an app container `main` running _MAIN
    (the GPU of Pods.manifest and a cpu limit of 1), all sharing the `work` emptyDir."""
    command = ["python", "-c", _MAIN]
    manifest = pods.manifest(
        name, pool, command, env=_env("main"), volumes=[WORK], mounts=[WORK_MOUNT]
    )
    manifest["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1"
    manifest["spec"]["initContainers"] = init
    return manifest


def _condition(pod: Any, kind: str) -> Any:
    return next(c for c in pod.status.conditions if c.type == kind)


def test_init_container_fills_the_emptydir_and_both_logs_come_through_the_api_server(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str
) -> None:
    manifest = _init_pod(pods, "staged", runner_node.pool, [_container("fill", _INIT, "2")])
    pods.create(namespace, manifest)

    pod = pods.wait_phase(namespace, "staged", ("Succeeded", "Failed"))
    read = pods.core.read_namespaced_pod_log
    main_log = read("staged", namespace, container="main")
    assert pod.status.phase == "Succeeded", main_log
    # What the init container left in the emptyDir, then the app container's own view: each
    # container got its own env value and its own cpu limit (2 for init, 1 for main).
    assert main_log == "fill saw cpus=2\nmain saw cpus=1\nlast line\n"
    assert read("staged", namespace, container="fill") == "init done\n"
    # Without `container`, a one-container pod's log is the API server's default choice.
    assert read("staged", namespace) == main_log
    (init,) = pod.status.init_container_statuses
    assert (init.name, init.ready, init.state.terminated.exit_code) == ("fill", True, 0)
    assert init.state.terminated.reason == "Completed"
    # The app container started only after the init container had finished.
    assert pod.status.container_statuses[0].state.terminated.started_at >= (
        init.state.terminated.finished_at
    )
    assert _condition(pod, "Initialized").status == "True"


def test_log_options_are_applied_and_unsupported_ones_refused(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str
) -> None:
    script = "print('one'); print('two'); print('three')"
    pods.create(namespace, pods.manifest("chatty", runner_node.pool, ["python", "-c", script]))
    pods.wait_phase(namespace, "chatty", ("Succeeded",))
    read = pods.core.read_namespaced_pod_log

    assert read("chatty", namespace, container="main", tail_lines=2) == "two\nthree\n"
    assert read("chatty", namespace, container="main", limit_bytes=6) == "one\ntw"
    # limitBytes applies to what tailLines selected (the kubelet's order).
    assert read("chatty", namespace, container="main", tail_lines=1, limit_bytes=3) == "thr"
    # `follow` of a finished container: everything there is, then the stream ends.
    assert read("chatty", namespace, container="main", follow=True) == "one\ntwo\nthree\n"
    with pytest.raises(client.ApiException) as refused:
        read("chatty", namespace, container="main", timestamps=True)
    assert refused.value.status == 400
    assert "timestamps is not supported" in refused.value.body
    with pytest.raises(client.ApiException) as no_previous:
        read("chatty", namespace, container="main", previous=True)
    assert no_previous.value.status == 400
    assert "previous terminated container" in no_previous.value.body


def test_follow_streams_a_running_container_until_it_exits(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str
) -> None:
    # Prints a line every 0.5 s for 2.5 s.
    script = "import time\nfor i in range(5):\n    print(i, flush=True)\n    time.sleep(0.5)\n"
    pods.create(namespace, pods.manifest("ticker", runner_node.pool, ["python", "-c", script]))
    pods.wait_phase(namespace, "ticker", ("Running",))
    stream = pods.core.read_namespaced_pod_log(
        "ticker", namespace, container="main", follow=True, _preload_content=False
    )

    first = stream.read(2)
    # The first line arrived while the container still ran: it was streamed, not collected.
    assert (first, pods.read(namespace, "ticker").status.phase) == (b"0\n", "Running")
    # The rest, and the end of the stream when the container exits.
    assert first + stream.read() == b"0\n1\n2\n3\n4\n"
    assert pods.read(namespace, "ticker").status.phase == "Succeeded"


def test_failing_init_container_fails_the_pod_and_the_app_container_never_runs(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str
) -> None:
    failing = "print('init giving up'); raise SystemExit(7)"
    init = _container("check", failing, "1")
    main_script = "open('/work/main-ran', 'w').write('yes')"
    manifest = _init_pod(pods, "blocked", runner_node.pool, [init])
    manifest["spec"]["containers"][0]["command"] = ["python", "-c", main_script]
    pods.create(namespace, manifest)

    pod = pods.wait_phase(namespace, "blocked", ("Succeeded", "Failed"))
    assert pod.status.phase == "Failed"
    (status,) = pod.status.init_container_statuses
    assert (status.state.terminated.exit_code, status.state.terminated.reason) == (7, "Error")
    # API docs, PodStatus.initContainerStatuses / kubelet: the app container stays
    # "waiting: PodInitializing" and Initialized is False with ContainersNotInitialized.
    assert pod.status.container_statuses[0].state.waiting.reason == "PodInitializing"
    initialized = _condition(pod, "Initialized")
    assert (initialized.status, initialized.reason) == ("False", "ContainersNotInitialized")
    assert initialized.message == "containers with incomplete status: [check]"
    assert not (runner.pod_dir(namespace, "blocked") / "volumes" / "work" / "main-ran").exists()
    read = pods.core.read_namespaced_pod_log
    assert read("blocked", namespace, container="check") == "init giving up\n"
    with pytest.raises(client.ApiException) as never_ran:
        read("blocked", namespace, container="main")
    assert never_ran.value.status == 400
    assert "is waiting to start: PodInitializing" in never_ran.value.body


# Fails on its first run, succeeds on the second: the emptyDir keeps the count.
_FLAKY_INIT = """
import os
count = int(open("/work/runs").read()) + 1 if os.path.exists("/work/runs") else 1
open("/work/runs", "w").write(str(count))
print(f"init run {count}")
raise SystemExit(0 if count > 1 else 3)
"""


def test_failing_init_container_is_restarted_under_on_failure(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str
) -> None:
    manifest = _init_pod(pods, "retried", runner_node.pool, [_container("flaky", _FLAKY_INIT, "1")])
    manifest["spec"]["restartPolicy"] = "OnFailure"
    manifest["spec"]["containers"][0]["command"] = ["python", "-c", "print('main')"]
    pods.create(namespace, manifest)

    pod = pods.wait_phase(namespace, "retried", ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded"
    (init,) = pod.status.init_container_statuses
    assert (init.restart_count, init.last_state.terminated.exit_code) == (1, 3)
    assert init.state.terminated.exit_code == 0
    read = pods.core.read_namespaced_pod_log
    assert read("retried", namespace, container="flaky") == "init run 2\n"
    assert read("retried", namespace, container="flaky", previous=True) == "init run 1\n"
    assert read("retried", namespace, container="main") == "main\n"


# Waits for the test to drop /work/go, so the test sees the pod while this one runs.
_GATE = """
import os, time
while not os.path.exists("/work/go"):
    time.sleep(0.05)
"""


def test_pod_is_pending_with_a_running_init_status_until_init_completes(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str
) -> None:
    gate, second = _container("gate", _GATE, "1"), _container("second", "print('second init')", "1")
    manifest = _init_pod(pods, "gated", runner_node.pool, [gate, second])
    manifest["spec"]["containers"][0]["command"] = ["python", "-c", "print('main')"]
    pods.create(namespace, manifest)

    def gate_running() -> Any:
        pod = pods.read(namespace, "gated")
        statuses = pod.status.init_container_statuses or []
        return pod if statuses and statuses[0].state.running else None

    pod = wait_for("the gate init container running", gate_running, 30.0)
    assert pod.status.phase == "Pending"
    gate_status, second_status = pod.status.init_container_statuses
    assert (gate_status.started, gate_status.ready) == (True, False)
    assert second_status.state.waiting.reason == "PodInitializing"
    assert pod.status.container_statuses[0].state.waiting.reason == "PodInitializing"
    initialized = _condition(pod, "Initialized")
    assert (initialized.status, initialized.message) == (
        "False",
        "containers with incomplete status: [gate second]",
    )

    (runner.pod_dir(namespace, "gated") / "volumes" / "work" / "go").write_text("")
    pod = pods.wait_phase(namespace, "gated", ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded"
    read = pods.core.read_namespaced_pod_log
    assert read("gated", namespace, container="second") == "second init\n"
    assert read("gated", namespace, container="main") == "main\n"


def test_job_controller_completes_a_job_whose_pod_the_runner_ran(
    runner: PodRunner, runner_node: RunnerNode, pods: Pods, namespace: str, k8s_api: Any
) -> None:
    # The shape of a profiling Job: init container writes results, `report` prints them.
    template = _init_pod(pods, "unused", runner_node.pool, [_container("profiler", _INIT, "1")])
    spec = template["spec"]
    spec["containers"][0]["name"] = "report"
    spec["containers"][0]["command"] = ["python", "-c", "print(open('/work/msg').read())"]
    job_name = f"prof-{uuid.uuid4().hex[:6]}"
    batch = client.BatchV1Api(k8s_api)
    batch.create_namespaced_job(
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": job_name},
            "spec": {"backoffLimit": 0, "template": {"metadata": {}, "spec": spec}},
        },
    )

    def complete() -> Any:
        job = batch.read_namespaced_job_status(job_name, namespace)
        done = {c.type: c.status for c in job.status.conditions or ()}
        return job if done.get("Complete") == "True" or done.get("Failed") == "True" else None

    job = wait_for(f"job {job_name} finished", complete, 60.0)
    conditions = {c.type: c.status for c in job.status.conditions}
    assert conditions.get("Complete") == "True", conditions
    assert job.status.succeeded == 1
    (pod,) = pods.core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}").items
    assert pod.spec.node_name == runner_node.name
    log = pods.core.read_namespaced_pod_log(pod.metadata.name, namespace, container="report")
    assert log == "profiler saw cpus=1\n"
