"""The contract between the pods the operator renders and the trainer that runs in them.

The operator writes these environment variables, mounts and annotations; the trainer reads
them. Neither imports the other, so the names live here, beside the Plan they go with.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

# -- environment variables set on every worker container -----------------------------------
PLAN_PATH: Final = "SAILPLAN_PLAN_PATH"  # the mounted Plan JSON
PLAN_GENERATION: Final = "SAILPLAN_PLAN_GENERATION"  # increments on every replan
WORKER_INDEX: Final = "SAILPLAN_WORKER_INDEX"  # index into Plan.workers()
TRAINER_CONFIG_PATH: Final = "SAILPLAN_TRAINER_CONFIG_PATH"  # the mounted TrainerConfig JSON
MASTER_ADDR: Final = "MASTER_ADDR"  # torch.distributed rendezvous: worker 0's stable DNS name
MASTER_PORT: Final = "MASTER_PORT"
WORLD_SIZE: Final = "WORLD_SIZE"
POD_NAME: Final = "SAILPLAN_POD_NAME"  # downward API
POD_NAMESPACE: Final = "SAILPLAN_POD_NAMESPACE"  # downward API
PODINFO_DIR: Final = "SAILPLAN_PODINFO_DIR"  # downward API volume with the pod's annotations
METRICS_PORT: Final = "SAILPLAN_METRICS_PORT"  # Prometheus port of each worker; 0 disables
METRICS_PORT_NAME: Final = "metrics"  # the trainer container's port of that name

DEFAULT_PLAN_PATH: Final = "/etc/sailplan/plan/plan.json"
DEFAULT_TRAINER_CONFIG_PATH: Final = "/etc/sailplan/plan/trainer.json"
DEFAULT_PODINFO_DIR: Final = "/etc/podinfo"
DEFAULT_MASTER_PORT: Final = 29500
DEFAULT_METRICS_PORT: Final = 9400

# -- progress --------------------------------------------------------------------------------
# Gauges every worker's local rank 0 serves on METRICS_PORT (Prometheus text format). The
# operator reads worker 0's (global rank 0) at the pod's IP into TrainerProgress and the
# TrainingJob's status.progress; the trainer writes nothing to the API server.
METRIC_STEP: Final = "sailplan_trainer_step"  # completed steps; 0 before the first
METRIC_LOSS: Final = "sailplan_trainer_loss"
METRIC_SAMPLES_PER_SECOND: Final = "sailplan_trainer_samples_per_second"
METRIC_LAST_CHECKPOINT: Final = "sailplan_trainer_last_checkpoint_step"  # 0: none yet
# GPU energy of the last step summed over every rank's GPU (NVML total energy counters,
# sailplan.trainer.energy); served only once every rank measured a step.
METRIC_STEP_ENERGY: Final = "sailplan_trainer_step_energy_joules"
# Global rank 0 also keeps its latest TrainerProgress (JSON) in its container's termination
# message file, which the kubelet copies into the pod status when the trainer exits: the
# operator reads the final steps from there, after the endpoint is gone. The Kubernetes
# default path; TERMINATION_LOG overrides it (tests). Written only where the file exists.
TERMINATION_LOG: Final = "SAILPLAN_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"

# -- annotations -----------------------------------------------------------------------------
# The operator sets this on every worker to ask for a checkpoint at the next step boundary
# and a clean exit (a planned switch). The value is the plan generation being retired. The
# trainer sees it through the downward API volume (PODINFO_DIR/annotations).
CHECKPOINT_REQUEST_ANNOTATION: Final = "sailplan.dev/checkpoint-request"


class DataConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["synthetic", "token-file"] = "synthetic"
    path: str = Field(
        default="",
        description="token file (kind token-file): a path or fsspec URL (file://, gs:// with "
        "gcsfs installed, memory://); raw uint16/uint32 tokens, optional <path>.json sidecar",
    )
    seed: int = 0
    # 2 = double buffering: the next step is read while this one computes, with one more
    # step of slack for a slow request
    prefetch_steps: int = Field(
        default=2, ge=0, le=64, description="steps read ahead on a background thread; 0 = none"
    )


class TrainerConfig(BaseModel):
    """Training settings that are not part of the parallel plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(ge=1)
    learning_rate: float = Field(default=3e-4, gt=0)
    seed: int = 0
    data: DataConfig = DataConfig()
    checkpoint_dir: str = Field(min_length=1)
    checkpoint_interval_steps: int = Field(default=50, ge=1)
    checkpoints_to_keep: int = Field(default=2, ge=1)
    mixed_precision: bool = Field(default=False, description="bf16 autocast on CUDA")
    zero_stage: Literal[0, 1, 2] = Field(
        default=1,
        description="DeepSpeed ZeRO over each stage's DP replicas: 1 partitions the optimizer "
        "state, 2 also the gradients; 0 keeps everything on every replica",
    )


class TrainerProgress(BaseModel):
    """What rank 0 reports through its METRIC_* gauges.

    Unknown fields are ignored, not refused: a trainer image newer than the operator may
    report more, and an operator that refused the whole message would lose a finished job's
    final step (replan.triggers.final_progress)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    step: int
    loss: float | None = None
    samples_per_second: float | None = None
    last_checkpoint_step: int | None = None
    plan_generation: int = 0
    # GPU joules of the last step over all ranks (METRIC_STEP_ENERGY); None: not measured
    joules_per_step: float | None = None
