"""ZeRO stage 1 and 2 over one stage's data-parallel group, with DeepSpeed's ZeRO optimizer.

DeepSpeed's `DeepSpeedZeroOptimizer` flattens the stage's parameters into one buffer and
gives each DP replica an equal slice of it (tensors may straddle slices), so every replica
holds 1/DP of the Adam state whatever the mix of tensor sizes; a whole-tensor assignment
leaves the replica that gets the embedding or the head with far more. It is driven the way
DeepSpeed's own pipeline engine drives it, not through `deepspeed.initialize`: DeepSpeed's
engine, topology grid and checkpoints assume one TP degree and one stage size for the whole
pipeline, while a heterogeneous plan has a DP group per stage and per TP rank. So:

- the DP group comes through an `mpu` object (`StageMPU`), as the pipeline engine's grid
  hands it over; the model-parallel group it names is the worker's TP group;
- the schedule runs plain backwards; ZeRO-1 reduces once per step
  (`reduce_gradients(pipeline_parallel=True)`), ZeRO-2 after every micro-batch's backward
  (its gradient hooks fill the partition buckets; the epilogue reduces what is left and,
  on the last micro-batch, the accumulation boundary, keeps this rank's averaged share);
- gradient clipping is off (`clip_grad=0`, no norm computed), as in the replicated
  optimizer: DeepSpeed's engine would otherwise clip at 1.0 by default;
- the update rule is the same torch optimizer as the replicated path, run on the flat
  fp32 partition, so both give the same weights up to summation order;
- the moments go to and come from the plan-independent checkpoint per logical parameter
  through DeepSpeed's full-state accessors (`safe_get_full_optimizer_state`, which gathers
  over the DP group, and `safe_set_full_optimizer_state`, which keeps this rank's share),
  and so does the fp32 master value of 16-bit parameters (`safe_get_full_fp32_param`,
  `safe_set_full_fp32_param`);
- 16-bit parameters (Plan.half_parameters) are DeepSpeed's bf16/fp16 mode: its flat
  16-bit buffer, 16-bit gradients and communication, the fp32 partition as master; under
  fp16 the gradients arrive still multiplied by the loss scale, which DeepSpeed divides out
  of its fp32 partition at the step (`override_loss_scale`, its own unscale path).

With `offload` (Stage.optimizer_offload) DeepSpeed keeps the fp32 partition, its gradient
and the Adam moments in host memory (`offload_optimizer` with device cpu, pinned on a GPU
machine) and the update is DeepSpeed's CPU Adam (`DeepSpeedCPUAdam`, plain Adam with the
trainer's betas and eps), a C++ op that DeepSpeed JIT-builds with the machine's compiler
(ninja, g++) the first time a process loads it, into TORCH_EXTENSIONS_DIR, where later
loads find it (the trainer image sets /tmp/torch_extensions, on the pod's writable /tmp
emptyDir, so each new pod builds it once; elsewhere torch's default,
~/.cache/torch_extensions, keeps it per machine). The image does not prebuild it
(trainer_image/Dockerfile installs with DS_BUILD_OPS=0): DeepSpeed compiles it with
-march=native, so a build on the image builder's CPU could use instructions the node's
CPU lacks. DeepSpeed computes the gradient norm on that path (it refuses offload without
it); clipping stays off.

DeepSpeed's communication layer is initialised on top of the torch world group this
process already joined, and its accelerator set to the parameters' device (on the CPU,
the shared-memory all-reduce op its CPU backend would JIT-build is marked incompatible
first, so nothing is compiled for it: ZeRO does not use it). Imported only when a stage
runs ZeRO with two or more replicas or offloads its optimizer. Called through
sailplan.trainer.optimizer.make_optimizer.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sailplan.trainer.optimizer import (
    ADAM_BETAS,
    ADAM_EPS,
    MOMENT_KEYS,
    StageOptimizer,
    torch_optimizer,
)

# Elements per reduce and all-gather bucket (fp32: 64 MiB). DeepSpeed's defaults (5e8 and
# 5e9 elements) allocate gigabytes of staging buffers per rank.
BUCKET_ELEMENTS = 2**24


class StageMPU:
    """The parallel groups of one rank as DeepSpeed's `mpu` protocol asks for them."""

    def __init__(self, dp_group: Any, tp_group: Any) -> None:
        self.dp_group, self.tp_group = dp_group, tp_group

    def get_data_parallel_group(self) -> Any:
        return self.dp_group

    def get_data_parallel_world_size(self) -> int:
        return int(dist.get_world_size(self.dp_group))

    def get_data_parallel_rank(self) -> int:
        return int(dist.get_rank(self.dp_group))

    def get_model_parallel_group(self) -> Any:
        return self.tp_group

    def get_model_parallel_world_size(self) -> int:
        return 1 if self.tp_group is None else int(dist.get_world_size(self.tp_group))

    def get_model_parallel_rank(self) -> int:
        return 0 if self.tp_group is None else int(dist.get_rank(self.tp_group))

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_rank = get_model_parallel_rank


def _import_deepspeed(device: torch.device) -> tuple[Any, Any, Any]:
    try:
        import deepspeed.comm
        from deepspeed.accelerator import set_accelerator
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
        from deepspeed.utils.timer import NoopTimer
    except ImportError as error:
        raise SystemExit(
            f"zero_stage 1 and 2 need DeepSpeed ({error}): install sailplan[trainer] "
            "or set zero_stage 0"
        ) from error
    if device.type == "cpu":
        # DeepSpeed's accelerator must be where the parameters are: on a GPU machine that
        # trains on the CPU (tests, gloo) its auto-detection would pick CUDA
        set_accelerator(CPU_Accelerator())
        # On the CPU, DeepSpeed's communication backend would JIT-compile its shared-memory
        # all-reduce (an inference kernel ZeRO never calls): minutes of g++ per machine, into
        # $HOME/.cache, which a pod's read-only root filesystem refuses. Marking the op
        # incompatible (DeepSpeed keeps edits to this table) makes the backend skip it.
        import deepspeed.ops

        shared_memory_op = CPU_Accelerator().create_op_builder("ShareMemCommBuilder")
        if shared_memory_op is not None:
            deepspeed.ops.__compatible_ops__[shared_memory_op.NAME] = False
    return deepspeed.comm, DeepSpeedZeroOptimizer, NoopTimer


def _cpu_adam(params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """DeepSpeed's CPU Adam with the update rule of torch_optimizer("adam")."""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except ImportError as error:  # pragma: no cover - DeepSpeed is imported above
        raise SystemExit(f"optimizer offload needs DeepSpeed's CPU Adam ({error})") from error
    optimizer: torch.optim.Optimizer = DeepSpeedCPUAdam(
        params, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=0.0, adamw_mode=False
    )
    return optimizer


def _offload_config(device: torch.device) -> Any:
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig

    # page-locked host memory for the asynchronous copies; a CPU-only process has no
    # device to pin for
    return DeepSpeedZeroOffloadOptimizerConfig(device="cpu", pin_memory=device.type == "cuda")


class ZeroOptimizer(StageOptimizer):
    """DeepSpeed ZeRO-1/2 for one rank's parameters over its stage's DP group."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        *,
        kind: str,
        lr: float,
        stage: int,
        dp_group: Any,
        tp_group: Any,
        num_micro_batches: int,
        offload: bool = False,
    ) -> None:
        ds_comm, zero_optimizer, noop_timer = _import_deepspeed(params[0].device)
        ds_comm.init_distributed(
            dist_backend=dist.get_backend(), auto_mpi_discovery=False, verbose=False
        )
        self.kind, self.stage = kind, stage
        self.num_micro_batches = num_micro_batches
        self.params = params
        self.offload = offload
        self.half = params[0].dtype != torch.float32
        mpu = StageMPU(dp_group, tp_group)
        self.inner = zero_optimizer(
            _cpu_adam(params, lr) if offload else torch_optimizer(kind, params, lr),
            {param: f"param.{index}" for index, param in enumerate(params)},
            timers=noop_timer(),
            optimizer_params={},
            dp_process_group=mpu.get_data_parallel_group(),
            mpu=mpu,
            partition_grads=stage == 2,
            clip_grad=0.0,
            compute_grad_norm=offload,
            offload_optimizer_config=_offload_config(params[0].device) if offload else None,
            # the ranks agree on overflows themselves (sailplan.trainer.precision)
            check_grad_overflow=False,
            communication_data_type=params[0].dtype,
            reduce_bucket_size=BUCKET_ELEMENTS,
            allgather_bucket_size=BUCKET_ELEMENTS,
            overlap_comm=False,
            contiguous_gradients=True,
            gradient_accumulation_steps=num_micro_batches,
            # ZeRO-1 accumulates in .grad, in the parameters' dtype (DeepSpeed's
            # data_types.grad_accum_dtype equal to the model's): an fp32 accumulation dtype
            # under 16-bit parameters switches DeepSpeed to per-parameter hooks that move
            # each micro-batch's gradient into an fp32 `grad_accum` and run its epilogue,
            # which this driver's once-per-step reduction would count twice or drop.
            # ZeRO-2 keeps DeepSpeed's fp32 default (its partition path).
            gradient_accumulation_dtype=params[0].dtype if stage == 1 else torch.float32,
            verbose=False,
        )

    def after_backward(self, micro_batch: int) -> None:
        self.inner.clear_backward_seen_flag()
        if self.stage == 2:
            self.inner.set_gradient_accumulation_boundary(micro_batch == self.num_micro_batches - 1)
            self.inner.overlapping_partition_gradients_reduce_epilogue()

    def gradient(self, param: torch.nn.Parameter) -> torch.Tensor:
        if self.stage == 2:
            # already averaged over the DP group, and only this rank's share is kept: gather
            # it (summing the tied ends commutes with averaging over the replicas)
            full: torch.Tensor = getattr(param, "get_full_hp_grad")()  # noqa: B009
            return full
        return param.grad if param.grad is not None else torch.zeros_like(param)

    def set_gradient(self, param: torch.nn.Parameter, grad: torch.Tensor) -> None:
        if self.stage == 2:
            # DeepSpeed attaches these accessors to the parameters it partitions
            getattr(param, "set_full_hp_grad")(grad)  # noqa: B009
        else:
            param.grad = grad

    def step(self, grad_scale: float = 1.0) -> None:
        if self.stage == 1:
            self.inner.set_gradient_accumulation_boundary(True)
            self.inner.reduce_gradients(pipeline_parallel=True)
        if grad_scale != self.inner.loss_scale:
            # DeepSpeed divides its fp32 gradient partition by this before the update
            self.inner.custom_loss_scaler = True
            self.inner.external_loss_scale = grad_scale
        self.inner.step()
        self.inner.zero_grad(set_to_none=True)

    def skip(self) -> None:
        # DeepSpeed's own overflow path (stage_1_and_2.py step(): zero the gradients, drop
        # the reduced partitions and accumulation buffers, reset the micro-step), entered by
        # reporting an overflow: the ranks already agreed that this step is skipped, which
        # DeepSpeed's own check, over the DP group only, could not know.
        inner = self.inner
        check, flag = inner.check_overflow, inner.check_grad_overflow

        def overflowed(*args: Any, **kwargs: Any) -> None:
            inner.overflow = True

        inner.check_overflow, inner.check_grad_overflow = overflowed, True
        try:
            inner.step()
        finally:
            inner.check_overflow, inner.check_grad_overflow = check, flag
        # Under offload that path keeps `averaged_gradients`: with 16-bit parameters at
        # ZeRO-2 it is the flat fp32 partition the micro-batches accumulate into, which the
        # next step would add to (DeepSpeed 0.19 drops it only without offload, and after a
        # step that ran). Drop it as the path without offload does.
        for key in list(inner.averaged_gradients):
            inner.averaged_gradients[key] = None
        inner.zero_grad(set_to_none=True)

    def _has_moments(self) -> bool:
        return self.kind == "adam" and bool(self.inner._hp_optimizer_states_linked)

    def moments(self, param: torch.nn.Parameter) -> dict[str, torch.Tensor]:
        if not self._has_moments():
            return {}
        from deepspeed.utils import safe_get_full_optimizer_state

        return {key: safe_get_full_optimizer_state(param, key) for key in MOMENT_KEYS}

    def set_moments(
        self, param: torch.nn.Parameter, step: int, moments: dict[str, torch.Tensor]
    ) -> None:
        if self.kind != "adam":
            return
        if not self._has_moments():
            # torch Adam creates its state at the first step; create it as that step would
            # have, with the step count of the checkpoint, then let DeepSpeed link each
            # parameter to its slice of it.
            for flat in self.inner.single_partition_of_fp32_groups:
                self.inner.optimizer.state[flat] = {
                    # CPU Adam's C++ update takes the step as a Python int
                    "step": step if self.offload else torch.tensor(float(step)),
                    **{key: torch.zeros_like(flat) for key in MOMENT_KEYS},
                }
            self.inner._lazy_init_hp_params_optimizer_state()
        from deepspeed.utils import safe_set_full_optimizer_state

        for key in MOMENT_KEYS:
            safe_set_full_optimizer_state(param, moments[key], key)

    def master(self, param: torch.nn.Parameter) -> torch.Tensor:
        if not self.half:
            return param.detach()
        from deepspeed.utils import safe_get_full_fp32_param

        value: torch.Tensor = safe_get_full_fp32_param(param)
        return value

    def set_master(self, param: torch.nn.Parameter, value: torch.Tensor) -> None:
        with torch.no_grad():
            param.copy_(value)
        if self.half:
            from deepspeed.utils import safe_set_full_fp32_param

            safe_set_full_fp32_param(param, value)

    def restored(self) -> None:
        # fp32 parameters: the master partition, copied from them at construction, takes
        # the restored values; 16-bit ones: set_master wrote the fp32 values themselves
        if not self.half:
            self.inner.refresh_fp32_params()

    def state_bytes(self) -> int:
        return sum(
            value.numel() * value.element_size()
            for state in self.inner.optimizer.state.values()
            for key, value in state.items()
            if key in MOMENT_KEYS
        )
