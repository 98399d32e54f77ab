"""GKE accelerator machine types: the GPU type and GPU count a machine type fixes.

A GPUPool that can grow from zero has no node to read its shape from; its spec names the
machine type GKE would create (`a2-highgpu-4g`) instead of repeating the GPU type and
count. Machine types whose GPU count is chosen separately (N1 with V100 or T4) are not
here: such a pool gives spec.gpuType and spec.autoscaling.gpusPerNode. The GPUPool model
uses the names as the schema's enum; reconcile.gpupool resolves a pool's shape from it.
Source: cloud.google.com/compute/docs/gpus (A2, A3, G2 machine families).
"""

from __future__ import annotations

from typing import Final, NamedTuple


class MachineShape(NamedTuple):
    gpu_type: str  # a catalog GPU name
    gpus_per_node: int


MACHINE_SHAPES: Final[dict[str, MachineShape]] = {
    "a2-highgpu-1g": MachineShape("A100-40", 1),
    "a2-highgpu-2g": MachineShape("A100-40", 2),
    "a2-highgpu-4g": MachineShape("A100-40", 4),
    "a2-highgpu-8g": MachineShape("A100-40", 8),
    "a2-megagpu-16g": MachineShape("A100-40", 16),
    "a2-ultragpu-1g": MachineShape("A100-80", 1),
    "a2-ultragpu-2g": MachineShape("A100-80", 2),
    "a2-ultragpu-4g": MachineShape("A100-80", 4),
    "a2-ultragpu-8g": MachineShape("A100-80", 8),
    "a3-highgpu-8g": MachineShape("H100-80", 8),
    "a3-megagpu-8g": MachineShape("H100-80", 8),
    "a3-ultragpu-8g": MachineShape("H200-141", 8),
    "g2-standard-4": MachineShape("L4", 1),
    "g2-standard-8": MachineShape("L4", 1),
    "g2-standard-12": MachineShape("L4", 1),
    "g2-standard-16": MachineShape("L4", 1),
    "g2-standard-24": MachineShape("L4", 2),
    "g2-standard-32": MachineShape("L4", 1),
    "g2-standard-48": MachineShape("L4", 4),
    "g2-standard-96": MachineShape("L4", 8),
}
