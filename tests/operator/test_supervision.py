"""The operator's background tasks are supervised: one that dies fails Kopf's /healthz.

The probe is served by Kopf's own liveness endpoint code (the same coroutine `kopf.run`
starts for --health-port), so these tests pin down what a Kubernetes liveness probe sees.
"""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from typing import Any, cast

import kopf
from kopf._cogs.structs import ephemera
from kopf._core.engines import probing

from sailplan.operator.controller.supervision import Supervisor, register_liveness_probe


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None


async def _healthz(supervisor: Supervisor) -> tuple[int, Any]:
    """GET Kopf's liveness endpoint once, with the operator's probe registered."""
    registry = kopf.OperatorRegistry()
    register_liveness_probe(registry, supervisor)
    url = f"http://127.0.0.1:{_free_port()}/healthz"
    ready = asyncio.Event()
    server = asyncio.create_task(
        probing.health_reporter(
            url,
            memo=ephemera.AnyMemo(ephemera.Memo()),
            indices=cast(ephemera.Indices, {}),
            registry=registry,
            settings=kopf.OperatorSettings(),
            ready_flag=ready,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 10)
        return await asyncio.to_thread(_get, url)
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)


async def _forever() -> None:
    await asyncio.Event().wait()


def test_healthz_reports_each_task_running() -> None:
    async def scenario() -> tuple[int, Any]:
        supervisor = Supervisor()
        supervisor.spawn("queue-worker-0", _forever())
        supervisor.spawn("resync", _forever())
        try:
            return await _healthz(supervisor)
        finally:
            await supervisor.stop()

    status, body = asyncio.run(scenario())
    assert status == 200
    assert body == {"background-tasks": {"queue-worker-0": "running", "resync": "running"}}


def test_a_crashed_task_fails_healthz_and_is_named() -> None:
    async def scenario() -> tuple[int, list[str]]:
        supervisor = Supervisor()

        async def crash() -> None:
            raise RuntimeError("bug in the resync loop")

        supervisor.spawn("queue-worker-0", _forever())
        supervisor.spawn("resync", crash())
        await asyncio.sleep(0)  # let it crash
        try:
            status, _ = await _healthz(supervisor)
            return status, supervisor.dead()
        finally:
            await supervisor.stop()

    status, dead = asyncio.run(scenario())
    assert status == 500
    assert dead == ["resync"]


def test_a_task_cancelled_from_outside_fails_healthz() -> None:
    async def scenario() -> tuple[int, list[str]]:
        supervisor = Supervisor()
        supervisor.spawn("queue-worker-0", _forever())
        supervisor.spawn("queue-worker-1", _forever())
        await asyncio.sleep(0)
        for task in asyncio.all_tasks():
            if task.get_name() == "queue-worker-1":
                task.cancel()
        await asyncio.sleep(0)
        try:
            status, _ = await _healthz(supervisor)
            return status, supervisor.dead()
        finally:
            await supervisor.stop()

    status, dead = asyncio.run(scenario())
    assert status == 500
    assert dead == ["queue-worker-1"]
