"""Which GPUs each pod on the node was given: the device sources the agent can use.

The kubelet knows which GPU the device plugin handed to which container (the PodResources
API, a gRPC socket on the node); the Kubernetes API does not. The agent takes the mapping
through `DeviceSource` so its loop is tested with a mapping given by the test:

- `StaticDevices`: a fixed pod uid -> device IDs mapping (tests);
- `FakeAllocator`: what a device plugin does on a node of fake GPUs (`--fake-nvml`): each
  pod that requests `nvidia.com/gpu` gets the lowest free indices, kept while it exists.

`resolve` turns device IDs into NVML indices: a GPU UUID (`GPU-...`, the NVIDIA device
plugin's IDs), `nvidiaN` (GKE's device plugin names the device node /dev/nvidiaN, N =
the minor number, which NVML numbers the same way on GKE's single-driver nodes) or a plain
index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sailplan.operator.nodeagent.nvml import NVML, NVMLError

GPU_RESOURCE = "nvidia.com/gpu"


class DeviceSource(Protocol):
    def device_ids(self, pods: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
        """Pod uid -> the device IDs of the GPUs its containers were allocated."""
        ...


class StaticDevices:
    def __init__(self, mapping: Mapping[str, Sequence[str]]) -> None:
        self.mapping = {uid: tuple(ids) for uid, ids in mapping.items()}

    def device_ids(self, pods: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
        return dict(self.mapping)


def gpu_request(pod: Mapping[str, Any]) -> int:
    """GPUs a pod's containers ask for (limits, which is where extended resources live)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or ():
        limits = (container.get("resources") or {}).get("limits") or {}
        try:
            total += int(str(limits.get(GPU_RESOURCE, 0)))
        except ValueError:
            continue
    return total


class FakeAllocator:
    """Device plugin play for fake GPUs: lowest free indices, first come, kept per pod."""

    def __init__(self, gpu_count: int) -> None:
        self.gpu_count = gpu_count
        self._given: dict[str, tuple[int, ...]] = {}

    def device_ids(self, pods: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
        present = {}
        for pod in pods:
            metadata = pod.get("metadata") or {}
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                continue  # a finished pod's devices go back to the plugin
            present[str(metadata.get("uid", ""))] = (
                str(metadata.get("creationTimestamp", "")),
                pod,
            )
        self._given = {uid: gpus for uid, gpus in self._given.items() if uid in present}
        for uid, (_, pod) in sorted(present.items(), key=lambda item: item[1][0]):
            wanted = gpu_request(pod)
            if uid in self._given or wanted == 0:
                continue
            taken = {i for gpus in self._given.values() for i in gpus}
            free = [i for i in range(self.gpu_count) if i not in taken]
            if len(free) >= wanted:
                self._given[uid] = tuple(free[:wanted])
        return {uid: tuple(str(i) for i in gpus) for uid, gpus in self._given.items()}


def resolve(device_id: str, nvml: NVML) -> int | None:
    """The NVML index of a device ID, None if this node has no such GPU."""
    if device_id.startswith(("GPU-", "MIG-")):
        try:
            return nvml.index_of_uuid(device_id)
        except NVMLError:
            return None
    digits = device_id.removeprefix("nvidia")
    if digits.isdigit() and int(digits) < nvml.device_count():
        return int(digits)
    return None
