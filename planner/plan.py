"""The Plan: the planner's output, the operator's input, the trainer's input.

A Plan is a versioned JSON document (stored in a ConfigMap by the operator, mounted into
every worker). It fixes the pipeline stages with their layer ranges, each stage's
tensor-parallel degree and its data-parallel replicas (each replica names the pool, GPU type
and zone of one tensor-parallel group), the batch split, what the simulator predicted, and
what the plan was made from.

Rank layout, the one definition used by the operator and the trainer: workers are numbered
stage-major (stage 0 replica 0, stage 0 replica 1, ..., stage 1 replica 0, ...). A worker is
one tensor-parallel group on one node (one Pod); it holds `tensor_parallel` consecutive
global ranks. Replica `r` of every stage belongs to pipeline `r`, so all stages have the
same number of replicas (the data-parallel degree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sailplan.planner.modelspec import ModelSpec

PLAN_API_VERSION: Final = "sailplan.dev/v1alpha1"


class Replica(BaseModel):
    """One tensor-parallel group of a stage, placed on one node of one pool."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pool: str
    gpu_type: str
    zone: str


class Stage(BaseModel):
    """A contiguous range of layers `[layer_start, layer_end)` and where its replicas run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layer_start: int = Field(ge=0)
    layer_end: int = Field(gt=0)
    tensor_parallel: int = Field(default=1, ge=1)
    replicas: tuple[Replica, ...] = Field(min_length=1)
    recompute: Literal["none", "selective", "full"] = Field(
        default="none",
        description=(
            "activation recomputation: full = every layer keeps only its input per "
            "micro-batch and runs its forward again in the backward (torch.utils.checkpoint); "
            "selective = only the attention cores (QK^T, softmax, attention over V) are "
            "recomputed, the linear layers keep their activations (Megatron-LM's selective)"
        ),
    )
    optimizer_offload: bool = Field(
        default=False,
        description=(
            "fp32 master weights and Adam moments live in host memory and the update runs "
            "on the CPU (DeepSpeed ZeRO offload_optimizer, DeepSpeedCPUAdam)"
        ),
    )

    @model_validator(mode="after")
    def _non_empty(self) -> Stage:
        if self.layer_end <= self.layer_start:
            raise ValueError(f"stage layers [{self.layer_start}, {self.layer_end}) are empty")
        return self

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start


class StagePrediction(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    forward_backward_seconds: float = Field(description="one micro-batch, slowest replica")
    peak_memory_bytes: int = Field(description="largest over the stage's replicas")
    host_memory_bytes: int = Field(
        default=0, description="host memory per GPU under optimizer offload (0 without)"
    )


class StageClocks(BaseModel):
    """SM clocks of one stage's GPUs under a frequency plan (planner.energy), per replica."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steady_mhz: tuple[int, ...] = Field(
        description="clock of the steady-state forward/backward passes, one per replica (pipeline)"
    )
    fill_mhz: tuple[int, ...] = Field(
        description=(
            "clock of the warm-up/cool-down pass (first forward, last backward: on the "
            "critical path of every stage), one per replica"
        )
    )


class EnergyPrediction(BaseModel):
    """GPU energy of one iteration (planner.energy), at default clocks and at the frequency
    plan that does not slow the iteration down (Perseus' "no slowdown" point), or that
    slows it down by at most max_slowdown where the request allows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    joules_per_iteration_default: float = Field(description="every GPU at its maximum SM clock")
    joules_per_iteration: float = Field(description="with stage_clocks")
    iteration_seconds: float = Field(
        description="with stage_clocks: the default-clock time at no slowdown, at most "
        "(1 + max_slowdown) x it otherwise"
    )
    stage_clocks: tuple[StageClocks, ...] = ()
    source: Literal["datasheet", "measured"] = Field(
        default="datasheet",
        description="measured when every GPU type's power came from a PowerProfile",
    )
    max_slowdown: float = Field(
        default=0.0,
        ge=0.0,
        description="the slowdown the clocks were allowed (0 = Perseus' no-slowdown point)",
    )


class Predictions(BaseModel):
    """What the simulator expects of the plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    iteration_seconds: float
    samples_per_second: float
    stages: tuple[StagePrediction, ...]
    usd_per_iteration: float
    usd_per_hour: float
    egress_bytes_per_iteration: float
    pipeline_seconds: float = Field(default=0.0, description="1F1B forward/backward part")
    allreduce_seconds: float = Field(default=0.0, description="exposed gradient all-reduce")
    update_seconds: float = Field(default=0.0, description="optimizer step")
    energy_usd_per_iteration: float = Field(
        default=0.0,
        description="of usd_per_iteration: the GPUs' energy at default clocks in pools with "
        "an energy price (0 where none is priced)",
    )
    energy: EnergyPrediction | None = Field(
        default=None, description="GPU energy per iteration; None = not computed"
    )

    @property
    def peak_memory_bytes(self) -> int:
        return max(s.peak_memory_bytes for s in self.stages)


class ProfileRef(BaseModel):
    """One profile a plan was computed from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(description="e.g. compute/OPT-350M/A100-40/tp1/mbs4 or network/inter-zone")
    source: Literal["measured", "estimated"]
    version: str = ""


class PlanInputs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster_hash: str = ""
    profiles: tuple[ProfileRef, ...] = ()

    @property
    def estimated(self) -> tuple[str, ...]:
        return tuple(p.key for p in self.profiles if p.source == "estimated")


@dataclass(frozen=True)
class Worker:
    """One Pod: a tensor-parallel group of one stage replica."""

    index: int
    stage: int
    replica: int
    pool: str
    gpu_type: str
    zone: str
    tensor_parallel: int
    first_rank: int

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.tensor_parallel)


class Plan(BaseModel):
    """A complete parallel plan for one model on one cluster snapshot."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    api_version: Literal["sailplan.dev/v1alpha1"] = Field(
        default=PLAN_API_VERSION, alias="apiVersion"
    )
    kind: Literal["Plan"] = "Plan"
    model: ModelSpec
    optimizer: Literal["adam", "sgd"] = "adam"
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32",
        description=(
            "compute precision: forward and backward run under torch.autocast in bf16 or "
            "fp16 (fp16 with dynamic loss scaling); fp32 = no autocast"
        ),
    )
    half_parameters: bool = Field(
        default=False,
        description=(
            "with precision bf16 or fp16: parameters, gradients and stage-boundary tensors "
            "in that 16-bit type, the optimizer updating an fp32 master copy (DeepSpeed's "
            "and Megatron's bf16/fp16 mode: 2 + 2 + 12 bytes per parameter); False = fp32 "
            "parameters that are their own master copy. Ignored under fp32"
        ),
    )
    global_batch_size: int = Field(ge=1)
    micro_batch_size: int = Field(ge=1)
    num_micro_batches: int = Field(
        ge=1,
        description="per pipeline per iteration; with pipeline_micro_batches, the largest of them",
    )
    pipeline_micro_batches: tuple[int, ...] | None = Field(
        default=None,
        description=(
            "uneven data split (Metis' load balancer): micro-batches of each pipeline (one "
            "entry per data-parallel replica, pipeline r = replica r of every stage) when "
            "replicas of different speed get different shares of the global batch; None = "
            "every pipeline runs num_micro_batches"
        ),
    )
    stages: tuple[Stage, ...] = Field(min_length=1)
    predictions: Predictions | None = None
    inputs: PlanInputs = PlanInputs()
    reason: str = ""

    @property
    def parameter_dtype(self) -> Literal["fp32", "bf16", "fp16"]:
        """What the trainer keeps the parameters, gradients and boundary tensors in."""
        return self.precision if self.half_parameters else "fp32"

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        expected_start = 0
        for i, stage in enumerate(self.stages):
            if stage.layer_start != expected_start:
                raise ValueError(
                    f"stage {i} starts at layer {stage.layer_start}, expected {expected_start}: "
                    "stages must cover the layers contiguously"
                )
            expected_start = stage.layer_end
            problem = self.model.tensor_parallel_problem(stage.tensor_parallel)
            if problem is not None:
                raise ValueError(f"stage {i}: {problem}")
            if stage.optimizer_offload and self.optimizer != "adam":
                raise ValueError(
                    f"stage {i}: optimizer_offload runs DeepSpeed's CPU Adam; set optimizer "
                    "adam or optimizer_offload false"
                )
            if stage.recompute == "selective" and not self.model.is_transformer:
                raise ValueError(
                    f"stage {i}: selective recomputation recomputes attention, which "
                    f"{self.model.name} ({self.model.architecture}) does not have; set "
                    "recompute none or full"
                )
        if expected_start != self.model.num_layers:
            raise ValueError(
                f"stages cover layers [0, {expected_start}) but the model has "
                f"{self.model.num_layers} layers"
            )
        degrees = {len(s.replicas) for s in self.stages}
        if len(degrees) != 1:
            raise ValueError(
                f"every stage needs the same number of replicas (one per pipeline), got {sorted(degrees)}"
            )
        if self.pipeline_micro_batches is not None:
            counts = self.pipeline_micro_batches
            if len(counts) != self.data_parallel or min(counts) < 1:
                raise ValueError(
                    f"pipeline_micro_batches {list(counts)} needs one count >= 1 per pipeline "
                    f"(data_parallel {self.data_parallel})"
                )
            if max(counts) != self.num_micro_batches:
                raise ValueError(
                    f"num_micro_batches {self.num_micro_batches} must be the largest of "
                    f"pipeline_micro_batches {list(counts)}"
                )
            samples = self.micro_batch_size * sum(counts)
            if samples != self.global_batch_size:
                raise ValueError(
                    f"micro_batch_size {self.micro_batch_size} x sum(pipeline_micro_batches "
                    f"{list(counts)}) = {samples}, not global_batch_size {self.global_batch_size}"
                )
            return self
        samples = self.micro_batch_size * self.num_micro_batches * self.data_parallel
        if samples != self.global_batch_size:
            raise ValueError(
                f"micro_batch_size {self.micro_batch_size} x num_micro_batches "
                f"{self.num_micro_batches} x data_parallel {self.data_parallel} = {samples}, "
                f"not global_batch_size {self.global_batch_size}"
            )
        return self

    def micro_batches_of(self, pipeline: int) -> int:
        """Micro-batches pipeline `pipeline` (replica index) runs per iteration."""
        if self.pipeline_micro_batches is None:
            return self.num_micro_batches
        return self.pipeline_micro_batches[pipeline]

    def first_sample_of(self, pipeline: int) -> int:
        """Offset of the pipeline's first sample inside an iteration's global batch: pipeline
        r takes the samples after those of pipelines 0..r-1."""
        return self.micro_batch_size * sum(self.micro_batches_of(r) for r in range(pipeline))

    @property
    def data_parallel(self) -> int:
        return len(self.stages[0].replicas)

    @property
    def pipeline_depth(self) -> int:
        return len(self.stages)

    @property
    def world_size(self) -> int:
        return sum(s.tensor_parallel * len(s.replicas) for s in self.stages)

    def workers(self) -> list[Worker]:
        """Every worker Pod of the plan in rank order (see the module docstring)."""
        workers: list[Worker] = []
        rank = 0
        for stage_index, stage in enumerate(self.stages):
            for replica_index, replica in enumerate(stage.replicas):
                workers.append(
                    Worker(
                        index=len(workers),
                        stage=stage_index,
                        replica=replica_index,
                        pool=replica.pool,
                        gpu_type=replica.gpu_type,
                        zone=replica.zone,
                        tensor_parallel=stage.tensor_parallel,
                        first_rank=rank,
                    )
                )
                rank += stage.tensor_parallel
        return workers

    def gpus_by_pool(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for worker in self.workers():
            counts[worker.pool] = counts.get(worker.pool, 0) + worker.tensor_parallel
        return dict(sorted(counts.items()))

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        return cls.model_validate_json(text)
