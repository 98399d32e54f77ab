"""TrainingJob: train one model on the GPUPools the operator plans over (namespaced).

The spec says what to train (a catalog model or a custom shape), how (batch, steps,
optimizer), where it may run (pools), what "best" means (objective and constraints), with
what image and checkpoint storage, and how to react to failures and cluster changes; the
batch fields users of Job, JobSet and Kubeflow Trainer expect (suspend, managedBy, an
active deadline, a TTL after finishing) and pod template overrides for the worker pods,
whose pod fields use Kubernetes' own schemas (api.kubeschema). The status is the operator's account of it: phase, conditions with reasons, the current plan's
summary and generation, progress mirrored from rank 0, and the history of plans.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, ConfigDict, Field, JsonValue, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel

from sailplan.operator.api import kubeschema
from sailplan.operator.api.common import (
    DNS1123_SUBDOMAIN,
    GROUP,
    Conditions,
    KubeModel,
    LabelSelector,
    Quantity,
    StatusModel,
)
from sailplan.operator.api.memory import JobMemory
from sailplan.operator.replan import defaults
from sailplan.planner.api import MAX_ENERGY_SLOWDOWN
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.workerenv import DEFAULT_MASTER_PORT, DEFAULT_PODINFO_DIR

KIND: Final = "TrainingJob"
PLURAL: Final = "trainingjobs"

# A worker pod's name is `<job>-g<generation>-a<attempt>-w<index>` and doubles as its
# hostname (a DNS label, at most 63 characters); 40 leaves room for the suffix.
MAX_NAME_LENGTH: Final = 40

# spec.managedBy values this operator reconciles (unset means this one too); any other
# value hands the job to another controller (e.g. MultiKueue's) and the operator leaves it.
MANAGED_BY: Final = f"{GROUP}/operator"
MANAGED_BY_MAX_LENGTH: Final = 63  # batch/v1 Job's limit

# -- phases, condition types and reasons -----------------------------------------------------
Phase = Literal[
    "Pending",
    "Running",
    "Replanning",
    "Suspended",
    "Succeeded",
    "Failed",
    "Unschedulable",
    "Invalid",
]
PHASE_PENDING: Final = "Pending"
PHASE_RUNNING: Final = "Running"
PHASE_REPLANNING: Final = "Replanning"
PHASE_SUSPENDED: Final = "Suspended"  # spec.suspend: workers draining or gone
PHASE_SUCCEEDED: Final = "Succeeded"
PHASE_FAILED: Final = "Failed"
PHASE_UNSCHEDULABLE: Final = "Unschedulable"
PHASE_INVALID: Final = "Invalid"

# Positive-polarity types (True is good: Valid, Schedulable) are what tools should read; the
# negative Invalid and Unschedulable stay for the clients written against them, always the
# opposite status with the same reason. Complete is batch/v1 Job's name for success, so
# `kubectl wait --for=condition=Complete` works; Succeeded is kept beside it.
COND_VALID: Final = "Valid"
COND_INVALID: Final = "Invalid"
COND_PLANNED: Final = "Planned"
COND_SCHEDULABLE: Final = "Schedulable"
COND_UNSCHEDULABLE: Final = "Unschedulable"
COND_RUNNING: Final = "Running"
COND_REPLANNING: Final = "Replanning"
COND_COMPLETE: Final = "Complete"
COND_SUCCEEDED: Final = "Succeeded"
COND_FAILED: Final = "Failed"
COND_PROFILES_MEASURED: Final = "ProfilesMeasured"
COND_PLANNING: Final = "Planning"  # True while the planner searches for this job
# batch/v1 Job's name and reasons, so Kueue-aware tools read a suspended job the same way.
COND_SUSPENDED: Final = "Suspended"
# False while the current workers run without spec.podTemplateOverrides entries the plan's
# placement, GPU count or worker contract overruled (reconcile.overrides).
COND_OVERRIDES_APPLIED: Final = "OverridesApplied"

REASON_VALID: Final = "Valid"
REASON_UNKNOWN_MODEL: Final = "UnknownModel"
REASON_UNKNOWN_GPU_TYPE: Final = "UnknownGPUType"
REASON_INVALID_MODEL_SHAPE: Final = "InvalidModelShape"
REASON_INVALID_SPEC: Final = "InvalidSpec"
REASON_NO_POOLS: Final = "NoPools"
REASON_PLAN_CREATED: Final = "PlanCreated"
REASON_PLAN_ADOPTED: Final = "PlanAdopted"
REASON_AWAITING_PROFILES: Final = "AwaitingProfiles"
REASON_SCHEDULABLE: Final = "Schedulable"
REASON_PODS_PENDING: Final = "PodsPending"
REASON_ALL_RUNNING: Final = "AllWorkersRunning"
REASON_COMPLETED: Final = "Completed"
REASON_WORKER_FAILED: Final = "WorkerFailed"
REASON_RESTARTING: Final = "Restarting"
REASON_RESTARTS_EXHAUSTED: Final = "RestartsExhausted"
REASON_PREEMPTED: Final = "Preempted"
REASON_ALL_MEASURED: Final = "AllMeasured"
REASON_ESTIMATED: Final = "Estimated"
REASON_NOT_REPLANNING: Final = "Stable"
REASON_NO_CAPACITY: Final = "NoCapacity"
REASON_REPLANNING: Final = "Replanning"
REASON_POOL_MISSING: Final = "PoolMissing"
# Running=False: the API server refused to create worker pods (admission, quota, a
# priority class that does not exist); the message is the API server's.
REASON_POD_CREATE_FAILED: Final = "PodCreateFailed"
# Planning: why a search runs or how the last one ended.
REASON_SEARCHING: Final = "Searching"
REASON_PLAN_FOUND: Final = "PlanFound"
REASON_DEADLINE_BEST_PLAN: Final = "DeadlineReachedBestPlan"
REASON_INFEASIBLE: Final = "Infeasible"  # the message starts with the planner's code
REASON_SEARCH_FAILED: Final = "SearchFailed"
REASON_SEARCH_NOT_NEEDED: Final = "SearchNotNeeded"
# Suspended: workers checkpoint and exit, then none remain; False once resumed.
REASON_SUSPENDING: Final = "Suspending"
REASON_JOB_SUSPENDED: Final = "JobSuspended"
REASON_JOB_RESUMED: Final = "JobResumed"
REASON_SUSPENDED: Final = "Suspended"  # Running/Planned/Replanning while suspended
# Failed: spec.activeDeadlineSeconds passed (batch/v1 Job's reason).
REASON_DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
# OverridesApplied; OverridesIgnored is also the Warning Event's reason.
REASON_OVERRIDES_APPLIED: Final = "AllApplied"
REASON_OVERRIDES_IGNORED: Final = "OverridesIgnored"


# -- spec --------------------------------------------------------------------------------------
# CEL rules (x-kubernetes-validations) the CRD carries; see schema.py for where they go.
MODEL_RULES: Final[list[JsonValue]] = [
    {"rule": "has(self.name) != has(self.custom)", "message": "set exactly one of name and custom"},
]
IMMUTABLE_MODEL: Final[list[JsonValue]] = [
    {"rule": "self == oldSelf", "message": "model is immutable; create a new TrainingJob"},
]
STORAGE_RULES: Final[list[JsonValue]] = [
    {
        "rule": "has(self.persistentVolumeClaim) != has(self.uri)",
        "message": "set exactly one of persistentVolumeClaim and uri",
    },
]
IMMUTABLE_STORAGE: Final[list[JsonValue]] = [
    {
        "rule": "self == oldSelf",
        "message": "checkpoint storage is immutable: existing checkpoints live there",
    },
]
POOL_RULES: Final[list[JsonValue]] = [
    {
        "rule": "!(has(self.names) && has(self.selector))",
        "message": "set names or selector, not both",
    },
]
OBJECT_RULES: Final[list[JsonValue]] = [
    {
        "rule": f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters "
        "(worker pod hostnames are derived from it)",
    },
    # A transition rule at the root, where spec and status are both in view: suspending or
    # resuming a finished job would do nothing, so the API server refuses it, as batch/v1
    # refuses resuming a finished Job. Status writes leave spec.suspend as it was and pass.
    {
        "rule": "!has(oldSelf.status) || !has(oldSelf.status.phase) || "
        "!(oldSelf.status.phase in ['Succeeded', 'Failed']) || "
        "(has(self.spec.suspend) && self.spec.suspend) == "
        "(has(oldSelf.spec.suspend) && oldSelf.spec.suspend)",
        "message": "spec.suspend cannot change after the job Succeeded or Failed; "
        "create a new TrainingJob to train again",
        "fieldPath": ".spec.suspend",
    },
]


CUSTOM_MODEL_RULES: Final[list[JsonValue]] = [
    # ModelSpec's own validator, said to the API server so a bad shape is refused at apply.
    {
        "rule": "self.hiddenSize % self.numHeads == 0",
        "message": "hiddenSize must be divisible by numHeads",
    },
    {
        "rule": "!has(self.numKvHeads) || self.numHeads % self.numKvHeads == 0",
        "message": "numHeads must be a multiple of numKvHeads",
    },
]


class CustomModel(ModelSpec):
    """A model shape not in the catalog: the planner's ModelSpec fields, camelCase on the wire."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        json_schema_extra={"x-kubernetes-validations": CUSTOM_MODEL_RULES},
    )

    # Custom shapes are transformers: the fields a convnet leaves unset are required here,
    # so the CRD's schema and its CEL rule above always have them.
    hidden_size: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    sequence_length: int = Field(gt=0)

    def to_model_spec(self) -> ModelSpec:
        return ModelSpec.model_validate(self.model_dump())


class ModelRef(KubeModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": MODEL_RULES})

    name: str | None = Field(
        default=None, min_length=1, max_length=63, description="a model of the catalog"
    )
    custom: CustomModel | None = Field(default=None, description="a shape not in the catalog")


class DataSource(KubeModel):
    kind: Literal["synthetic", "token-file"] = "synthetic"
    path: str = Field(default="", max_length=1024, description="token file (kind token-file)")


class TrainingSettings(KubeModel):
    global_batch_size: int = Field(ge=1, le=1 << 20)
    sequence_length: int | None = Field(
        default=None, ge=1, le=1 << 20, description="unset = the model's"
    )
    steps: int = Field(ge=1)
    optimizer: Literal["adam", "sgd"] = "adam"
    learning_rate: float = Field(default=3e-4, gt=0, le=10)
    seed: int = Field(default=0, ge=0)
    mixed_precision: bool = Field(
        default=False,
        description="shorthand for precision: auto (kept for older manifests); "
        "precision wins when both are set",
    )
    precision: Literal["auto", "bf16", "fp16", "fp32"] | None = Field(
        default=None,
        description="auto = bf16 where every GPU type of the plan has it, else fp16 with "
        "dynamic loss scaling; in bf16 and fp16 the parameters and gradients are 16-bit and "
        "the optimizer keeps fp32 master weights and state (DeepSpeed's and Megatron's "
        "default). Unset = fp32, or auto with mixedPrecision",
    )
    zero_stage: Literal[0, 1, 2] = Field(
        default=1,
        description="DeepSpeed ZeRO over each stage's data-parallel replicas: 1 partitions the "
        "optimizer state, 2 the gradients too, 0 neither; the planner prices each GPU's "
        "memory as the trainer then holds it",
    )
    data: DataSource = DataSource()

    def precision_choice(self) -> Literal["auto", "bf16", "fp16", "fp32"]:
        """What the planner and the trainer run: the field, else mixedPrecision's auto."""
        if self.precision is not None:
            return self.precision
        return "auto" if self.mixed_precision else "fp32"


PoolName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)]


class PoolSelection(KubeModel):
    """Which GPUPools the job may use; neither field set means every pool."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": POOL_RULES})

    names: tuple[PoolName, ...] | None = Field(default=None, min_length=1, max_length=64)
    selector: LabelSelector | None = Field(default=None, description="on the GPUPools' labels")


ENERGY_OBJECTIVE_RULES: Final[list[JsonValue]] = [
    {
        # has(self.kind): the API server checks the rule on the field's default ({}) too,
        # before kind's own default fills it in
        "rule": "!has(self.kind) || self.kind != 'Energy' || has(self.minSamplesPerSecond)",
        "message": "kind Energy needs minSamplesPerSecond: without a throughput floor the "
        "least energy is the slowest plan",
    },
]


class ObjectiveSpec(KubeModel):
    """What "best" means (planner Objective) plus search limits. Energy: the least GPU
    energy per iteration, with each plan's no-slowdown SM clocks, among plans that reach
    minSamplesPerSecond (required)."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": ENERGY_OBJECTIVE_RULES}
    )

    kind: Literal["Throughput", "Cost", "Energy"] = "Throughput"
    min_samples_per_second: float | None = Field(default=None, gt=0)
    max_usd_per_hour: float | None = Field(default=None, gt=0)
    max_usd_per_iteration: float | None = Field(default=None, gt=0)
    max_pipeline_depth: int | None = Field(default=None, ge=1, le=1024)

    @model_validator(mode="after")
    def _energy_has_floor(self) -> ObjectiveSpec:
        if self.kind == "Energy" and self.min_samples_per_second is None:
            raise ValueError("objective.kind Energy needs objective.minSamplesPerSecond")
        return self


# The annotation that opted a job into clocks before spec.energy.clocks (still honoured by
# the node agent and the operator, deprecated).
ENERGY_CLOCKS_ANNOTATION: Final = f"{GROUP}/energy-clocks"


class EnergySpec(KubeModel):
    """GPU clocks of the job's workers. NoSlowdown: the node agent (a DaemonSet) locks each
    worker's GPUs to its stage's SM clock at the plan's no-slowdown point (Perseus: stages
    off the critical path slow down just enough to keep up), which the plan carries
    (predictions.energy.stageClocks); Default: the agent leaves the clocks alone.
    maxSlowdown trades time for energy: the plan's clocks (and the Energy objective's
    ranking) become the least energy with the iteration at most (1 + maxSlowdown) x as
    long, and no slower than objective.minSamplesPerSecond."""

    clocks: Literal["Default", "NoSlowdown"] = "Default"
    max_slowdown: float = Field(
        default=0.0,
        ge=0.0,
        le=MAX_ENERGY_SLOWDOWN,
        description="a point on the time-energy frontier, as a fraction of the iteration "
        f"time (0 to {MAX_ENERGY_SLOWDOWN:g}; 0.05 = at most 5% slower): the clocks the "
        "plan carries save the most energy within it; 0 = Perseus' no-slowdown point. "
        "Used where the job plans with energy (objective Energy or clocks NoSlowdown)",
    )


class TrainerSpec(KubeModel):
    image: str = Field(min_length=1, max_length=512)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    command: tuple[Annotated[str, Field(max_length=1024)], ...] = Field(
        default=("sailplan-train",), min_length=1, max_length=64
    )
    cpu: Quantity = "4"
    memory: Quantity = "16Gi"
    master_port: int = Field(default=DEFAULT_MASTER_PORT, ge=1024, le=65535)
    service_account_name: str | None = Field(
        default=None, max_length=253, pattern=DNS1123_SUBDOMAIN
    )


class PVCStorage(KubeModel):
    claim_name: str = Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)
    sub_path: str = Field(
        default="", max_length=1024, pattern=r"^[^/].*$|^$", description="relative directory"
    )


class CheckpointStorage(KubeModel):
    """Where checkpoints live: a PersistentVolumeClaim, or a URI/path the trainer opens itself."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": STORAGE_RULES})

    persistent_volume_claim: PVCStorage | None = None
    uri: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        pattern=r"^([a-z][a-z0-9+.-]*://.+|/.+)$",
        description="fsspec URI (gs://bucket/prefix) or a path mounted into the image",
    )


class CheckpointSpec(KubeModel):
    storage: CheckpointStorage = Field(
        json_schema_extra={"x-kubernetes-validations": IMMUTABLE_STORAGE}
    )
    interval_steps: int = Field(default=50, ge=1)
    keep: int = Field(default=2, ge=1, le=100)


# The class docstrings below are the CRD's descriptions (kubectl explain): user-facing text.
# Unset optional fields take replan.defaults; replan.decision.effective_config applies them.
class ReplanPolicy(KubeModel):
    """When a cluster change is worth switching plans, and how a planned switch runs. Unset
    optional fields take the operator's defaults, quoted in each field's description."""

    min_predicted_gain: float = Field(
        default=0.1, ge=0, le=10, description="replan only if samples/s improves by this fraction"
    )
    cooldown_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="after a switch, voluntary switches wait this long; lost capacity, "
        "failures and objective edits do not",
    )
    horizon_seconds: int | None = Field(
        default=None,
        ge=60,
        le=30 * 86400,
        description="how long a new plan is expected to run when a voluntary switch weighs "
        "its gain against the restart cost: the work judged is what is left, but at most "
        "this long at the current plan's speed; a longer horizon accepts smaller gains. "
        f"Unset: {defaults.HORIZON_SECONDS} ({defaults.HORIZON_SECONDS // 3600} h)",
    )
    drain_timeout_seconds: int | None = Field(
        default=None,
        ge=10,
        le=86400,
        description="how long a planned switch waits for the workers to checkpoint and exit "
        "before deleting them (steps since the last complete checkpoint are then lost). "
        f"Unset: {defaults.DRAIN_TIMEOUT_SECONDS}",
    )
    checkpoint_bandwidth_bytes_per_second: int | None = Field(
        default=None,
        ge=10**6,
        le=10**13,
        description="aggregate bandwidth to checkpoint storage, used to predict the "
        "checkpoint save and load time in the restart cost a switch must repay. Unset: "
        f"{defaults.CHECKPOINT_BANDWIDTH_BYTES_PER_SECOND} (1 GB/s)",
    )


FAILURE_RULES: Final[list[JsonValue]] = [
    {
        "rule": "!has(self.backoffSeconds) || !has(self.maxBackoffSeconds) "
        "|| self.maxBackoffSeconds >= self.backoffSeconds",
        "message": "maxBackoffSeconds must be at least backoffSeconds",
    },
]


class FailurePolicy(KubeModel):
    """How often and how soon the job restarts after real failures (never preemptions)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": FAILURE_RULES})

    max_restarts: int = Field(
        default=3, ge=0, le=1000, description="restarts after real failures; preemptions are free"
    )
    backoff_seconds: int | None = Field(
        default=None,
        ge=1,
        le=3600,
        description="delay before the first restart after a real failure; it doubles with "
        f"each further restart, up to maxBackoffSeconds. Unset: {defaults.BACKOFF_SECONDS}",
    )
    max_backoff_seconds: int | None = Field(
        default=None,
        ge=1,
        le=86400,
        description="the longest restart delay. Unset: "
        f"{defaults.MAX_BACKOFF_SECONDS}, or backoffSeconds where that is larger",
    )

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> FailurePolicy:
        # FAILURE_RULES said in Python, so a model built outside the API server agrees.
        base, cap = self.backoff_seconds, self.max_backoff_seconds
        if base is not None and cap is not None and cap < base:
            raise ValueError("maxBackoffSeconds must be at least backoffSeconds")
        return self


class ProfilingPolicy(KubeModel):
    mode: Literal["Auto", "Skip", "Required"] = Field(
        default="Auto",
        description=(
            "Auto: measured profiles where stored, estimated otherwise; Skip: estimated is "
            "fine; Required: do not plan until every profile is measured"
        ),
    )


class PlanningPolicy(KubeModel):
    """How long the operator searches for a plan."""

    deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=3600,
        description="wall-clock budget of one plan search (first plan and every replan); "
        "when it runs out the job gets the best plan found so far, or Unschedulable if none "
        "was found. The status condition Planning shows a search under way. Unset: "
        f"{defaults.PLANNING_DEADLINE_SECONDS} (the operator kills a search that overruns "
        f"its deadline by {defaults.PLANNING_GRACE_SECONDS} s)",
    )


# -- pod template overrides ------------------------------------------------------------------
# Pod fields as Kubernetes defines them (api.kubeschema: the published core/v1 schemas, so
# the API server validates them as it validates a Pod and names the field it rejects).
# Parsed as plain JSON objects: the operator copies them into the worker pods.
def _kube(name: str) -> WithJsonSchema:
    return WithJsonSchema(kubeschema.schema(name))


KubeObject = dict[str, JsonValue]
Toleration = Annotated[KubeObject, _kube("Toleration")]
Affinity = Annotated[KubeObject, _kube("Affinity")]
LocalObjectReference = Annotated[KubeObject, _kube("LocalObjectReference")]
EnvVar = Annotated[KubeObject, _kube("EnvVar")]
EnvFromSource = Annotated[KubeObject, _kube("EnvFromSource")]
Volume = Annotated[KubeObject, _kube("Volume")]
VolumeMount = Annotated[KubeObject, _kube("VolumeMount")]
ResourceRequirements = Annotated[KubeObject, _kube("ResourceRequirements")]

# Names and paths the operator's own volumes use (reconcile.children): an override may
# mount them elsewhere but not replace them.
RESERVED_VOLUMES: Final = ("plan", "podinfo", "dshm", "tmp", "checkpoints")
RESERVED_MOUNT_PATHS: Final = (
    "/etc/sailplan/plan",
    DEFAULT_PODINFO_DIR,
    "/dev/shm",
    "/tmp",
    "/checkpoints",
)
RESERVED_PREFIX: Final = f"{GROUP}/"


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


NON_ROOT_RULES: Final[list[JsonValue]] = [
    {
        "rule": "!has(self.runAsNonRoot) || self.runAsNonRoot",
        "message": "runAsNonRoot: false is not allowed: worker pods run as a non-root user",
        "fieldPath": ".runAsNonRoot",
    },
    {
        "rule": "!has(self.runAsUser) || self.runAsUser != 0",
        "message": "runAsUser: 0 (root) is not allowed: worker pods run as a non-root user",
        "fieldPath": ".runAsUser",
    },
]
RESERVED_KEY_RULES: Final[list[JsonValue]] = [
    {
        "rule": f"self.all(k, !k.startsWith('{RESERVED_PREFIX}'))",
        "message": f"keys under {RESERVED_PREFIX} are set by the operator",
    },
]
VOLUME_RULES: Final[list[JsonValue]] = [
    {
        "rule": f"self.all(v, !(v.name in {_cel_list(RESERVED_VOLUMES)}))",
        "message": f"volume names {', '.join(RESERVED_VOLUMES)} are the operator's",
    },
]
MOUNT_RULES: Final[list[JsonValue]] = [
    {
        "rule": f"self.all(m, !(m.mountPath in {_cel_list(RESERVED_MOUNT_PATHS)}))",
        "message": f"mount paths {', '.join(RESERVED_MOUNT_PATHS)} are the operator's",
    },
]


def _non_root(context: KubeObject | None, where: str) -> KubeObject | None:
    # NON_ROOT_RULES said in Python, so a model built outside the API server agrees.
    if context is not None:
        if context.get("runAsNonRoot") is False:
            raise ValueError(
                f"{where}.runAsNonRoot: false is not allowed (worker pods run as non-root)"
            )
        if context.get("runAsUser") == 0:
            raise ValueError(
                f"{where}.runAsUser: 0 (root) is not allowed (worker pods run as non-root)"
            )
    return context


PodSecurityContext = Annotated[
    KubeObject,
    WithJsonSchema(
        kubeschema.schema("PodSecurityContext") | {"x-kubernetes-validations": NON_ROOT_RULES}
    ),
    AfterValidator(lambda c: _non_root(c, "securityContext")),
]
SecurityContext = Annotated[
    KubeObject,
    WithJsonSchema(
        kubeschema.schema("SecurityContext") | {"x-kubernetes-validations": NON_ROOT_RULES}
    ),
    AfterValidator(lambda c: _non_root(c, "containers[].securityContext")),
]
LabelValue = Annotated[str, Field(max_length=63)]


class PodMetadataOverrides(KubeModel):
    """Labels and annotations added to every worker pod (e.g. Kueue's or a cost tracker's)."""

    labels: dict[str, LabelValue] | None = Field(
        default=None,
        max_length=64,
        json_schema_extra={"x-kubernetes-validations": RESERVED_KEY_RULES},
    )
    annotations: dict[str, str] | None = Field(
        default=None,
        max_length=64,
        json_schema_extra={"x-kubernetes-validations": RESERVED_KEY_RULES},
    )


CONTAINER_NAME: Final = "trainer"  # the worker pod's one container (reconcile.children)


class ContainerOverrides(KubeModel):
    """Additions to the trainer container of every worker pod."""

    name: Literal["trainer"] = Field(description="the container: the worker pod has one")
    env: tuple[EnvVar, ...] | None = Field(
        default=None,
        max_length=256,
        description="added after the operator's own variables, which win on a name clash",
    )
    env_from: tuple[EnvFromSource, ...] | None = Field(default=None, max_length=64)
    volume_mounts: tuple[VolumeMount, ...] | None = Field(
        default=None,
        max_length=64,
        json_schema_extra={"x-kubernetes-validations": MOUNT_RULES},
    )
    security_context: SecurityContext | None = Field(
        default=None,
        description="merged over the operator's (no privilege escalation, every capability "
        "dropped, read-only root filesystem): a field set here wins",
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description="requests and limits merged over spec.trainer.cpu and memory (a value set "
        "here wins); the nvidia.com/gpu count always comes from the plan",
    )


# A list keyed by name, as a Pod's containers are (one entry today: the trainer).
ContainerList = Annotated[
    tuple[ContainerOverrides, ...],
    Field(
        max_length=1,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    ),
]


class PodSpecOverrides(KubeModel):
    """Pod fields for every worker pod, merged with what the operator sets."""

    node_selector: dict[str, Annotated[str, Field(max_length=63)]] | None = Field(
        default=None,
        max_length=64,
        description="added to the pods' node affinity; an entry on a label the plan pins "
        "(the GPUPool's node pool or selector, the zone) with another value is ignored, "
        "and the pod says so in the sailplan.dev/overrides-ignored annotation",
    )
    tolerations: tuple[Toleration, ...] | None = Field(
        default=None, max_length=64, description="added to the GPUPool's tolerations"
    )
    affinity: Affinity | None = Field(
        default=None,
        description="merged: required node selector terms are each combined with the "
        "plan's pool and zone pin (the pin always holds); preferred node terms are taken as "
        "they are; pod affinity and anti-affinity terms are added to the operator's (a "
        "node holds one job's workers, packed)",
    )
    priority_class_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN
    )
    image_pull_secrets: tuple[LocalObjectReference, ...] | None = Field(default=None, max_length=16)
    security_context: PodSecurityContext | None = Field(
        default=None,
        description="merged over the operator's (non-root uid 10001, fsGroup 10001, the "
        "runtime's seccomp profile): a field set here wins; runAsNonRoot false and "
        "runAsUser 0 are rejected",
    )
    termination_grace_period_seconds: int | None = Field(
        default=None,
        ge=0,
        le=86400,
        description="how long a worker has to write its checkpoint after SIGTERM. Unset: 120",
    )
    volumes: tuple[Volume, ...] | None = Field(
        default=None,
        max_length=64,
        json_schema_extra={"x-kubernetes-validations": VOLUME_RULES},
        description="added to the operator's volumes (plan, podinfo, dshm, tmp, checkpoints)",
    )
    containers: ContainerList | None = None

    def container(self) -> ContainerOverrides | None:
        return next(iter(self.containers or ()), None)


class PodTemplateOverrides(KubeModel):
    """Additions to every worker pod the operator renders (Kubeflow Trainer's
    podTemplateOverrides, one entry: every worker has the same role)."""

    metadata: PodMetadataOverrides | None = None
    spec: PodSpecOverrides | None = None


IMMUTABLE_MANAGED_BY: Final[list[JsonValue]] = [
    {"rule": "self == oldSelf", "message": "managedBy is immutable"},
]
SPEC_RULES: Final[list[JsonValue]] = [
    # A field-level transition rule does not see the field being added or removed.
    {
        "rule": "has(self.managedBy) == has(oldSelf.managedBy)",
        "message": "managedBy is immutable: it can only be set when the job is created",
    },
]


class TrainingJobSpec(KubeModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": SPEC_RULES})

    managed_by: str | None = Field(
        default=None,
        min_length=1,
        max_length=MANAGED_BY_MAX_LENGTH,
        # batch/v1 Job's rule: a domain-prefixed path such as kueue.x-k8s.io/multikueue.
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[-A-Za-z0-9_.~/]+$",
        json_schema_extra={"x-kubernetes-validations": IMMUTABLE_MANAGED_BY},
        description=f"the controller that reconciles this job: unset or {MANAGED_BY} for "
        "the Sailplan operator; any other value (e.g. kueue.x-k8s.io/multikueue) and the "
        "operator leaves the job and its status alone. Immutable",
    )
    suspend: bool = Field(
        default=False,
        description="true: the job runs no worker pods and holds no GPUs. Set on a running "
        "job, its workers checkpoint and exit (as for a planned switch, within "
        "replan.drainTimeoutSeconds) and are deleted; set back to false, the job plans "
        "anew on the capacity of that moment and resumes from its last checkpoint. A job "
        "created suspended does not plan until resumed. Kueue admission does not use "
        "this field: with the kueue.x-k8s.io/queue-name label the operator queues a Kueue "
        "Workload per plan and starts the workers once it is admitted",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="the job fails (condition Failed, reason DeadlineExceeded) and its "
        "workers are deleted once it has been active this long since status.startTime; "
        "time suspended does not count (startTime is set again when the job resumes)",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="the operator deletes the job (and with it every child) this long "
        "after it Succeeded or Failed (status.completionTime); unset keeps it",
    )
    model: ModelRef = Field(json_schema_extra={"x-kubernetes-validations": IMMUTABLE_MODEL})
    training: TrainingSettings
    pools: PoolSelection = PoolSelection()
    objective: ObjectiveSpec = ObjectiveSpec()
    energy: EnergySpec = EnergySpec()
    trainer: TrainerSpec
    checkpoint: CheckpointSpec
    replan: ReplanPolicy = ReplanPolicy()
    failure: FailurePolicy = FailurePolicy()
    profiling: ProfilingPolicy = ProfilingPolicy()
    planning: PlanningPolicy = PlanningPolicy()
    pod_template_overrides: PodTemplateOverrides | None = Field(
        default=None,
        description="labels, annotations and pod fields added to every worker pod: node "
        "selector, tolerations, affinity, priority class, image pull secrets, env, volumes, "
        "security contexts, termination grace period, resources. The plan's placement "
        "(GPUPool and zone) and GPU count always hold",
    )


# -- status -----------------------------------------------------------------------------------
DISPLAY_DIGITS: Final = 3


def _significant(value: float | None) -> float | None:
    # Predictions and measured rates are estimates: more digits are noise, and printer
    # columns show the stored value verbatim (42.15181355961952, 14.679999999999998).
    if value is None or value == 0 or not math.isfinite(value):
        return value
    return round(value, DISPLAY_DIGITS - 1 - math.floor(math.log10(abs(value))))


# A status number shown in a printer column: rounded to 3 significant digits when written.
DisplayNumber = Annotated[
    float | None,
    AfterValidator(_significant),
    Field(description=f"rounded to {DISPLAY_DIGITS} significant digits"),
]


class PlanSummary(StatusModel):
    generation: int = Field(ge=1)
    config_map: str
    summary: str = Field(description="one line: stages, degrees, GPUs by pool and zone")
    pipeline_depth: int = 0
    data_parallel: int = 0
    workers: int = 0
    gpus: int = 0
    gpus_by_pool: dict[str, int] = Field(default_factory=dict)
    micro_batch_size: int = 0
    predicted_samples_per_second: DisplayNumber = None
    predicted_usd_per_hour: DisplayNumber = None
    predicted_iteration_seconds: DisplayNumber = None
    predicted_joules_per_iteration: DisplayNumber = Field(
        default=None,
        description="GPU energy of one iteration at the plan's no-slowdown clocks (set when "
        "the job asks for energy: objective Energy or energy.clocks NoSlowdown); "
        "status.progress.joulesPerStep is the measured counterpart",
    )
    predicted_joules_per_iteration_default: DisplayNumber = Field(
        default=None, description="the same at default clocks"
    )
    cluster_hash: str = ""
    estimated_profiles: tuple[str, ...] = ()


class PlanHistoryEntry(StatusModel):
    generation: int
    time: datetime
    reason: str
    summary: str
    predicted_samples_per_second: DisplayNumber = None


class Progress(StatusModel):
    """Rank 0's numbers, read by the operator from its metrics endpoint."""

    step: int = 0
    loss: float | None = None
    samples_per_second: DisplayNumber = None
    last_checkpoint_step: int | None = None
    joules_per_step: DisplayNumber = Field(
        default=None,
        description="measured GPU energy of the last step, summed over every rank's GPU "
        "(NVML total energy counters read by the trainer at step boundaries); unset when "
        "some rank cannot read its counter (no GPU or no NVML). Compare "
        "plan.predictedJoulesPerIteration",
    )
    time: datetime | None = Field(
        default=None,
        description="when the operator first read this step from rank 0; a rank 0 it "
        "cannot reach leaves the last numbers here, ageing",
    )


class WorkerCounts(StatusModel):
    desired: int = 0
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0


MAX_HISTORY: Final = 20


class TrainingJobStatus(StatusModel):
    observed_generation: int | None = None
    phase: Phase = PHASE_PENDING
    model: str | None = Field(default=None, description="resolved model name")
    conditions: Conditions = Field(
        default=(),
        description="Valid, Planned, Planning, Schedulable, ProfilesMeasured, Profiling, "
        "Running, Replanning, Complete, Failed, Suspended, each with a reason. Complete=True when every "
        "worker finished (`kubectl wait --for=condition=Complete`). Invalid, Unschedulable "
        "and Succeeded are kept for older clients: Invalid and Unschedulable are always the "
        "opposite of Valid and Schedulable, with the same reason and message; Succeeded "
        "equals Complete.",
    )
    start_time: datetime | None = Field(
        default=None,
        description="when the job last became active: created unsuspended, or resumed; "
        "unset while suspended. spec.activeDeadlineSeconds counts from it",
    )
    completion_time: datetime | None = Field(
        default=None,
        description="when the job Succeeded or Failed; spec.ttlSecondsAfterFinished counts from it",
    )
    plan: PlanSummary | None = None
    history: tuple[PlanHistoryEntry, ...] = Field(default=(), max_length=MAX_HISTORY)
    progress: Progress | None = None
    workers: WorkerCounts = WorkerCounts()
    attempt: int = Field(default=0, ge=0, description="restarts of the current plan generation")
    restarts: int = Field(default=0, ge=0, description="restarts after real failures")
    preemptions: int = Field(default=0, ge=0)
    # The operator's memory between passes is not here: it lives in the job's state
    # ConfigMap (api.memory, reconcile.memory); v1alpha1 objects kept it in status.replan
    # and status.unschedulableInputs, which the operator migrates.


class TrainingJob(KubeModel):
    """A parsed TrainingJob object: identity, spec and status, and the operator's memory of
    it (read from its state ConfigMap, not part of the object)."""

    name: str
    namespace: str
    uid: str = ""
    generation: int = 0
    # metadata.labels: kueue.x-k8s.io/queue-name asks for Kueue admission (reconcile.kueue).
    labels: dict[str, str] = Field(default_factory=dict)
    spec: TrainingJobSpec
    status: TrainingJobStatus = TrainingJobStatus()
    memory: JobMemory = JobMemory()

    @model_validator(mode="after")
    def _name_fits(self) -> TrainingJob:
        if len(self.name) > MAX_NAME_LENGTH:
            raise ValueError(f"metadata.name must be at most {MAX_NAME_LENGTH} characters")
        return self
