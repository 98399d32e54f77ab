"""The 1F1B pipeline schedule and the activation exchange between stages.

What crosses a boundary is a tuple of tensors whose shapes ModelSpec.boundary_shapes gives
for the layer where the cut is (the hidden state; inside T5's decoder also the encoder
output); the gradients of the same tensors go back. A tensor the receiving stage did not
use (the encoder output on a stage holding only T5's head) sends back zeros.

Stages may have different TP degrees, so a boundary activation crosses from a TP group of
size a to one of size b like this: after a stage's last row-parallel all-reduce every rank of
its TP group holds the same full hidden state, so only TP rank 0 sends it, point-to-point,
to TP rank 0 of the next stage, which broadcasts it inside its own TP group. Gradients go
back the same way (the column-parallel layers' backward all-reduce leaves the same full
input gradient on every TP rank of the receiving stage).

The schedule is Megatron's non-interleaved 1F1B: `stages - stage - 1` warm-up forwards,
then alternating one forward / one backward, then the cool-down backwards. A send and the
receive that pairs with it are issued together (batch_isend_irecv), which is what keeps
NCCL from deadlocking when two neighbours send to each other at the same time.
Called by the engine once per training step.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sailplan.trainer.layout import RankLayout
from sailplan.trainer.model import Batch, StageModel

Tensors = tuple[torch.Tensor, ...]


@dataclass
class PipelineComm:
    layout: RankLayout
    tp_group: Any  # dist.ProcessGroup of this rank's TP group
    in_shapes: tuple[tuple[int, ...], ...]  # what this stage receives (and sends back grads of)
    out_shapes: tuple[tuple[int, ...], ...]  # what it sends on (and receives grads of)
    dtype: torch.dtype
    device: torch.device

    def _exchange(
        self,
        send_to: int | None,
        tensors: Tensors | None,
        recv_from: int | None,
        shapes: tuple[tuple[int, ...], ...],
    ) -> Tensors | None:
        received = (
            tuple(torch.empty(shape, dtype=self.dtype, device=self.device) for shape in shapes)
            if recv_from is not None
            else None
        )
        if self.layout.tp_rank == 0:
            ops: list[dist.P2POp] = []
            if send_to is not None and tensors is not None:
                # in the dtype the peer receives (the parameters'): a stage whose last op
                # autocast keeps in fp32 still sends 16-bit hidden states under 16-bit
                # parameters (a no-op where the dtypes agree)
                ops.extend(
                    dist.P2POp(dist.isend, t.detach().to(self.dtype).contiguous(), send_to)
                    for t in tensors
                )
            if recv_from is not None and received is not None:
                ops.extend(dist.P2POp(dist.irecv, t, recv_from) for t in received)
            if ops:
                for request in dist.batch_isend_irecv(ops):
                    request.wait()
        if received is not None and self.layout.tp_size > 1:
            for t in received:
                dist.broadcast(t, src=self.layout.tp_root, group=self.tp_group)
        return received

    def recv_forward(self) -> Tensors | None:
        return self._exchange(None, None, self.layout.prev_stage_rank, self.in_shapes)

    def send_forward(self, output: Tensors) -> None:
        self._exchange(self.layout.next_stage_rank, output, None, self.out_shapes)

    def recv_backward(self) -> Tensors | None:
        return self._exchange(None, None, self.layout.next_stage_rank, self.out_shapes)

    def send_backward(self, grad: Tensors | None) -> None:
        self._exchange(self.layout.prev_stage_rank, grad, None, self.in_shapes)

    def send_forward_recv_backward(self, output: Tensors) -> Tensors | None:
        nxt = self.layout.next_stage_rank
        return self._exchange(nxt, output, nxt, self.out_shapes)

    def send_backward_recv_forward(self, grad: Tensors | None) -> Tensors | None:
        prev = self.layout.prev_stage_rank
        return self._exchange(prev, grad, prev, self.in_shapes)


MicroBatchFn = Callable[[int], Batch]


def run_1f1b(
    model: StageModel,
    comm: PipelineComm,
    num_micro_batches: int,
    micro_batch: MicroBatchFn,
    autocast: contextlib.AbstractContextManager[Any] | None = None,
    *,
    after_backward: Callable[[int], None] | None = None,
    loss_divisor: float | None = None,
) -> float:
    """One step's forwards and backwards; returns the pipeline's loss sum over
    `loss_divisor` (default num_micro_batches: its mean loss) on the last stage.

    Gradients accumulate in the parameters' .grad, each micro-batch's loss divided by
    loss_divisor. With the default they are the gradient of the mean loss over the
    pipeline's micro-batches. Under an uneven data split the engine passes the global
    batch's micro-batches per pipeline (sum of the counts / DP), the same for every
    pipeline, so the DP average of the pipelines' sums is the mean over the global batch,
    as in the even split, although the pipelines ran different counts.
    `after_backward(i)` runs after the i-th micro-batch's backward (ZeRO-2 reduces there).
    """
    divisor = float(num_micro_batches) if loss_divisor is None else loss_divisor
    layout = comm.layout
    first, last = layout.is_first_stage, layout.is_last_stage
    in_flight: deque[tuple[Tensors | None, Tensors | torch.Tensor]] = deque()
    total_loss = 0.0
    forwards = backwards = 0

    def forward(received: Tensors | None) -> Tensors:
        nonlocal total_loss, forwards
        batch = micro_batch(forwards) if model.reads_data else None
        forwards += 1
        stage_input = None
        if not first:
            assert received is not None
            stage_input = tuple(t.requires_grad_() for t in received)
        with autocast if autocast is not None else contextlib.nullcontext():
            output = model(stage_input, batch)
        if last:
            assert isinstance(output, torch.Tensor)
            output = output / divisor
            total_loss += float(output.detach())
            in_flight.append((stage_input, output))
            return ()
        assert isinstance(output, tuple)
        in_flight.append((stage_input, output))
        return output

    def backward(grad_output: Tensors | None) -> Tensors | None:
        nonlocal backwards
        stage_input, output = in_flight.popleft()
        if isinstance(output, torch.Tensor):
            output.backward()  # type: ignore[no-untyped-call]
        else:
            assert grad_output is not None
            torch.autograd.backward(output, grad_output)
        if after_backward is not None:
            after_backward(backwards)
        backwards += 1
        if stage_input is None:
            return None
        return tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in stage_input)

    warmup = min(layout.num_stages - layout.stage - 1, num_micro_batches)
    remaining = num_micro_batches - warmup
    for _ in range(warmup):
        output = forward(comm.recv_forward())
        if not last:
            comm.send_forward(output)
    received = comm.recv_forward() if remaining > 0 else None
    for i in range(remaining):
        output = forward(received)
        grad_output = None if last else comm.send_forward_recv_backward(output)
        grad_input = backward(grad_output)
        if i == remaining - 1:
            received = None
            if not first:
                comm.send_backward(grad_input)
        elif first:
            received = None
        else:
            received = comm.send_backward_recv_forward(grad_input)
    for _ in range(warmup):
        grad_output = None if last else comm.recv_backward()
        grad_input = backward(grad_output)
        if not first:
            comm.send_backward(grad_input)
    return total_loss
