"""The fake GPU nodes of the local cluster: the node-file format and the Node objects it makes.

Tests, `sailplan cluster up` and the operator's scale benchmark describe a cluster as GKE node
pools (GPU type, zones, nodes per zone, spot or not); this module turns that into Node objects
labelled, tainted and sized exactly like GKE GPU nodes, so the operator under test sees what
it would see on GKE. Pure: no I/O besides reading a node file, no Kubernetes client (the
LocalCluster creates the objects through the API).

kwok only manages nodes carrying MANAGER_LABEL=MANAGER_KWOK (kwok's
--manage-nodes-with-label-selector). A label rather than an annotation so that `kubectl get
nodes -l` shows who plays a node's kubelet; an e2e runner takes a node over by setting another
value (it then owns the node's heartbeat and pod status).
"""

from __future__ import annotations

import random
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sailplan.planner.cluster import region_of

MANAGER_LABEL = "sailplan.dev/node-agent"
MANAGER_KWOK = "kwok"

NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
SPOT_LABEL = "cloud.google.com/gke-spot"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
GPU_RESOURCE = "nvidia.com/gpu"
# What GKE puts on every GPU node, so only pods that tolerate it land there.
GPU_TAINT: dict[str, str] = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}

DEFAULT_NODE_FILE = "gke-default.yaml"


class NodeFileError(ValueError):
    """The node file is missing, not YAML, or not in the documented format."""


class NodePool(BaseModel):
    """One GKE node pool; the format is documented at the top of data/gke-default.yaml."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    accelerator: str | None = None
    gpus_per_node: int = Field(default=0, ge=0)
    machine_type: str = Field(min_length=1)
    cpu: str = "8"
    memory: str = "32Gi"
    pods: int = Field(default=110, ge=1)
    spot: bool = False
    zones: dict[str, int] = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("zones")
    @classmethod
    def _non_negative(cls, zones: dict[str, int]) -> dict[str, int]:
        bad = [z for z, n in zones.items() if n < 0]
        if bad:
            raise ValueError(f"negative node count in zones {bad}")
        return zones

    @model_validator(mode="after")
    def _gpus_need_accelerator(self) -> NodePool:
        if (self.accelerator is None) != (self.gpus_per_node == 0):
            raise ValueError("set both accelerator and gpus_per_node, or neither")
        return self


class NodeFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: tuple[NodePool, ...] = Field(min_length=1)

    @field_validator("pools")
    @classmethod
    def _unique(cls, pools: tuple[NodePool, ...]) -> tuple[NodePool, ...]:
        names = [p.name for p in pools]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"pool names must be unique, repeated: {', '.join(repeated)}")
        return pools

    @property
    def node_count(self) -> int:
        return sum(n for p in self.pools for n in p.zones.values())


def load_node_file(path: Path | None = None) -> NodeFile:
    """The given node file, or the packaged default GKE-like cluster."""
    try:
        if path is None:
            text = resources.files(__package__).joinpath("data", DEFAULT_NODE_FILE).read_text()
        else:
            text = Path(path).read_text()
        return NodeFile.model_validate(yaml.safe_load(text))
    except OSError as error:
        raise NodeFileError(f"cannot read node file {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "parse error"
        raise NodeFileError(f"node file {path} is not valid YAML{where}: {problem}") from error
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise NodeFileError(f"node file {path}: {where}: {first['msg']}") from error


def node_name(pool: str, zone: str, index: int) -> str:
    return f"{pool}-{zone}-{index}"


def node_manifest(pool: NodePool, zone: str, index: int) -> dict[str, Any]:
    """The Node object of one node of `pool` in `zone` (with status, for kwok to keep)."""
    name = node_name(pool.name, zone, index)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        NODEPOOL_LABEL: pool.name,
        # GKE only labels spot nodes; "false" on the others lets a selector say NotIn/In.
        SPOT_LABEL: "true" if pool.spot else "false",
        ZONE_LABEL: zone,
        REGION_LABEL: region_of(zone),
        INSTANCE_TYPE_LABEL: pool.machine_type,
        MANAGER_LABEL: MANAGER_KWOK,
        **pool.labels,
    }
    resources_: dict[str, str] = {
        "cpu": pool.cpu,
        "memory": pool.memory,
        "pods": str(pool.pods),
        "ephemeral-storage": "100Gi",
    }
    taints: list[dict[str, str]] = []
    if pool.accelerator is not None:
        labels[ACCELERATOR_LABEL] = pool.accelerator
        resources_[GPU_RESOURCE] = str(pool.gpus_per_node)
        taints.append(dict(GPU_TAINT))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            # kwok's node stages keep the capacity/allocatable set here (they only fill in
            # defaults when absent).
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": taints} if taints else {},
        "status": {
            "capacity": dict(resources_),
            "allocatable": dict(resources_),
        },
    }


def node_manifests(node_file: NodeFile) -> list[dict[str, Any]]:
    """Every Node of the file, in file order (pool, then zone, then index): deterministic."""
    return [
        node_manifest(pool, zone, index)
        for pool in node_file.pools
        for zone, count in pool.zones.items()
        for index in range(count)
    ]


# (accelerator, gpus per node, machine type, cpu, memory) of the GKE GPU machine shapes the
# generator draws from; the accelerators are the catalog's GKE aliases.
_SHAPES: tuple[tuple[str, int, str, str, str], ...] = (
    ("nvidia-tesla-a100", 8, "a2-highgpu-8g", "96", "680Gi"),
    ("nvidia-a100-80gb", 4, "a2-ultragpu-4g", "48", "680Gi"),
    ("nvidia-h100-80gb", 8, "a3-highgpu-8g", "208", "1872Gi"),
    ("nvidia-tesla-v100", 4, "n1-standard-32", "32", "120Gi"),
    ("nvidia-l4", 4, "g2-standard-48", "48", "192Gi"),
)
_ZONES: tuple[str, ...] = (
    "us-central1-a",
    "us-central1-b",
    "us-central1-c",
    "us-east1-b",
    "us-west1-b",
    "europe-west4-a",
    "asia-east1-a",
)


def generate_node_file(nodes: int = 500, seed: int = 0) -> NodeFile:
    """A large fake GKE cluster of exactly `nodes` GPU nodes, for scale benchmarks.

    One on-demand and one spot pool per GPU shape, each spanning two to four zones; nodes are
    spread over the (pool, zone) cells by a seeded RNG so the same seed gives the same cluster.
    """
    if nodes < 1:
        raise ValueError("nodes must be >= 1")
    rng = random.Random(seed)
    cells: list[tuple[int, str]] = []  # (pool index, zone)
    specs: list[tuple[str, tuple[str, int, str, str, str], bool, list[str]]] = []
    for shape in _SHAPES:
        for spot in (False, True):
            zones = sorted(rng.sample(_ZONES, rng.randint(2, 4)))
            gpu = shape[0].removeprefix("nvidia-").removeprefix("tesla-")
            name = f"{gpu}-{'spot' if spot else 'ondemand'}"
            specs.append((name, shape, spot, zones))
            cells.extend((len(specs) - 1, z) for z in zones)
    counts = [0] * len(cells)
    for i in range(nodes):
        # The first pass gives every cell one node, the rest are random: no empty zones.
        counts[i if i < len(cells) else rng.randrange(len(cells))] += 1
    per_pool: list[dict[str, int]] = [{} for _ in specs]
    for (pool_index, zone), count in zip(cells, counts, strict=True):
        if count:
            per_pool[pool_index][zone] = count
    pools = [
        NodePool(
            name=name,
            accelerator=shape[0],
            gpus_per_node=shape[1],
            machine_type=shape[2],
            cpu=shape[3],
            memory=shape[4],
            spot=spot,
            zones=per_pool[i],
        )
        for i, (name, shape, spot, _zones) in enumerate(specs)
        if per_pool[i]
    ]
    return NodeFile(pools=tuple(pools))
