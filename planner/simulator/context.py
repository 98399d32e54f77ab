"""The planning context: everything a simulation or a search needs besides the plan itself.

One immutable object carries the model, the cluster snapshot, the completed ProfileSet
(measured where available, estimated elsewhere: see profiles.estimate.complete_profiles),
the catalog, the optimizer, how the weights are trained (TrainingSetup: ZeRO stage,
parameter dtype) and the simulator's calibrated constants. simulate() and the search's
fast cost API (costs.CostModel) both read it, so they price plans identically.

Built by planner.api (the front door) and the CLI's `simulate`; the constants below are the
only tuned numbers of the simulator and each says where its value comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from sailplan.planner.catalog import Catalog, default_catalog
from sailplan.planner.cluster import ClusterSnapshot
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator.memory import TrainingSetup

if TYPE_CHECKING:
    from sailplan.planner.simulator.costs import CostModel

Optimizer = Literal["adam", "sgd"]


@dataclass(frozen=True)
class SimulatorConstants:
    """Calibrated constants of the cost model.

    The two memory constants are fitted on the 15 real GH200 OPT-350M runs of the Sailor
    artifact (benchmarks/simulator_accuracy.py refits them on training folds only and prints
    the leave-one-run-out and leave-one-configuration-out errors); the rest are sourced:

    - framework_overhead_bytes: memory every rank uses outside the tensors the model
      accounts for (CUDA context, cuBLAS/NCCL workspaces, fused-kernel modules). Least
      squares over the runs gives 5.15 GB; Sailor's own simulator uses 4.76 GB + 300 MB
      for the same platform. The runs' peak is nvidia-smi's used memory after the
      optimizer step, the maximum over ranks (Sailor's process_results.py), and Aceso's
      runs on the same cluster measure 3.1-4.1 GB of it outside PyTorch (nvidia-smi total
      minus max reserved), so this is a GH200 platform figure: other GPUs get it until
      their own is measured (docs/benchmarks.md, "Why the consumer runs' memory is not
      predicted").
    - activation_allocator_factor: the caching allocator reserves more than the
      activations it holds (block rounding, fragmentation between micro-batches): 1.06 from
      the same least-squares fit (the Korthikanti formula is otherwise used as is); Aceso's
      GH200 runs reserve 1.03-1.09 x their peak allocated memory.
    Communication has no constant here: it is priced from the network's bandwidths and
    NCCL's algorithms (simulator/collectives.py, CostModel.p2p_seconds), each input a
    measured profile or a catalog datasheet figure.
    Model states (weights, gradients, master weights, optimizer states, buckets) and the
    gradients' dtype are not constants: they follow PlanningContext.training
    (simulator/memory.py).
    - bucket_bytes: gradient all-reduce bucket of a TP group, in bytes (5e8), used when
      bucket_elements is 0.
    - bucket_elements: when > 0, the runtime packs each rank's gradients into buckets of
      this many elements, whatever their dtype, so a TP group's bucket is bucket_elements x
      the gradient's element bytes x TP (CostModel.group_bucket_bytes). DeepSpeed's
      PipelineEngine reduces with allreduce_gradients(bucket_size=MEMORY_OPT_ALLREDUCE_SIZE
      = 500,000,000), whose allreduce_no_retain counts tensor.numel() against it
      (deepspeed/runtime/engine.py): 5e8 elements, 2 GB of fp32 gradients per rank, for
      the Sailor runs (benchmarks/simulator_accuracy.py SAILOR_RUNTIME).
    - overlap_allreduce: False = gradients are reduced after the last backward, as the
      DeepSpeed pipeline engine and Megatron without --overlap-grad-reduce do (the measured
      runs). True = buckets are reduced while the last micro-batch's backward runs and only
      what does not fit under it, at least the last bucket, is exposed.
    - flash_attention: whether attention scores are recomputed instead of stored
      (Korthikanti's 5as^2b term dropped). True = Sailplan's trainer: its attention is
      torch's scaled_dot_product_attention, causal, without dropout (trainer/model.py),
      which on CUDA runs the flash or memory-efficient kernel and keeps only the
      log-sum-exp, never the s x s scores; so selective recomputation frees nothing there
      (profiles/selective.py). False = Megatron-DeepSpeed as the Sailor runs used it,
      which stores the scores.
    - cpu_adam_params_per_s: parameters per second DeepSpeedCPUAdam updates for one rank
      of an offloaded stage (CostModel.offload_seconds): measured by
      `python benchmarks/cpu_adam.py` (docs/benchmarks.md) on the 2-core development VM,
      so a node with more host cores per GPU updates faster than this predicts.
    - blocking_p2p: how the runtime moves a boundary tensor. False = Sailplan's trainer:
      each send is issued together with the receive of the other direction
      (trainer/schedule.py, batch_isend_irecv), so a stage's 1F1B cycle pays each boundary
      once. True = DeepSpeed's PipelineEngine, which the Sailor runs used: SendActivation,
      RecvActivation, SendGrad and RecvGrad are separate blocking instructions
      (deepspeed/runtime/pipe/engine.py, p2p.send/recv), so a stage pays each boundary
      twice per cycle, once per direction.
    - partitioned_p2p: what a TP group sends across a stage boundary (CostModel.
      boundary_seconds). False = Sailplan's trainer: TP rank 0 sends the whole tensor in one
      flow and the receiving rank 0 broadcasts it inside its node (trainer/schedule.py).
      True = DeepSpeed's PipelineEngine with pipe_partitioned/grad_partitioned (its
      defaults, and the Sailor runs' fork): every TP rank sends its 1/TP part and the
      receiver all-gathers them (deepspeed/runtime/pipe/engine.py, PartitionedTensor). In
      both, one copy of the tensor crosses the network, never one per TP rank. The same
      runtime choice prices the tied-embedding all-reduce between stages (CostModel.
      shared_gradient_seconds): the trainer's TP rank 0 gathers, all-reduces and
      broadcasts the whole tensor; DeepSpeed's tied groups all-reduce each TP rank's shard.
    """

    framework_overhead_bytes: float = 5.15e9
    activation_allocator_factor: float = 1.06
    cpu_adam_params_per_s: float = 5.4e8
    bucket_bytes: float = 5e8
    bucket_elements: float = 0.0
    overlap_allreduce: bool = False
    flash_attention: bool = True
    blocking_p2p: bool = False
    partitioned_p2p: bool = False


# Sailplan's trainer: what the operator plans for.
DEFAULT_CONSTANTS = SimulatorConstants()
# Megatron-DeepSpeed's PipelineEngine, as the Sailor runs trained (the measured data the
# simulator is checked on): blocking sends of 1/TP parts, gradients all-reduced in buckets
# of MEMORY_OPT_ALLREDUCE_SIZE = 5e8 elements, attention scores stored.
DEEPSPEED_PIPELINE_CONSTANTS = SimulatorConstants(
    blocking_p2p=True, partitioned_p2p=True, bucket_elements=5e8, flash_attention=False
)
DEFAULT_TRAINING = TrainingSetup()


@dataclass(frozen=True)
class PlanningContext:
    """Inputs shared by every plan priced for one request."""

    model: ModelSpec
    cluster: ClusterSnapshot
    profiles: ProfileSet
    catalog: Catalog = field(default_factory=default_catalog)
    optimizer: Optimizer = "adam"
    constants: SimulatorConstants = DEFAULT_CONSTANTS
    # how the weights are trained (ZeRO stage, parameter dtype): the default has the model
    # states (16 B/param) the memory constants were fitted with; the fitted runs themselves
    # trained in fp32 (benchmarks/simulator_accuracy.py SAILOR_TRAINING); planner.api plans
    # with TrainingSetup.trainer(...)
    training: TrainingSetup = DEFAULT_TRAINING

    @cached_property
    def costs(self) -> CostModel:
        """The cost tables for this context, built once and shared by simulate() and search."""
        from sailplan.planner.simulator.costs import CostModel

        return CostModel(self)
