"""The training loop of one rank: groups, model shard, optimizer, steps, checkpoints, stop.

Every rank of the world runs this with the same Plan and TrainerConfig. It creates the
process groups (every rank creates every group, in the order sailplan.trainer.layout lists
them, as torch.distributed requires), builds and initialises its stage's layers for its TP
rank, restores the newest complete checkpoint if there is one (whatever plan wrote it), and
then per step: the 1F1B schedule, the DP gradient reduction and optimizer update (DeepSpeed
ZeRO-1 by default, see sailplan.trainer.optimizer),
and one small world all-reduce (sailplan.trainer.control) that carries the stop flag, the
loss and each rank's GPU energy of the step (so every rank agrees on when to stop, and rank
0 reports the global loss and the job's joules per step); on a GPU, each rank's peak memory
of the step, gathered over its worker (sailplan.trainer.peak_memory). Called by
sailplan.trainer.train.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sailplan.planner.plan import Plan
from sailplan.planner.simulator.ties import shared_users
from sailplan.planner.workerenv import TrainerConfig
from sailplan.trainer import data as data_mod
from sailplan.trainer.checkpoint import (
    FORMAT_VERSION,
    Checkpointer,
    CheckpointStore,
    gather_full,
    restore_state,
)
from sailplan.trainer.control import reduce_step
from sailplan.trainer.energy import gpu_meter
from sailplan.trainer.layout import RankLayout, dp_groups, rank_layout, tp_groups
from sailplan.trainer.model import (
    StageModel,
    local_shard,
    logical_shape,
    shared_weight,
)
from sailplan.trainer.optimizer import make_optimizer
from sailplan.trainer.peak_memory import RankPeak, device_peaks
from sailplan.trainer.precision import MixedPrecision, effective_precision, parameter_dtype
from sailplan.trainer.progress import Reporter
from sailplan.trainer.schedule import MicroBatchFn, PipelineComm, run_1f1b
from sailplan.trainer.stopping import StopSignal
from sailplan.trainer.tokenfile import DataError
from sailplan.trainer.tp import TPGroup


@dataclass
class Groups:
    tp: TPGroup
    tp_handle: Any
    dp: Any
    dp_size: int
    checkpoint: Any
    control: Any
    # per shared parameter (ties.shared_users): TP rank 0 of each stage of this pipeline
    # that uses it, when more than one does
    ties: dict[str, Any]


def build_groups(plan: Plan, layout: RankLayout) -> Groups:
    """Create all process groups in a plan-determined order; keep this rank's."""
    tp_handle = dp_handle = None
    for ranks in tp_groups(plan):
        if len(ranks) > 1:
            group = dist.new_group(list(ranks))
            if layout.rank in ranks:
                tp_handle = group
    # an offloaded stage runs DeepSpeed's ZeRO optimizer even alone, which needs a group
    offload = any(s.optimizer_offload for s in plan.stages)
    for ranks in dp_groups(plan):
        if len(ranks) > 1 or offload:
            group = dist.new_group(list(ranks))
            if layout.rank in ranks:
                dp_handle = group
    # The background checkpoint writer runs its collectives on its own gloo group so they
    # never interleave with the training collectives of the main thread.
    ties: dict[str, Any] = {}
    workers = plan.workers()
    for name, users in sorted(shared_users(plan.model).items()):
        stages = {
            i
            for i, s in enumerate(plan.stages)
            if set(users) & set(range(s.layer_start, s.layer_end))
        }
        if len(stages) < 2:
            continue
        for replica in range(plan.data_parallel):
            ends = [w.first_rank for w in workers if w.replica == replica and w.stage in stages]
            group = dist.new_group(ends)
            if layout.rank in ends:
                ties[name] = group
    # The per-step stop/loss all-reduce has a gloo group of its own too (host tensors, and
    # it runs while a background save may be using the checkpoint group).
    world = list(range(plan.world_size))
    checkpoint = dist.new_group(world, backend="gloo")
    control = dist.new_group(world, backend="gloo")
    return Groups(
        tp=TPGroup(rank=layout.tp_rank, size=layout.tp_size, group=tp_handle),
        tp_handle=tp_handle,
        dp=dp_handle,
        dp_size=len(layout.dp_ranks),
        checkpoint=checkpoint,
        control=control,
        ties=ties,
    )


class Trainer:
    def __init__(
        self,
        plan: Plan,
        config: TrainerConfig,
        *,
        rank: int,
        local_rank: int,
        device: torch.device,
        generation: int,
        stop: StopSignal,
    ) -> None:
        self.plan, self.config = plan, config
        self.rank, self.device = rank, device
        self.generation = generation
        self.stop = stop
        self.layout = rank_layout(plan, rank)
        self.groups = build_groups(plan, self.layout)
        # One collective over the whole default group before any point-to-point: NCCL sets up
        # the world communicator here, which batched send/recv between stage pairs expects.
        dist.all_reduce(torch.zeros(1, device=device))
        stage = plan.stages[self.layout.stage]
        self.model = StageModel(plan.model, stage.layer_start, stage.layer_end, self.groups.tp)
        self.model.set_recompute(stage.recompute)
        self.model.initialise(config.seed)
        # 16-bit parameters (Plan.half_parameters): the fp32 initialisation rounded, as
        # DeepSpeed's bf16/fp16 mode holds a model built in fp32 and cast
        self.dtype = parameter_dtype(plan.precision, plan.half_parameters)
        self.model.to(device=device, dtype=self.dtype)
        self.params = list(self.model.parameters())
        self.optimizer = make_optimizer(
            self.params,
            kind=plan.optimizer,
            lr=config.learning_rate,
            zero_stage=config.zero_stage,
            dp_group=self.groups.dp,
            dp_size=self.groups.dp_size,
            tp_group=self.groups.tp_handle,
            offload=stage.optimizer_offload,
            num_micro_batches=plan.micro_batches_of(self.layout.replica),
        )
        # Only the stages whose layers read the micro-batch (the pipeline ends, T5's first
        # decoder block) read data; opening here fails fast on a bad URL.
        self.reads_data = self.model.reads_data
        self.source: data_mod.TokenSource | None = None
        if self.reads_data:
            try:
                self.source = data_mod.make_samples(config.data, plan.model)
            except DataError as error:
                raise SystemExit(f"sailplan-train: rank {rank}: {error}") from None
        self.fields = data_mod.batch_fields(plan.model)
        self.batches: data_mod.StepBatches | None = None
        mbs, layers = plan.micro_batch_size, plan.model.num_layers
        self.comm = PipelineComm(
            layout=self.layout,
            tp_group=self.groups.tp_handle,
            in_shapes=plan.model.boundary_shapes(mbs, stage.layer_start)
            if stage.layer_start > 0
            else (),
            out_shapes=plan.model.boundary_shapes(mbs, stage.layer_end)
            if stage.layer_end < layers
            else (),
            dtype=self.dtype,
            device=device,
        )
        self.store = CheckpointStore(config.checkpoint_dir)
        self.checkpointer = Checkpointer(
            self.store,
            rank=rank,
            process_group=self.groups.checkpoint,
            keep=config.checkpoints_to_keep,
        )
        self.reporter = Reporter(rank=rank, local_rank=local_rank, generation=generation)
        # this rank's GPU energy counter (off on the CPU or without NVML)
        self.energy = gpu_meter(device)
        # this rank's peak GPU memory per step (off on the CPU)
        self.peak_memory = device_peaks(device)
        # autocast over fp32 master weights (the parameters, or the optimizer's copies of
        # 16-bit ones); fp16 with a loss scale, divided out in fp32
        self.precision = MixedPrecision(
            effective_precision(plan.precision, config.mixed_precision, device),
            device,
            self.params,
            self.model,
            unscale_in_hooks=self.dtype == torch.float32,
        )
        self.autocast = self.precision.autocast()

    # -- checkpoints ---------------------------------------------------------------------

    def restore(self) -> int:
        """Resume from the newest complete checkpoint; returns the first step to run."""
        latest = self.store.latest()
        # Rank 0 decides, so a marker appearing mid-scan cannot split the world.
        choice = torch.tensor([latest.step if latest else -1], dtype=torch.int64)
        dist.broadcast(choice, src=0, group=self.groups.control)
        step = int(choice.item())
        if step < 0:
            return 0
        info = next((i for i in self.store.complete() if i.step == step), None)
        if info is None:
            raise SystemExit(
                f"rank 0 resumes from step {step} but rank {self.rank} does not see that "
                f"checkpoint under {self.config.checkpoint_dir}: the directory must be shared"
            )
        saved_model = info.marker.get("model", {})
        if saved_model != json.loads(self.plan.model.model_dump_json()):
            raise SystemExit(
                f"checkpoint {info.path} holds model {saved_model.get('name')!r}, "
                f"this plan trains {self.plan.model.name!r}"
            )
        restore_state(
            store=self.store,
            info=info,
            model=self.model,
            optimizer=self.optimizer,
            tp=self.groups.tp,
            process_group=self.groups.checkpoint,
        )
        self.checkpointer.last_complete = step
        self.reporter.event("restored", step=step, path=info.path)
        return step

    def save(self, step: int, wait: bool) -> None:
        marker = {
            "format": FORMAT_VERSION,
            "step": step,
            "samples_consumed": step * self.plan.global_batch_size,
            "seed": self.config.seed,
            "data": json.loads(self.config.data.model_dump_json()),
            "model": json.loads(self.plan.model.model_dump_json()),
            "optimizer": self.plan.optimizer,
            "optimizer_moments": self.plan.optimizer == "adam",
            "plan_generation": self.generation,
            "written_by": {
                "stages": [[s.layer_start, s.layer_end] for s in self.plan.stages],
                "tensor_parallel": [s.tensor_parallel for s in self.plan.stages],
                "data_parallel": self.plan.data_parallel,
            },
            # No RNG state is carried: initialisation and data are pure functions of
            # (seed, layer, sample index) and the model has no dropout.
            "rng": "counter-based",
        }
        self.checkpointer.save(
            step,
            model=self.model,
            optimizer=self.optimizer,
            tp=self.groups.tp,
            tp_root=self.layout.tp_root,
            saves_parameters=self.layout.replica == 0,
            marker=marker,
        )
        if wait:
            self.checkpointer.wait()

    # -- the loop --------------------------------------------------------------------------

    def _micro_batch(self, step: int) -> MicroBatchFn:
        micros: list[dict[str, torch.Tensor]] = []
        if self.batches is not None:
            try:
                micros = self.batches.micro_batches(step, self.fields)
            except DataError as error:
                raise SystemExit(f"sailplan-train: rank {self.rank}: {error}") from None

        def fetch(micro: int) -> dict[str, torch.Tensor]:
            return {key: value.to(self.device) for key, value in micros[micro].items()}

        return fetch

    def train_step(self, step: int) -> float:
        """One optimizer step; returns this pipeline's loss on the last stage (0.0 elsewhere)."""
        # this step's scale: step_ok may change it before the optimizer divides by it
        scale, grad_scale = self.precision.loss_scale, self.precision.grad_scale
        plan = self.plan
        loss = run_1f1b(
            self.model,
            self.comm,
            plan.micro_batches_of(self.layout.replica),
            self._micro_batch(step),
            self.autocast if self.autocast is not None else contextlib.nullcontext(),
            after_backward=self.optimizer.after_backward,
            # under an uneven split the pipelines run different counts: dividing each by
            # the mean count keeps the DP average equal to the global batch's mean loss
            loss_divisor=plan.global_batch_size / (plan.micro_batch_size * plan.data_parallel),
        )
        self.sync_shared_gradients()
        if self.precision.step_ok(self.groups.control):
            self.optimizer.step(grad_scale)
        else:
            self.optimizer.skip()
        return loss / scale

    def sync_shared_gradients(self) -> None:
        """Sum the gradients of every shared parameter over the stages that use it (layer
        0's token matrix and a tied head's or T5 decoder's copy; T5's position bias tables).

        The stages may have different TP degrees, so the TP rank 0 of each gathers the full
        gradient, they all-reduce it, and each broadcasts it back into its TP group and
        keeps its shard. All copies then take the same update and stay equal. (Under ZeRO-2
        the gradients are already averaged over the replicas here; the sum is the same.)
        """
        for name, module in self.model.shared_across_stages():
            weight, split = shared_weight(module)
            grad = self.optimizer.gradient(weight)
            full = gather_full(grad, split, self.groups.tp, self.layout.tp_root)
            if full is None:
                full = torch.empty(
                    logical_shape(weight.shape, split), dtype=grad.dtype, device=weight.device
                )
            else:
                dist.all_reduce(full, group=self.groups.ties[name])
            if self.groups.tp.size > 1:
                dist.broadcast(full, src=self.layout.tp_root, group=self.groups.tp_handle)
            self.optimizer.set_gradient(weight, local_shard(full, split, self.groups.tp).clone())

    def worker_peaks(self, own: tuple[int, int] | None) -> list[RankPeak] | None:
        """The step's peak memory of every rank of this worker (its TP group, gathered on
        each of them), from this rank's `own` (allocated, reserved); None when not measured
        (the CPU: then no rank of the worker measures, so none enters the gather)."""
        if own is None:
            return None
        mine = torch.tensor(own, dtype=torch.int64, device=self.device)
        values = [mine]
        if self.groups.tp.size > 1:
            values = [torch.empty_like(mine) for _ in self.layout.tp_ranks]
            dist.all_gather(values, mine, group=self.groups.tp_handle)
        return [
            RankPeak(
                rank=rank,
                stage=self.layout.stage,
                allocated=int(value[0]),
                reserved=int(value[1]),
            )
            for rank, value in zip(self.layout.tp_ranks, values, strict=True)
        ]

    def run(self) -> str:
        """Train to config.steps or until asked to stop; returns why it ended."""
        start = self.restore()
        if self.source is not None:
            self.batches = data_mod.StepBatches(
                self.source,
                self.plan,
                self.layout.replica,
                first=start,
                last=self.config.steps,
                depth=self.config.data.prefetch_steps,
            )
        try:
            return self._loop(start)
        finally:
            if self.batches is not None:
                self.batches.close()

    def _loop(self, start: int) -> str:
        interval = self.config.checkpoint_interval_steps
        reason = "finished"
        self.energy.start()
        for step in range(start, self.config.steps):
            began = time.perf_counter()
            loss = self.train_step(step)
            peaks = self.worker_peaks(self.peak_memory.window())
            stopping = self.stop.requested()
            owns_loss = self.layout.is_last_stage and self.layout.tp_rank == 0
            totals = reduce_step(
                stopping=stopping,
                loss_share=loss / self.plan.data_parallel if owns_loss else 0.0,
                joules=self.energy.step(),
                group=self.groups.control,
                world_size=self.plan.world_size,
            )
            done = step + 1
            seconds = time.perf_counter() - began
            self.checkpointer.poll()
            self.reporter.step(
                done,
                totals.loss,
                self.plan.global_batch_size / seconds,
                self.checkpointer.last_complete,
                seconds,
                joules=totals.joules,
                memory=peaks,
            )
            stop_now = totals.stop
            last = done == self.config.steps
            if stop_now or last or done % interval == 0:
                self.save(done, wait=stop_now or last)
            if stop_now:
                reason = self.stop.reason or "peer-requested"
                break
        self.checkpointer.wait()
        dist.barrier(group=self.groups.control)
        self.reporter.event(
            "stopped", reason=reason, last_checkpoint_step=self.checkpointer.last_complete
        )
        return reason


def init_world(
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    timeout_s: float,
) -> torch.device:
    """Join the world process group: NCCL on a GPU when there is one, gloo on the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return device
