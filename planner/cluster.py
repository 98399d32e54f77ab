"""The cluster snapshot: which GPUs exist where, at what price.

A pool's `nodes` counts what the planner may place workers on: nodes ready now plus nodes
an autoscaled pool can still add (`obtainable_nodes`, which arrive after
`provisioning_seconds`); the planner counts both alike and the operator's replan decision
prices the wait. The planner never looks at Kubernetes. The operator builds a ClusterSnapshot from GPUPool
status, the CLI builds one from `--pool` flags or a cluster YAML, and both hand it to the
planner. Its content hash goes into every Plan so a plan can say what it was made from.
"""

from __future__ import annotations

import hashlib
import json
import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

_GCP_ZONE = re.compile(r"^(?P<region>[a-z]+-[a-z]+\d+)-[a-z]$")


def region_of(zone: str) -> str:
    """Region of a zone: GCP names (`us-central1-a` -> `us-central1`); other names are their own region."""
    match = _GCP_ZONE.match(zone)
    return match.group("region") if match else zone


class Pool(BaseModel):
    """A homogeneous group of GPU nodes in one zone (a GKE node pool, or its part in one zone)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    gpu_type: str = Field(min_length=1)
    zone: str = Field(min_length=1)
    region: str = ""
    gpus_per_node: int = Field(default=1, ge=1)
    nodes: int = Field(
        ge=0, description="nodes that can take workers: ready now, plus obtainable_nodes"
    )
    obtainable_nodes: int = Field(
        default=0,
        ge=0,
        description="of `nodes`, those the pool must add first (an autoscaled pool below its "
        "maximum); they take provisioning_seconds to arrive",
    )
    provisioning_seconds: float = Field(default=0.0, ge=0)
    spot: bool = False
    usd_per_gpu_hour: float | None = Field(
        default=None, ge=0, description="price override; None = catalog price for the region"
    )
    usd_per_kwh: float | None = Field(
        default=None,
        ge=0,
        description="price of the energy its GPUs draw; None = energy not priced (the "
        "cost objectives count GPU-hours and egress only)",
    )

    @model_validator(mode="after")
    def _default_region(self) -> Pool:
        if not self.region:
            object.__setattr__(self, "region", region_of(self.zone))
        return self

    @model_validator(mode="after")
    def _obtainable_within_nodes(self) -> Pool:
        if self.obtainable_nodes > self.nodes:
            raise ValueError("obtainable_nodes is part of nodes and cannot exceed it")
        return self

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def ready_nodes(self) -> int:
        """Nodes that exist now (a plan needing more waits provisioning_seconds)."""
        return self.nodes - self.obtainable_nodes


class ClusterSnapshot(BaseModel):
    """Every pool the planner may use plus optional egress price overrides."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: tuple[Pool, ...]
    egress_usd_per_gb: dict[str, dict[str, float]] | None = Field(
        default=None,
        description="zone -> zone -> USD/GB; None = catalog defaults by zone/region relation",
    )

    @model_validator(mode="after")
    def _unique_pool_names(self) -> ClusterSnapshot:
        names = [p.name for p in self.pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pool names must be unique, repeated: {', '.join(duplicates)}")
        return self

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool named {name!r}; pools: {', '.join(p.name for p in self.pools)}")

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({p.gpu_type for p in self.pools}))

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(sorted({p.zone for p in self.pools}))

    def content_hash(self) -> str:
        """Stable hash of what matters for planning (pool order does not matter)."""
        body = {
            # an unpriced pool hashes as it did before energy prices existed
            "pools": sorted(
                (
                    p.model_dump(
                        mode="json", exclude=None if p.usd_per_kwh is not None else {"usd_per_kwh"}
                    )
                    for p in self.pools
                ),
                key=lambda d: d["name"],
            ),
            "egress": self.egress_usd_per_gb,
        }
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return f"sha256:{digest[:16]}"
