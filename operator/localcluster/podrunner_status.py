"""The Pod status documents the e2e pod runner writes, as a kubelet would.

podrunner.py reports each pod it runs through the status subresource: Pending with a
waiting reason while its ConfigMaps/Secrets are missing, Running once the process started,
then Succeeded/Failed with the exit code, plus the DisruptionTarget condition GKE's kubelet
adds when a spot VM is preempted (graceful node shutdown). Pure: dicts for a strategic-merge
patch of `status`, whose `conditions` merge by type (PodScheduled, written by the scheduler,
is kept) and whose `containerStatuses` list is replaced whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .podrunner_pod import POD_IP, first_container


@dataclass(frozen=True)
class Disruption:
    """Why the pod was stopped from outside (the DisruptionTarget condition)."""

    reason: str  # e.g. TerminationByKubelet
    message: str


def _conditions(ready: bool, now: str, reason: str = "") -> list[dict[str, Any]]:
    extra = {"reason": reason} if reason else {}
    return [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now},
        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        {
            "type": "Ready",
            "status": str(ready),
            "lastTransitionTime": now,
            **extra,
        },
        {
            "type": "ContainersReady",
            "status": str(ready),
            "lastTransitionTime": now,
            **extra,
        },
    ]


def _addresses() -> dict[str, Any]:
    return {
        "hostIP": POD_IP,
        "hostIPs": [{"ip": POD_IP}],
        "podIP": POD_IP,
        "podIPs": [{"ip": POD_IP}],
    }


def _container_base(
    container: Mapping[str, Any], container_id: str, restarts: int
) -> dict[str, Any]:
    return {
        "name": container.get("name"),
        "image": container.get("image", ""),
        "imageID": "",
        "containerID": container_id,
        "restartCount": restarts,
    }


def waiting_status(
    pod: Mapping[str, Any], reason: str, message: str, start_time: str, now: str
) -> dict[str, Any]:
    container = first_container(pod)
    return {
        "phase": "Pending",
        "startTime": start_time,
        **_addresses(),
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {
                "type": "Ready",
                "status": "False",
                "reason": "ContainersNotReady",
                "lastTransitionTime": now,
            },
            {
                "type": "ContainersReady",
                "status": "False",
                "reason": "ContainersNotReady",
                "lastTransitionTime": now,
            },
        ],
        "containerStatuses": [
            {
                **_container_base(container, "", 0),
                "ready": False,
                "started": False,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ],
    }


def running_status(
    pod: Mapping[str, Any],
    *,
    container_id: str,
    started_at: str,
    start_time: str,
    restarts: int = 0,
    last_state: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    container = first_container(pod)
    status = {
        **_container_base(container, container_id, restarts),
        "ready": True,
        "started": True,
        "state": {"running": {"startedAt": started_at}},
    }
    if last_state:
        status["lastState"] = dict(last_state)
    return {
        "phase": "Running",
        "startTime": start_time,
        **_addresses(),
        "conditions": _conditions(True, started_at),
        "containerStatuses": [status],
    }


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


def terminated_status(
    pod: Mapping[str, Any],
    *,
    exit_code: int,
    container_id: str,
    started_at: str,
    finished_at: str,
    start_time: str,
    restarts: int = 0,
    message: str = "",
    disruption: Disruption | None = None,
    last_state: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The terminal status of a pod whose container exited and is not restarted (policy
    Never, OnFailure after exit 0, or a disruption); `last_state` is the previous run's."""
    container = first_container(pod)
    status: dict[str, Any] = {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "startTime": start_time,
        **_addresses(),
        "conditions": _conditions(False, finished_at, "PodCompleted"),
        "containerStatuses": [
            {
                **_container_base(container, container_id, restarts),
                "ready": False,
                "started": False,
                "state": terminated_state(
                    exit_code, started_at, finished_at, container_id, message
                ),
                **({"lastState": dict(last_state)} if last_state else {}),
            }
        ],
    }
    if disruption is not None:
        status["phase"] = "Failed"
        status["reason"] = "Terminated"
        status["message"] = disruption.message
        status["conditions"].append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": disruption.reason,
                "message": disruption.message,
                "lastTransitionTime": finished_at,
            }
        )
    return status


def exit_code(returncode: int) -> int:
    """A Popen returncode as a container exit code: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def restarts_after(pod: Mapping[str, Any], code: int) -> bool:
    policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
    return policy == "Always" or (policy == "OnFailure" and code != 0)
