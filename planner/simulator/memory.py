"""Model-state memory of one GPU: what the optimizer and the model hold, term by term.

The simulator's peak memory of a stage replica is these model states + the activations
1F1B keeps in flight + the framework's fixed overhead (costs.CostModel.stage_memory_bytes).
This module prices the model states for the way the weights are trained
(`TrainingSetup`): the ZeRO stage, the data-parallel degree and the dtype of the
parameters. Two setups matter:

- the Sailplan trainer (`TrainingSetup.trainer`): fp32 parameters, so fp32 gradients and
  fp32 all-reduces, bf16/fp16 only inside torch.autocast (activations); or, with
  `half_parameters` (Plan.half_parameters), 16-bit parameters, gradients, all-reduces and
  stage boundaries with an fp32 master copy in the optimizer; under ZeRO-1/2 the
  optimizer is DeepSpeed's `DeepSpeedZeroOptimizer` with the bucket sizes
  sailplan.trainer.zero passes (TrainerConfig.zero_bucket_elements);
- half-precision parameters with an fp32 master copy in the optimizer (DeepSpeed's and
  Megatron's bf16/fp16 mode; `TrainingSetup()`, the default, with no ZeRO and no buckets:
  2 + 2 + 12 = 16 bytes per parameter). The Sailor artifact's Megatron-DeepSpeed runs, on which the
  simulator's memory constants were fitted, trained in fp32 instead (4 + 4 + 8 = the same
  16 bytes; fp32 gradients in the all-reduce: benchmarks/simulator_accuracy.py
  SAILOR_TRAINING gives the sources).

Terms, for P parameters on the rank, D replicas sharing them, w bytes per parameter
(4 fp32, 2 bf16/fp16), k optimizer bytes per parameter (Adam 8: fp32 momentum and
variance; torch SGD without momentum 0) and B the reduce bucket in elements:

| term | ZeRO-0 (or D = 1) | ZeRO-1 | ZeRO-2 |
| --- | --- | --- | --- |
| weights | wP | wP | wP |
| master weights (fp32) | 4P if w = 2, else 0 (the parameters are fp32) | 4P/D | 4P/D |
| optimizer states | kP | kP/D | kP/D |
| gradients | wP | wP + wP/D | wP/D + a + max(4P/D, w max(B, largest tensor)) |
| buckets | w min(25 MiB, wP) if D > 1 | 2 wB | wB |

Sources (DeepSpeed 0.19, deepspeed/runtime/zero/stage_1_and_2.py, as the trainer drives it):
master weights: `single_partition_of_fp32_groups` is a clone of this rank's partition of
the flat parameters in fp32 even when they are fp32; the ZeRO paper (Rajbhandari et al.
2020, Sec. 3.1) counts 2 + 2 + 12 bytes per parameter for mixed-precision Adam, the 12
being master weights, momentum and variance, partitioned 12/D from ZeRO-1 on. ZeRO-1
gradients: the full gradients stay in `param.grad` until the step (wP); the reduction
copies this rank's share into `grads_in_partition` (wP/D), and the step flattens it into
an fp32 partition gradient (4P/D) only after the full gradients are freed, so the first
dominates. The two reduce buckets (`reduce_bucket_size` elements, DeepSpeed config key
`zero_optimization.reduce_bucket_size`, default 5e8; the trainer passes 2**24): one the
gradient hooks set up, one `reduce_gradients(pipeline_parallel=True)` appends. ZeRO-2
gradients: `grads_in_partition` (this rank's share, wP/D), its fp32 accumulation across
micro-batches (`all_grad_tensors`, a = 4P/D with fp32 parameters; with 16-bit ones the
accumulation stays in `grads_in_partition` and a = 0, both measured by the trainer test
below), and then the
larger of two phases: during a backward, the gradients that wait for the bucket to fill
(at most a bucket, or one tensor larger than it, which DeepSpeed reduces on its own); at
the accumulation boundary, the flat fp32 copy of the share the step will use
(`averaged_gradients`, 4P/D). ZeRO-0: the
trainer's bucketed all-reduce (sailplan.trainer.grads, 25 MiB) flattens one bucket at a
time. DeepSpeed pads the flat buffer to a multiple of 2D elements (nccl_start_alignment_factor
2 x D), which is not counted (at most 2D elements).

A gradient that moves into a bucket frees its own storage (DeepSpeed makes `param.grad` a
view of the bucket), so the ZeRO-1 sum is an upper bound by at most the two buckets; the
trainer test tests/trainer/test_memory_model.py measures the tensors each rank holds and
checks both the terms and that bound.

Optimizer offload (`offload=True`, a stage's `optimizer_offload`: DeepSpeed ZeRO's
`offload_optimizer` with device cpu, the trainer's sailplan.trainer.zero) moves the fp32
master partition and the Adam moments to host memory, with the fp32 partition gradient
the update reads (`single_partition_of_fp32_groups[i].grad`) and the buffer the updated
partition is copied back to the device through (`param_buffer_of_bit16_for_cpu_offload_groups`):
(4 + k + 4 + w)P/D bytes of host memory (`ModelStateBytes.host`), none of it on the GPU,
and a host staging buffer of the largest tensor. The master partition, its gradient and
the moments are fp32 whatever the parameters; the copy-back and staging buffers are in the
parameters' dtype (w). ZeRO-2 accumulates the rank's share across the micro-batches of a
step: with fp32 parameters on the host, in a buffer per gradient of the rank's partition
(`accumulated_grads_in_cpu`, 4P/D; one whole tensor per parameter it touches, so the one
or two tensors straddling the partition's ends count whole: not counted, at most two
largest tensors; absent with a single micro-batch, which a pipeline never has); with
16-bit parameters on the device, in DeepSpeed's flat fp32 partition gradient
(`averaged_gradients[i].flat_partition`, its fp32 gradient accumulation dtype, 4P/D),
freed at the step.
DeepSpeed's offload is a ZeRO-1/2 feature, so an offloaded stage runs ZeRO-1 when the job
says ZeRO-0, and its partition is the whole stage when D = 1. The device keeps the
weights, the gradients until they are reduced (ZeRO-1: all of them, wP; ZeRO-2: those
waiting for the bucket) and one staging buffer of the largest tensor
(`temp_grad_buffer_for_gpu_offload`), plus the buckets.

Called by costs.CostModel (the search and simulate()); pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

Precision = Literal["fp32", "bf16", "fp16"]
ZeroStage = Literal[0, 1, 2]
Bytes = float | npt.NDArray[np.float64]

FP32_BYTES = 4
HALF_BYTES = 2
ADAM_STATE_BYTES = 8  # fp32 exp_avg + exp_avg_sq (torch.optim.Adam)
SGD_STATE_BYTES = 0  # torch.optim.SGD without momentum keeps no state
# sailplan.trainer.grads.DEFAULT_BUCKET_BYTES: the ZeRO-0 all-reduce flattens one bucket
REPLICATED_BUCKET_BYTES = 25 * 2**20
# sailplan.planner.workerenv.TrainerConfig.zero_bucket_elements' default (the trainer's
# reduce and all-gather bucket); DeepSpeed's own default is 5e8 elements
# (zero_optimization.reduce_bucket_size), gigabytes of staging per rank.
TRAINER_BUCKET_ELEMENTS = 2**24


@dataclass(frozen=True)
class TrainingSetup:
    """How the weights are trained, as far as memory and gradient traffic are concerned.

    The defaults are half-precision parameters with an fp32 master copy and no ZeRO, no
    bucket term (it is inside the fitted framework overhead): 16 bytes per parameter for
    Adam, the same model states as the fp32 training of the Sailor artifact's runs that
    SimulatorConstants was fitted on (TrainingSetup(parameter_bytes=4,
    boundary_element_bytes=4), benchmarks/simulator_accuracy.py SAILOR_TRAINING), whose
    all-reduce and stage-boundary sends move twice the default's bytes.
    `TrainingSetup.trainer(...)` is what the Sailplan trainer does.
    """

    zero_stage: ZeroStage = 0
    precision: Precision = "bf16"
    parameter_bytes: int = HALF_BYTES
    bucket_elements: int = 0
    replicated_bucket_bytes: float = 0.0
    boundary_element_bytes: int = HALF_BYTES

    @classmethod
    def trainer(
        cls,
        zero_stage: ZeroStage = 1,
        precision: Precision = "fp32",
        bucket_elements: int = TRAINER_BUCKET_ELEMENTS,
        *,
        half_parameters: bool = False,
    ) -> TrainingSetup:
        """The Sailplan trainer: autocast computes in `precision`; the parameters are fp32,
        or with `half_parameters` (Plan.half_parameters) in `precision`'s 16 bits with an
        fp32 master copy in the optimizer."""
        # the trainer's pipeline exchange (schedule.PipelineComm) sends hidden states in
        # the parameters' dtype: under autocast over fp32 parameters the residual stream
        # stays fp32, over 16-bit parameters it is 16-bit
        element = HALF_BYTES if half_parameters and precision != "fp32" else FP32_BYTES
        return cls(
            zero_stage=zero_stage,
            precision=precision,
            parameter_bytes=element,
            bucket_elements=bucket_elements,
            replicated_bucket_bytes=REPLICATED_BUCKET_BYTES,
            boundary_element_bytes=element,
        )

    @property
    def gradient_bytes(self) -> int:
        """Bytes per gradient element, also what the data-parallel all-reduce moves."""
        return self.parameter_bytes

    @property
    def activation_scale(self) -> float:
        """Activation memory relative to the 16-bit activations profiles.memory assumes."""
        return FP32_BYTES / HALF_BYTES if self.precision == "fp32" else 1.0


@dataclass(frozen=True)
class ModelStateBytes:
    """The model-state terms of one rank (bytes); `total` is their sum."""

    weights: Bytes
    master_weights: Bytes
    optimizer_states: Bytes
    gradients: Bytes
    buckets: Bytes
    host: Bytes = 0.0  # in host memory under optimizer offload, not part of `total`

    @property
    def total(self) -> Bytes:
        return (
            self.weights
            + self.master_weights
            + self.optimizer_states
            + self.gradients
            + self.buckets
        )


def optimizer_state_bytes(optimizer: str) -> int:
    return ADAM_STATE_BYTES if optimizer == "adam" else SGD_STATE_BYTES


def model_state_bytes(
    parameters: Bytes,
    data_parallel: int,
    setup: TrainingSetup,
    optimizer: str = "adam",
    largest_tensor: float = 0.0,
    *,
    offload: bool = False,
) -> ModelStateBytes:
    """Model-state bytes of one rank holding `parameters` shared by `data_parallel` replicas.

    `largest_tensor`: elements of the rank's largest parameter (ZeRO-2 reduces a tensor
    larger than the bucket on its own, so that many gradient elements may wait at once).
    `offload`: optimizer state in host memory (see the module docstring).
    Works on numpy arrays of parameter counts too (the search's stage matrices).
    """
    p, d, w = parameters, max(1, data_parallel), setup.parameter_bytes
    k = optimizer_state_bytes(optimizer)
    if offload:
        return _offloaded(p, d, setup, k, largest_tensor)
    if setup.zero_stage == 0 or d == 1:
        # sailplan.trainer.optimizer.ReplicatedOptimizer: torch's optimizer on the parameters
        master = FP32_BYTES * p if w < FP32_BYTES else 0.0
        bucket = np.minimum(setup.replicated_bucket_bytes, w * p) if d > 1 else 0.0
        return ModelStateBytes(
            weights=w * p,
            master_weights=master,
            optimizer_states=k * p,
            gradients=w * p,
            buckets=bucket,
        )
    bucket_bytes = w * setup.bucket_elements
    if setup.zero_stage == 1:
        gradients = w * p + w * p / d
        buckets = 2 * bucket_bytes
    else:
        waiting = w * max(setup.bucket_elements, largest_tensor)
        share = FP32_BYTES * p / d
        # the fp32 accumulation across micro-batches exists with fp32 parameters only
        accumulation = FP32_BYTES * p / d if w == FP32_BYTES else 0.0
        gradients = w * p / d + accumulation + np.maximum(share, np.minimum(waiting, w * p))
        buckets = bucket_bytes
    return ModelStateBytes(
        weights=w * p,
        master_weights=FP32_BYTES * p / d,
        optimizer_states=k * p / d,
        gradients=gradients,
        buckets=buckets,
    )


def _offloaded(
    p: Bytes, d: int, setup: TrainingSetup, k: int, largest_tensor: float
) -> ModelStateBytes:
    """ZeRO-1/2 with offload_optimizer (device cpu): the GPU holds weights, gradients until
    they are reduced and the buckets; the host the fp32 partition, its gradient, the
    moments and the copy-back buffer."""
    w = setup.parameter_bytes
    bucket_bytes = w * setup.bucket_elements
    # the staging buffer holds the rank's largest tensor, never more than the rank holds
    staging = np.minimum(w * largest_tensor, w * p)
    if setup.zero_stage == 2:
        waiting = w * max(setup.bucket_elements, largest_tensor)
        gradients = np.minimum(waiting, w * p) + staging
        buckets = bucket_bytes
        # the accumulation of the rank's share across micro-batches: fp32 parameters on
        # the host (`accumulated_grads_in_cpu`), 16-bit ones in the device's flat fp32
        # partition (`averaged_gradients[i].flat_partition`)
        accumulation = w * p / d if w == FP32_BYTES else 0.0
        if w < FP32_BYTES:
            gradients = gradients + FP32_BYTES * p / d
    else:
        gradients = w * p + staging
        buckets = 2 * bucket_bytes
        accumulation = 0.0
    return ModelStateBytes(
        weights=w * p,
        master_weights=0.0,
        optimizer_states=0.0,
        gradients=gradients,
        buckets=buckets,
        # and the host side of the staging buffer (`temp_grad_buffer_for_cpu_offload`)
        host=(FP32_BYTES + k + FP32_BYTES + w) * p / d + staging + accumulation,
    )
