"""Which GPUs the kubelet gave each pod: a client of the kubelet's PodResources API.

The Kubernetes API does not say which GPU of a node a pod got; the kubelet does, on a gRPC
socket on the node (/var/lib/kubelet/pod-resources/kubelet.sock, service
`v1.PodResourcesLister`, method `List`). agent.py uses `PodResourcesDevices` as its device
source on real GPU nodes (__main__.py picks it unless --fake-nvml).

The reply is decoded here from protobuf's wire format rather than from generated code: the
agent reads four fields of it (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto),

    message ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    message PodResources { string name = 1; string namespace = 2;
                           repeated ContainerResources containers = 3; }
    message ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }
    message ContainerDevices { string resource_name = 1; repeated string device_ids = 2; ... }

and skips every other field, so newer kubelets' additions (CPU ids, memory, dynamic
resources) pass through. grpcio comes with the `nodeagent` extra and is imported lazily.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sailplan.operator.nodeagent.devices import GPU_RESOURCE

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"


class PodResourcesError(RuntimeError):
    """The kubelet's PodResources API could not be read (one line)."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise PodResourcesError("PodResources reply: truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, bytes | None]]:
    """(field number, bytes of a length-delimited field, else None) of one message."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, at = _varint(data, at)
            yield number, None
        elif wire == 1:
            at += 8
            yield number, None
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise PodResourcesError("PodResources reply: truncated field")
            yield number, data[at : at + size]
            at += size
        elif wire == 5:
            at += 4
            yield number, None
        else:
            raise PodResourcesError(f"PodResources reply: unknown wire type {wire}")
    if at != len(data):
        raise PodResourcesError("PodResources reply: truncated fixed-size field")


def parse_list_response(
    data: bytes, resource: str = GPU_RESOURCE
) -> dict[tuple[str, str], tuple[str, ...]]:
    """(namespace, pod name) -> the device IDs of `resource` its containers hold."""
    pods: dict[tuple[str, str], tuple[str, ...]] = {}
    for number, pod in _fields(data):
        if number != 1 or pod is None:
            continue
        name = namespace = ""
        devices: list[str] = []
        for field, value in _fields(pod):
            if value is None:
                continue
            if field == 1:
                name = value.decode()
            elif field == 2:
                namespace = value.decode()
            elif field == 3:
                for c_field, c_value in _fields(value):
                    if c_field != 2 or c_value is None:
                        continue
                    kind = ""
                    ids: list[str] = []
                    for d_field, d_value in _fields(c_value):
                        if d_field == 1 and d_value is not None:
                            kind = d_value.decode()
                        elif d_field == 2 and d_value is not None:
                            ids.append(d_value.decode())
                    if kind == resource:
                        devices.extend(ids)
        if devices:
            pods[(namespace, name)] = tuple(devices)
    return pods


class PodResourcesDevices:
    """agent.DeviceSource over the kubelet's socket."""

    def __init__(self, socket: str = SOCKET, timeout: float = 10.0) -> None:
        import grpc

        self._grpc: Any = grpc
        self.timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._list = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=lambda _request: b"",  # ListPodResourcesRequest is empty
            response_deserializer=lambda raw: raw,
        )

    def device_ids(self, pods: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
        try:
            raw = self._list(None, timeout=self.timeout)
        except self._grpc.RpcError as error:
            raise PodResourcesError(
                f"kubelet PodResources List: {error.code().name}: {error.details()}"
            ) from None
        by_name = parse_list_response(raw)
        found: dict[str, tuple[str, ...]] = {}
        for pod in pods:
            metadata = pod.get("metadata") or {}
            key = (str(metadata.get("namespace", "")), str(metadata.get("name", "")))
            if key in by_name:
                found[str(metadata.get("uid", ""))] = by_name[key]
        return found

    def close(self) -> None:
        self._channel.close()
