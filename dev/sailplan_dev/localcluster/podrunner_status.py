"""The Pod status documents the e2e pod runner writes, as a kubelet would.

podrunner.py keeps one ContainerRun per container it runs (the init containers, then the
first app container) and, after each change, reports the whole pod through the status
subresource with pod_status: the phase (Pending while init containers run or a container
waits for its ConfigMap, Running once the app container started, Succeeded/Failed at the
end, Failed at once when an init container fails under restartPolicy Never), the
Initialized/ContainersReady/Ready conditions with the kubelet's reasons and messages,
`initContainerStatuses` and `containerStatuses`, plus the DisruptionTarget condition GKE's
kubelet adds when a spot VM is preempted (graceful node shutdown).

Pure: dicts for a strategic-merge patch of `status`, whose `conditions` merge by type
(PodScheduled, written by the scheduler, is kept) and whose container status lists are
replaced whole. A condition keeps its lastTransitionTime while its status stays the same,
so the pod's own history (not the runner's write rate) is what the timestamps show.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .podrunner_pod import POD_IP


@dataclass(frozen=True)
class Disruption:
    """Why the pod was stopped from outside (the DisruptionTarget condition)."""

    reason: str  # e.g. TerminationByKubelet
    message: str


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    """A container state: not started (yet, or again)."""
    body = {"reason": reason, **({"message": message} if message else {})}
    return {"waiting": body}


def running(started_at: str) -> dict[str, Any]:
    return {"running": {"startedAt": started_at}}


def terminated_state(
    exit_code: int, started_at: str, finished_at: str, container_id: str, message: str = ""
) -> dict[str, Any]:
    reason = "Completed" if exit_code == 0 else "Error"
    if exit_code == 128:
        reason = "StartError"
    state: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": started_at,
        "finishedAt": finished_at,
        "containerID": container_id,
    }
    if message:
        state["message"] = message
    return {"terminated": state}


@dataclass
class ContainerRun:
    """What the runner knows about one container of a pod (guarded by the pod's lock)."""

    name: str
    image: str
    init: bool
    # Before its turn, a container waits like the kubelet's: "PodInitializing".
    state: dict[str, Any] = field(default_factory=lambda: waiting("PodInitializing"))
    container_id: str = ""
    restarts: int = 0
    last_state: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int | None:
        """The exit code once terminated, else None."""
        terminated = self.state.get("terminated")
        return None if terminated is None else int(terminated["exitCode"])

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0

    @property
    def is_running(self) -> bool:
        return "running" in self.state


def container_runs(containers: Iterable[tuple[Mapping[str, Any], bool]]) -> list[ContainerRun]:
    """One fresh run per (container, is_init) of podrunner_pod.run_order."""
    return [
        ContainerRun(name=str(c.get("name", "")), image=str(c.get("image", "")), init=init)
        for c, init in containers
    ]


def container_status(run: ContainerRun) -> dict[str, Any]:
    """One entry of initContainerStatuses/containerStatuses.

    An init container is ready once it exited 0 (the kubelet's rule); an app container
    while it runs (no readiness probes here).
    """
    status: dict[str, Any] = {
        "name": run.name,
        "image": run.image,
        "imageID": "",
        "containerID": run.container_id,
        "restartCount": run.restarts,
        "ready": run.succeeded if run.init else run.is_running,
        "started": run.is_running,
        "state": dict(run.state),
    }
    if run.last_state:
        status["lastState"] = dict(run.last_state)
    return status


def phase(runs: Sequence[ContainerRun], *, terminal: bool, disrupted: bool) -> str:
    """The pod phase from its containers, after the kubelet's getPhase.

    `terminal`: the runner will start nothing more for this pod (it was deleted, disrupted,
    or its last container exited under a policy that does not restart it); the pod then
    succeeded only if every container ran and exited 0.
    """
    init = [r for r in runs if r.init]
    app = [r for r in runs if not r.init]
    if terminal or disrupted:
        every_one_ok = all(r.succeeded for r in runs)
        return "Succeeded" if every_one_ok and not disrupted else "Failed"
    if not all(r.succeeded for r in init):
        return "Pending"
    # A container waiting to be restarted has run before: the pod is Running, not Pending.
    started = [r for r in app if r.is_running or r.exit_code is not None or r.last_state]
    return "Running" if started else "Pending"


def _names(runs: Iterable[ContainerRun]) -> str:
    # Go's %s of a []string, as in the kubelet's messages: "[a b]".
    return "[" + " ".join(r.name for r in runs) + "]"


def _condition_bodies(
    runs: Sequence[ContainerRun], pod_phase: str
) -> list[tuple[str, bool, str, str]]:
    """(type, status, reason, message) of the conditions the kubelet owns."""
    incomplete = [r for r in runs if r.init and not r.succeeded]
    unready = [r for r in runs if not r.init and not r.is_running]
    done = pod_phase in ("Succeeded", "Failed")
    if not unready:
        ready_reason, ready_message = "", ""
    elif done:
        ready_reason, ready_message = "PodCompleted", ""
    else:
        ready_reason = "ContainersNotReady"
        ready_message = f"containers with unready status: {_names(unready)}"
    init_reason = "ContainersNotInitialized" if incomplete else ""
    init_message = f"containers with incomplete status: {_names(incomplete)}" if incomplete else ""
    return [
        ("PodReadyToStartContainers", not done, "", ""),
        ("Initialized", not incomplete, init_reason, init_message),
        ("Ready", not unready, ready_reason, ready_message),
        ("ContainersReady", not unready, ready_reason, ready_message),
    ]


def _transition_times(pod: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return {
        str(c.get("type")): (str(c.get("status")), str(c.get("lastTransitionTime", "")))
        for c in conditions
    }


def pod_status(
    pod: Mapping[str, Any],
    runs: Sequence[ContainerRun],
    *,
    start_time: str,
    now: str,
    terminal: bool = False,
    disruption: Disruption | None = None,
    pod_ip: str = POD_IP,
) -> dict[str, Any]:
    """The pod's status document (for a strategic-merge patch of `status`); `pod_ip` is the
    address the runner gave the pod (podrunner_net), the node's is 127.0.0.1."""
    pod_phase = phase(runs, terminal=terminal, disrupted=disruption is not None)
    previous = _transition_times(pod)
    conditions = []
    for kind, ok, reason, message in _condition_bodies(runs, pod_phase):
        status = str(ok)
        old_status, old_time = previous.get(kind, ("", ""))
        condition: dict[str, Any] = {
            "type": kind,
            "status": status,
            "lastTransitionTime": old_time if old_status == status and old_time else now,
        }
        if reason:
            condition["reason"] = reason
        if message:
            condition["message"] = message
        conditions.append(condition)
    document: dict[str, Any] = {
        "phase": pod_phase,
        "startTime": start_time,
        "hostIP": POD_IP,
        "hostIPs": [{"ip": POD_IP}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "conditions": conditions,
        "containerStatuses": [container_status(r) for r in runs if not r.init],
    }
    init = [container_status(r) for r in runs if r.init]
    if init:
        document["initContainerStatuses"] = init
    if disruption is not None:
        document["reason"] = "Terminated"
        document["message"] = disruption.message
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": disruption.reason,
                "message": disruption.message,
                "lastTransitionTime": now,
            }
        )
    return document


def exit_code(returncode: int) -> int:
    """A Popen returncode as a container exit code: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def restarts_after(pod: Mapping[str, Any], code: int) -> bool:
    policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
    return policy == "Always" or (policy == "OnFailure" and code != 0)
