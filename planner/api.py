"""The planner's front door: one request in, a best plan (and alternatives) or a reason out.

The CLI (`sailplan plan`) and the operator call only this. It is pure: profiles, catalog
and cluster snapshot are passed in, nothing is read from disk or the network here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan


class Objective(BaseModel):
    """What "best" means.

    - `throughput`: maximize samples/s, optionally under a budget (USD/hour or USD/iteration).
    - `cost`: minimize USD per sample (equivalently per iteration at fixed global batch),
      optionally subject to a throughput floor.
    Constraints apply to either kind.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["throughput", "cost"] = "throughput"
    min_samples_per_second: float | None = Field(default=None, gt=0)
    max_usd_per_hour: float | None = Field(default=None, gt=0)
    max_usd_per_iteration: float | None = Field(default=None, gt=0)


class PlanRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelSpec
    global_batch_size: int = Field(ge=1)
    optimizer: Literal["adam", "sgd"] = "adam"
    cluster: ClusterSnapshot
    objective: Objective = Objective()
    top_k: int = Field(default=3, ge=1, le=50)
    max_pipeline_depth: int | None = Field(default=None, ge=1)
    micro_batch_sizes: tuple[int, ...] | None = Field(
        default=None, description="restrict the micro-batch sizes searched; None = all that divide"
    )

    @model_validator(mode="after")
    def _has_gpus(self) -> PlanRequest:
        if not any(p.gpus for p in self.cluster.pools):
            raise ValueError("the cluster snapshot has no ready GPUs")
        return self


class Planned(BaseModel):
    """Success: the best plan first, then up to top_k - 1 alternatives, best to worst."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Literal["planned"] = "planned"
    best: Plan
    alternatives: tuple[Plan, ...] = ()
    plans_evaluated: int = 0
    search_seconds: float = 0.0


InfeasibleCode = Literal[
    "OutOfMemory",  # no placement fits in GPU memory
    "BelowThroughputFloor",  # plans fit but none reaches min_samples_per_second
    "OverBudget",  # plans fit but none is within the budget
    "NoProfile",  # a GPU type has neither a measured nor an estimable profile
    "NoCapacity",  # no ready GPUs usable for this model
]


class Infeasible(BaseModel):
    """No plan satisfies the request, and why, specifically enough to act on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Literal["infeasible"] = "infeasible"
    code: InfeasibleCode
    reason: str = Field(description="one line for a person: what failed and by how much")
    smallest_memory_shortfall_bytes: int | None = None
    best_samples_per_second: float | None = None
    cheapest_usd_per_hour: float | None = None


PlanResult = Planned | Infeasible
