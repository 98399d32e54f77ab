"""The pod runner's pure translation of a Pod: env, volumes, path and DNS rewriting, status.

No cluster: ConfigMaps and Secrets come from dicts. Expected values follow the Kubernetes
documentation of the kubelet's behaviour, quoted where it decides the answer.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, TypedDict

import pytest

from sailplan_dev.localcluster import podrunner_pod as podspec
from sailplan_dev.localcluster import podrunner_status as podstatus


class FakeSources:
    def __init__(
        self,
        config_maps: dict[str, dict[str, Any]] | None = None,
        secrets: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.config_maps = config_maps or {}
        self.secrets = secrets or {}

    def config_map(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.config_maps.get(name)

    def secret(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.secrets.get(name)

    def service_account_token(
        self, pod: Mapping[str, Any], audience: str | None, expiration_seconds: int
    ) -> str:
        return f"token-for-{pod['metadata']['name']}-{audience}"


def _pod(container: dict[str, Any], volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "w0",
            "namespace": "ns",
            "uid": "u-1",
            "labels": {"b": "2", "a": "1"},
            "annotations": {"note": 'say "hi"'},
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "main", "image": "img", **container}],
            "volumes": volumes or [],
        },
    }


def test_env_order_expansion_and_sources() -> None:
    sources = FakeSources(
        config_maps={"cm": {"data": {"A": "from-cm", "K": "v"}}},
        secrets={"s": {"data": {"pw": base64.b64encode(b"hunter2").decode()}}},
    )
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            # Documented: $(VAR) refers to variables defined earlier; $$ escapes.
            {"name": "URL", "value": "http://$(NODE):1/$(LATER)/$$(NODE)"},
            {"name": "LATER", "value": "x"},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "K"}}},
            {
                "name": "MISSING_OK",
                "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k", "optional": True}},
            },
            {
                "name": "NOTE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}},
            },
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        ],
        "resources": {"limits": {"cpu": "1500m"}},
    }
    env = podspec.container_env(_pod(container), container, sources)
    assert env == {
        "CM_A": "from-cm",
        "CM_K": "v",
        "NODE": "node-1",
        "URL": "http://node-1:1/$(LATER)/$(NODE)",
        "LATER": "x",
        "PW": "hunter2",
        "K": "v",
        "NOTE": 'say "hi"',
        # Documented: cpu limits are rounded up to whole units of the divisor (1).
        "CPU": "2",
    }


def test_missing_configmap_key_is_a_config_error_the_kubelet_retries() -> None:
    container = {
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]
    }
    with pytest.raises(podspec.PodConfigError) as error:
        podspec.container_env(_pod(container), container, FakeSources())
    assert error.value.reason == "CreateContainerConfigError"


def test_volumes_configmap_items_downward_api_and_shared_claims() -> None:
    sources = FakeSources(config_maps={"plan": {"data": {"plan.json": "{}", "other": "o"}}})
    pod = _pod(
        {},
        [
            {
                "name": "plan",
                "configMap": {"name": "plan", "items": [{"key": "plan.json", "path": "p.json"}]},
            },
            {
                "name": "info",
                "downwardAPI": {
                    "items": [
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                    ]
                },
            },
            {"name": "ckpt", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "scratch", "emptyDir": {}},
        ],
    )
    plan, info, ckpt, scratch = podspec.render_volumes(pod, sources)
    assert plan.files == (podspec.VolumeFile("p.json", b"{}"),)  # only the listed key
    assert not plan.tracks_metadata
    assert info.tracks_metadata
    # Go's %q of each value, keys sorted.
    assert [f.content for f in info.files or ()] == [b'a="1"\nb="2"', b'note="say \\"hi\\""']
    assert (ckpt.files, ckpt.shared_key) == (None, "pvc/ns/data")
    assert (scratch.files, scratch.shared_key) == (None, None)


def test_metadata_changed_only_for_labels_and_annotations() -> None:
    pod = _pod({})
    assert not podspec.metadata_changed(pod, {**pod, "status": {"phase": "Running"}})
    changed = {**pod, "metadata": {**pod["metadata"], "annotations": {"note": "new"}}}
    assert podspec.metadata_changed(pod, changed)


def test_path_rewriter_replaces_whole_path_prefixes_in_one_pass() -> None:
    rewrite = podspec.path_rewriter({"/etc/podinfo": "/tmp/p/etc/podinfo", "/etc": "/tmp/e"})
    assert rewrite("--info=/etc/podinfo/annotations") == "--info=/tmp/p/etc/podinfo/annotations"
    # /etc/podinfo2 is not under /etc/podinfo (but is under /etc); /x/etc/podinfo is another
    # path; the replacement /tmp/p/etc/podinfo is not rewritten again.
    assert rewrite("/etc/podinfo2 /x/etc/podinfo /etc") == "/tmp/e/podinfo2 /x/etc/podinfo /tmp/e"


def test_localize_hosts() -> None:
    names = podspec.LocalNames(
        namespace="ns", services=frozenset({"job-workers"}), subdomain="job-workers"
    )
    cases = {
        "w0.job-workers.ns.svc": "127.0.0.1",
        "w0.job-workers.ns.svc.cluster.local": "127.0.0.1",
        "tcp://w0.job-workers.ns.svc:29500": "tcp://127.0.0.1:29500",
        "w0.job-workers": "127.0.0.1",  # hostname.subdomain
        "job-workers": "127.0.0.1",  # a Service of the namespace
        "job-workers:29500": "127.0.0.1:29500",
        "other.svc.example.com": "other.svc.example.com",
        "example.com": "example.com",
        "10.0.0.1": "10.0.0.1",
        # A lone word inside a longer value is left alone (it is more likely a path part).
        "/data/job-workers/x": "/data/job-workers/x",
        "/etc/plan/plan.json": "/etc/plan/plan.json",
    }
    assert {text: podspec.localize_hosts(text, names) for text in cases} == cases


def test_launch_uses_image_entrypoint_only_when_known() -> None:
    pod = _pod({"args": ["--steps", "$(STEPS)"], "env": [{"name": "STEPS", "value": "5"}]})
    with pytest.raises(podspec.PodConfigError):
        podspec.launch(pod, FakeSources(), {})
    launch = podspec.launch(pod, FakeSources(), {"img": ["sailplan-train"]})
    assert launch.argv == ("sailplan-train", "--steps", "5")


def _runs(*specs: tuple[str, bool, dict[str, Any]]) -> list[podstatus.ContainerRun]:
    return [podstatus.ContainerRun(name, "img", init, state) for name, init, state in specs]


class _Times(TypedDict, total=False):
    start_time: str
    now: str
    terminal: bool


_NOW: _Times = {"start_time": "t0", "now": "t1"}
_END: _Times = {"start_time": "t0", "now": "t1", "terminal": True}


def _done(code: int) -> dict[str, Any]:
    return podstatus.terminated_state(code, "t0", "t1", "c")


def test_terminal_status_phase_reason_and_disruption() -> None:
    pod = _pod({})
    ok = podstatus.pod_status(pod, _runs(("main", False, _done(0))), **_END)
    assert ok["phase"] == "Succeeded"
    assert ok["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    assert "initContainerStatuses" not in ok  # the pod has none
    disruption = podstatus.Disruption("TerminationByKubelet", "shutdown")
    preempted = podstatus.pod_status(
        pod, _runs(("main", False, _done(0))), disruption=disruption, **_END
    )
    assert preempted["phase"] == "Failed"  # a disrupted pod fails even if it exited cleanly
    assert {c["type"]: c.get("reason") for c in preempted["conditions"]}["DisruptionTarget"] == (
        "TerminationByKubelet"
    )
    failed = podstatus.pod_status(pod, _runs(("main", False, _done(3))), **_END)
    assert failed["containerStatuses"][0]["state"]["terminated"]["reason"] == "Error"
    assert failed["phase"] == "Failed"
    # Popen: -N means killed by signal N; the container runtime reports 128 + N.
    assert [podstatus.exit_code(c) for c in (0, 3, -15, -9)] == [0, 3, 143, 137]


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {
        c["type"]: (c["status"], c.get("reason", ""), c.get("message", ""))
        for c in status["conditions"]
    }


def test_init_phases_follow_the_kubelet() -> None:
    # Kubernetes docs (Init Containers): "the Pod's status is Pending with the Initialized
    # condition False while init containers run"; "if the Pod's restartPolicy is Never and
    # an init container fails, the overall Pod is treated as failed"; an init container is
    # ready once it completed successfully, the app container waits in PodInitializing.
    pod = _pod({})
    waiting = podstatus.waiting("PodInitializing")
    running = podstatus.running("t0")

    during = podstatus.pod_status(
        pod, _runs(("a", True, running), ("b", True, waiting), ("main", False, waiting)), **_NOW
    )
    assert during["phase"] == "Pending"
    assert _conditions(during)["Initialized"] == (
        "False",
        "ContainersNotInitialized",
        "containers with incomplete status: [a b]",
    )
    assert [(s["name"], s["started"], s["ready"]) for s in during["initContainerStatuses"]] == [
        ("a", True, False),
        ("b", False, False),
    ]

    after = podstatus.pod_status(
        pod, _runs(("a", True, _done(0)), ("b", True, _done(0)), ("main", False, running)), **_NOW
    )
    assert after["phase"] == "Running"
    assert [s["ready"] for s in after["initContainerStatuses"]] == [True, True]
    conditions = _conditions(after)
    assert (conditions["Initialized"][0], conditions["Ready"][0]) == ("True", "True")

    failed = podstatus.pod_status(
        pod, _runs(("a", True, _done(7)), ("main", False, waiting)), **_END
    )
    assert failed["phase"] == "Failed"
    assert failed["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert _conditions(failed)["Ready"][1] == "PodCompleted"


def test_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    pod = _pod({})
    running = _runs(("main", False, podstatus.running("t0")))
    first = podstatus.pod_status(pod, running, start_time="t0", now="t1")
    pod["status"] = first
    again = podstatus.pod_status(pod, running, start_time="t0", now="t2")
    done = podstatus.pod_status(
        pod, _runs(("main", False, _done(0))), start_time="t0", now="t3", terminal=True
    )
    times = {c["type"]: c["lastTransitionTime"] for c in again["conditions"]}
    assert times["Ready"] == "t1"  # still True: the transition was at t1
    assert {c["type"]: c["lastTransitionTime"] for c in done["conditions"]}["Ready"] == "t3"


def test_restarting_app_container_keeps_the_pod_running() -> None:
    # kubelet getPhase: a container waiting to be restarted (it has a last termination
    # state) counts as started, so the pod stays Running between restarts.
    pod = _pod({})
    (run,) = _runs(("main", False, podstatus.waiting("CrashLoopBackOff")))
    run.last_state, run.restarts = _done(5), 1
    status = podstatus.pod_status(pod, [run], start_time="t0", now="t1")
    assert status["phase"] == "Running"
    assert status["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 5


def test_run_order_is_init_containers_then_the_first_app_container() -> None:
    pod = _pod({})
    pod["spec"]["initContainers"] = [{"name": "i1"}, {"name": "i2"}]
    pod["spec"]["containers"].append({"name": "sidecar"})
    order = [(c["name"], init) for c, init in podspec.run_order(pod)]
    assert order == [("i1", True), ("i2", True), ("main", False)]


def test_launch_of_an_init_container_uses_its_own_env_and_resources() -> None:
    init = {
        "name": "prep",
        "image": "img",
        "command": ["prep", "$(WHO)"],
        "env": [
            {"name": "WHO", "value": "init"},
            {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        ],
        "resources": {"limits": {"cpu": "3"}},
    }
    pod = _pod({"command": ["main"], "resources": {"limits": {"cpu": "1"}}})
    launch = podspec.launch(pod, FakeSources(), {}, {"cpu": "48"}, container=init)
    assert (launch.container, launch.argv) == ("prep", ("prep", "init"))
    assert launch.env["CPUS"] == "3"  # the init container's limit, not the app container's
