"""The kubelet PodResources client (operator/nodeagent/podresources.py) against a gRPC
server on a unix socket that answers what a kubelet answers: the reply is encoded here with
a protobuf wire-format encoder of the test's own, fields the agent does not read included.
The socket tests need grpcio: the `nodeagent` extra, and the dev `test` extra installs it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from sailplan.operator.nodeagent.podresources import (
    PodResourcesDevices,
    PodResourcesError,
    parse_list_response,
)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(number << 3 | 2) + varint(len(data)) + data


def devices(resource: str, *ids: str) -> bytes:
    topology = field(3, varint(1 << 3 | 0) + varint(1))  # TopologyInfo{nodes: [{ID: 1}]}
    return field(1, resource) + b"".join(field(2, i) for i in ids) + topology


def container(name: str, *device_sets: bytes) -> bytes:
    cpu_ids = field(3, varint(2) + varint(3))  # packed repeated int64 cpu_ids
    return field(1, name) + b"".join(field(2, d) for d in device_sets) + cpu_ids


def pod(namespace: str, name: str, *containers: bytes) -> bytes:
    return field(1, name) + field(2, namespace) + b"".join(field(3, c) for c in containers)


REPLY = b"".join(
    field(1, p)
    for p in (
        pod(
            "team-a",
            "opt-g1-a0-w0",
            container("trainer", devices("nvidia.com/gpu", "GPU-aaa", "GPU-bbb")),
            container("sidecar"),
        ),
        pod("data-science", "notebook", container("lab", devices("nvidia.com/gpu", "nvidia2"))),
        pod("kube-system", "fluentbit", container("fb", devices("example.com/nic", "eth1"))),
    )
)


def test_the_reply_gives_each_pods_gpus_and_skips_other_resources_and_fields() -> None:
    assert parse_list_response(REPLY) == {
        ("team-a", "opt-g1-a0-w0"): ("GPU-aaa", "GPU-bbb"),
        ("data-science", "notebook"): ("nvidia2",),
    }


def test_a_truncated_reply_is_one_line() -> None:
    with pytest.raises(PodResourcesError, match="truncated"):
        parse_list_response(REPLY[:-3])


@pytest.fixture
def kubelet_socket() -> Iterator[str]:
    import grpc

    folder = tempfile.mkdtemp(prefix="pr", dir="/tmp")  # a unix socket path is short
    path = str(Path(folder) / "kubelet.sock")
    calls: list[bytes] = []

    def list_pods(request: bytes, context: Any) -> bytes:
        calls.append(request)
        return REPLY

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(list_pods)}
            ),
        )
    )
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        yield path
    finally:
        server.stop(None)
        shutil.rmtree(folder)
    assert calls and all(c == b"" for c in calls)  # an empty ListPodResourcesRequest


def test_the_client_maps_the_kubelets_answer_to_pod_uids(kubelet_socket: str) -> None:
    source = PodResourcesDevices(kubelet_socket)
    try:
        found = source.device_ids(
            [
                {"metadata": {"namespace": "team-a", "name": "opt-g1-a0-w0", "uid": "u0"}},
                {"metadata": {"namespace": "data-science", "name": "notebook", "uid": "u1"}},
                {"metadata": {"namespace": "team-a", "name": "gone", "uid": "u2"}},
            ]
        )
    finally:
        source.close()
    assert found == {"u0": ("GPU-aaa", "GPU-bbb"), "u1": ("nvidia2",)}


def test_no_kubelet_is_one_line() -> None:
    source = PodResourcesDevices("/tmp/no-such-kubelet.sock", timeout=2.0)
    try:
        with pytest.raises(PodResourcesError, match="kubelet PodResources List: UNAVAILABLE"):
            source.device_ids([])
    finally:
        source.close()
