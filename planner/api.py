"""The planner's front door: one request in, a best plan (and alternatives) or a reason out.

The CLI (`sailplan plan`) and the operator call only this. It is pure: profiles, catalog
and cluster snapshot are passed in, nothing is read from disk or the network here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan
from sailplan.planner.precision import PrecisionChoice, resolve_precision
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator.context import (
    DEEPSPEED_PIPELINE_CONSTANTS,
    DEFAULT_CONSTANTS,
    DEFAULT_TRAINING,
    SimulatorConstants,
)
from sailplan.planner.simulator.memory import Precision, TrainingSetup

if TYPE_CHECKING:
    from sailplan.planner.catalog import Catalog


# The largest energy_max_slowdown accepted: on the datasheet power model the least-energy
# clock of a fully compute-bound stage, with no blocking power, is about 0.75 x the maximum
# (minimize ((1 - k) + k x^3) / x with k = SM_CLOCK_POWER_SHARE = 0.54: x^3 = (1 - k) / 2k),
# a slowdown of 1/0.75 - 1 = 0.33, past which the frontier saves nothing; 1.0 (twice the
# time) leaves room for measured power curves and refuses a percentage typed as a number
# (10 for 10%).
MAX_ENERGY_SLOWDOWN = 1.0


class Objective(BaseModel):
    """What "best" means.

    - `throughput`: maximize samples/s, optionally under a budget (USD/hour or USD/iteration).
    - `cost`: minimize USD per sample (equivalently per iteration at fixed global batch),
      optionally subject to a throughput floor.
    - `energy`: minimize GPU energy per iteration with each plan's per-stage clocks at its
      no-slowdown point (planner/energy), subject to a throughput floor, which it needs:
      without one the least energy is the slowest plan.
    Constraints apply to every kind.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["throughput", "cost", "energy"] = "throughput"
    min_samples_per_second: float | None = Field(default=None, gt=0)
    max_usd_per_hour: float | None = Field(default=None, gt=0)
    max_usd_per_iteration: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _energy_has_floor(self) -> Objective:
        if self.kind == "energy" and self.min_samples_per_second is None:
            raise ValueError(
                "the energy objective needs a throughput floor: set min_samples_per_second"
            )
        return self


Runtime = Literal["sailplan", "megatron-deepspeed"]
RUNTIME_CONSTANTS: dict[str, SimulatorConstants] = {
    "sailplan": DEFAULT_CONSTANTS,
    "megatron-deepspeed": DEEPSPEED_PIPELINE_CONSTANTS,
}


class PlanRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelSpec
    global_batch_size: int = Field(ge=1)
    optimizer: Literal["adam", "sgd"] = "adam"
    precision: PrecisionChoice = Field(
        default="fp32",
        description=(
            "auto = bf16 where every GPU type of the plan has it (catalog), else fp16 with "
            "loss scaling; or a fixed choice. The optimizer updates fp32 master weights "
            "either way"
        ),
    )
    half_parameters: bool = Field(
        default=True,
        description=(
            "with a 16-bit precision, keep parameters, gradients and stage-boundary tensors "
            "in it and an fp32 master copy in the optimizer (Plan.half_parameters; "
            "DeepSpeed's and Megatron's bf16/fp16 mode, 2 + 2 + 12 bytes per parameter); "
            "False = fp32 parameters under autocast (4 + 4 + 8). Ignored under fp32"
        ),
    )
    zero_stage: Literal[0, 1, 2] | None = Field(
        default=None,
        description=(
            "price memory and gradient traffic as the Sailplan trainer holds them at this ZeRO "
            "stage (TrainerConfig.zero_stage; simulator/memory.py); None = the layout the "
            "simulator's constants were fitted on (16 bytes per parameter, fp16 gradients)"
        ),
    )
    cluster: ClusterSnapshot
    objective: Objective = Objective()
    top_k: int = Field(default=3, ge=1, le=50)
    max_pipeline_depth: int | None = Field(default=None, ge=1)
    micro_batch_sizes: tuple[int, ...] | None = Field(
        default=None, description="restrict the micro-batch sizes searched; None = all that divide"
    )
    uneven_data_split: bool = Field(
        default=True,
        description=(
            "let pipelines on faster GPUs take more of the global batch (Plan."
            "pipeline_micro_batches; search/uneven.py); False = every pipeline runs the same "
            "count, for a runtime that cannot split unevenly. zero_stage 2 keeps it even"
        ),
    )
    energy_predictions: bool = Field(
        default=False,
        description=(
            "give every returned plan its GPU energy per iteration at default clocks and at "
            "its no-slowdown per-stage clocks (Predictions.energy), as the energy objective "
            "always does; needs power data for every GPU type of the cluster"
        ),
    )
    energy_max_slowdown: float = Field(
        default=0.0,
        ge=0.0,
        le=MAX_ENERGY_SLOWDOWN,
        description=(
            "a point on the time-energy frontier: energy predictions (and the energy "
            "objective's ranking) take the clocks with the least energy that keep the "
            "iteration within (1 + this) x its default-clock time, and within the throughput "
            "floor; 0 = Perseus' no-slowdown point"
        ),
    )
    # Off unless asked for (the CLI and the operator ask): without a deadline the search
    # with them takes longer. With a deadline it first runs the search without them and
    # keeps those plans (engine.Search._seed_without_options), so it has a plan as soon.
    memory_options: bool = Field(
        default=False,
        description=(
            "let the search give a stage that does not fit otherwise activation "
            "recomputation and/or optimizer offload to the CPU (Stage.recompute, "
            "Stage.optimizer_offload); False = plan without them"
        ),
    )
    runtime: Runtime = Field(
        default="sailplan",
        description=(
            "what will train the plan, so it is priced as that runtime runs it: sailplan = "
            "Sailplan's trainer (what the operator runs); megatron-deepspeed = DeepSpeed's "
            "pipeline engine as the Sailor runs used it (blocking sends, 5e8-element "
            "buckets, attention scores stored, so selective recomputation can pay)"
        ),
    )
    deadline_seconds: float | None = Field(
        default=None,
        gt=0,
        description=(
            "wall-clock budget of the search; when it runs out the search stops and returns "
            "the best plans found so far (Planned.exhaustive = False), or Infeasible with code "
            "SearchDeadline if it found none. None = search until the optimum is proven"
        ),
    )

    def constants(self) -> SimulatorConstants:
        """The simulator constants of the runtime that will train the plan."""
        return RUNTIME_CONSTANTS[self.runtime]

    def training_setup(self) -> TrainingSetup:
        """What each GPU holds (simulator/memory.py). bf16 and fp16 price alike, so "auto"
        is priced as 16-bit before the plan's GPU types are known."""
        if self.zero_stage is None:
            return DEFAULT_TRAINING
        precision: Precision = "fp32" if self.precision == "fp32" else "bf16"
        return TrainingSetup.trainer(
            zero_stage=self.zero_stage,
            precision=precision,
            half_parameters=self.half_parameters,
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
    exhaustive: bool = Field(
        default=True,
        description="False when the deadline stopped the search: the best plan found so far",
    )
    energy_lower_bound: float | None = Field(
        default=None,
        description=(
            "energy objective, exhaustive search: joules per iteration that no plan meeting "
            "the constraints goes below (planner/search/energy.py), so the best plan is "
            "within its energy minus this of the optimum; None otherwise"
        ),
    )


InfeasibleCode = Literal[
    "OutOfMemory",  # no placement fits in GPU memory
    "BelowThroughputFloor",  # plans fit but none reaches min_samples_per_second
    "OverBudget",  # plans fit but none is within the budget
    "NoProfile",  # a GPU type has neither a measured nor an estimable profile
    "NoCapacity",  # no ready GPUs usable for this model
    "SearchDeadline",  # the deadline ran out before any feasible plan was found
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


def _grid_for(request: PlanRequest) -> tuple[list[int], list[int]]:
    """TP degrees and micro-batch sizes worth estimating when nothing was measured.

    TP: every degree the model's heads split into that fits the largest node. Micro-batch:
    the divisors of the global batch up to 32 (a larger micro-batch of a sequence-length
    2048 model does not fit any GPU's memory, and the estimator would only be asked for
    points the memory check then rejects), or the request's own list.
    """
    largest_node = max(p.gpus_per_node for p in request.cluster.pools)
    tps = [t for t in range(1, largest_node + 1) if request.model.supports_tensor_parallel(t)]
    if request.micro_batch_sizes is not None:
        sizes = sorted(set(request.micro_batch_sizes))
    else:
        batch = request.global_batch_size
        sizes = [m for m in range(1, min(batch, _MAX_ESTIMATED_MICRO_BATCH) + 1) if batch % m == 0]
    return tps, sizes


_MAX_ESTIMATED_MICRO_BATCH = 32


def make_plan(
    request: PlanRequest,
    measured: ProfileSet | None = None,
    catalog: Catalog | None = None,
) -> PlanResult:
    """Best plan and alternatives for `request`: the entry point of the CLI and the operator.

    Profiles: a GPU type with measured compute profiles for the model is planned on its
    measured grid points only (a roofline guess at an unmeasured micro-batch size must not
    outbid measurements); a type with none gets estimates over the whole grid. Missing
    network profiles get catalog defaults. Each returned plan lists in `inputs.profiles`
    which of its inputs were estimated.
    """
    from sailplan.planner.catalog import default_catalog
    from sailplan.planner.profiles.estimate import complete_profiles
    from sailplan.planner.search import plan as search_plan

    catalog = catalog or default_catalog()
    measured = measured or ProfileSet()
    snapshot_hash = request.cluster.content_hash()
    known = set(catalog.gpu_names())
    unknown = sorted({p.gpu_type for p in request.cluster.pools if p.gpu_type not in known})
    if unknown:
        # memory size and link speeds come from the catalog: such pools cannot be planned
        pools = tuple(p for p in request.cluster.pools if p.gpu_type in known)
        if not any(p.gpus for p in pools):
            return Infeasible(
                code="NoProfile",
                reason=(
                    f"GPU type(s) {', '.join(unknown)} are not in the catalog (known: "
                    f"{', '.join(sorted(known))}); add them with a catalog file"
                ),
            )
        request = request.model_copy(
            update={"cluster": request.cluster.model_copy(update={"pools": pools})}
        )
    tps, sizes = _grid_for(request)
    unmeasured = [
        gpu
        for gpu in request.cluster.gpu_types
        if not measured.compute_grid(request.model.name, gpu)
    ]
    profiles = complete_profiles(
        request.model,
        unmeasured,
        tps,
        sizes,
        measured=measured,
        catalog=catalog,
        optimizer=request.optimizer,
    )
    # Network defaults for every GPU pair of the cluster (compute grid empty: nothing added).
    profiles = complete_profiles(
        request.model, request.cluster.gpu_types, [], [], measured=profiles, catalog=catalog
    )
    result = search_plan(request, profiles, catalog)
    if unknown and isinstance(result, Planned):
        # the plans were made from the snapshot the caller gave: keep its hash
        original = snapshot_hash

        def rehash(plan: Plan) -> Plan:
            inputs = plan.inputs.model_copy(update={"cluster_hash": original})
            return plan.model_copy(update={"inputs": inputs})

        result = result.model_copy(
            update={
                "best": rehash(result.best),
                "alternatives": tuple(rehash(p) for p in result.alternatives),
            }
        )
    if isinstance(result, Planned):

        def with_precision(plan: Plan) -> Plan:
            gpus = {r.gpu_type for stage in plan.stages for r in stage.replicas}
            chosen = resolve_precision(request.precision, gpus, catalog)
            half = request.half_parameters and chosen != "fp32"
            return plan.model_copy(update={"precision": chosen, "half_parameters": half})

        result = result.model_copy(
            update={
                "best": with_precision(result.best),
                "alternatives": tuple(with_precision(p) for p in result.alternatives),
            }
        )
    return result
