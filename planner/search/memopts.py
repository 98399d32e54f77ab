"""Memory options per stage for the search: activation recomputation and optimizer offload.

A stage that does not fit in its GPU's memory may still fit with selective activation
recomputation (Stage.recompute = "selective": only the attention cores, QK^T, softmax and
attention over V, are recomputed in the backward; profiles/selective.py), with full
recomputation (Stage.recompute = "full": only the layers' outputs are kept per micro-batch,
every forward runs again in the backward) or with its optimizer state offloaded to host
memory (Stage.optimizer_offload: DeepSpeed's CPU Adam, the update on the CPU and the copies
over the GPU's host link), or with offload and one of the recomputations. The simulator
prices each (CostModel.stage_memory_bytes, stage_seconds, stage_update_seconds); this module
gives the search, per layer range of one stage kind and per number of micro-batches in
flight, the option it takes:

- none, where the stage fits without options: an option never makes a stage itself faster,
  so plans only use one where it makes them feasible (or lets a faster split fit);
- else the first that fits of offload, selective, selective + offload, full, full +
  offload (the codes' order). The order keeps the DP exact in its pruning: a stage's
  compute time must not fall as it takes more layers (stagedp.solve stops at the first end
  layer that is too slow), and with this order the option only moves towards more
  recomputation as the range grows (memory grows with it), so the time per micro-batch
  stays monotone (none = offload <= selective <= full). Offload first: it adds time once
  per iteration, recomputation to every micro-batch's backward; selective before full: it
  repeats only the attention cores' forward, a fraction of the layers'. Offload is tried
  only where the catalog gives the GPU's host link (and, where it knows the host memory
  per GPU, only where the offloaded state fits there); selective only on ranges with
  attention cores whose scores are stored (not a convnet's, not under flash attention).

A code is the offload bit plus twice the recomputation level (0 none, 1 selective, 2 full).

Pure numpy over the (L+1) x (L+1) range matrices of search/terms.py; `reason` words the
choice for a plan's reason. Called by terms.kind_tables and engine.search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypedDict

import numpy as np
import numpy.typing as npt

from sailplan.planner.plan import Plan
from sailplan.planner.simulator.context import PlanningContext
from sailplan.planner.simulator.costs import CostModel, StageTable

FloatMatrix = npt.NDArray[np.float64]
BoolMatrix = npt.NDArray[np.bool_]
GIB = 1024**3

# RECOMPUTE and BOTH: full recomputation without and with offload
NONE, OFFLOAD, SELECTIVE, SELECTIVE_OFFLOAD, RECOMPUTE, BOTH = 0, 1, 2, 3, 4, 5
CODES = (NONE, OFFLOAD, SELECTIVE, SELECTIVE_OFFLOAD, RECOMPUTE, BOTH)
_LEVELS: tuple[Literal["none", "selective", "full"], ...] = ("none", "selective", "full")


def offloaded(codes: npt.NDArray[np.int8]) -> BoolMatrix:
    """Per range: does the option code offload the optimizer (-1 = none fits: no)."""
    out: BoolMatrix = (codes >= 0) & (codes % 2 == 1)
    return out


def recompute_level(codes: npt.NDArray[np.int8]) -> npt.NDArray[np.int8]:
    """Per range: 0 no recomputation, 1 selective, 2 full (-1 codes: 0)."""
    out: npt.NDArray[np.int8] = np.maximum(codes, 0) // 2
    return out


def union_codes(a: npt.NDArray[np.int8], b: npt.NDArray[np.int8]) -> npt.NDArray[np.int8]:
    """The option two types' codes need together: offload if either offloads, the more
    recomputation of the two (codes -1 count as none)."""
    offload = (offloaded(a) | offloaded(b)).astype(np.int8)
    level = np.maximum(recompute_level(a), recompute_level(b))
    out: npt.NDArray[np.int8] = (2 * level + offload).astype(np.int8)
    return out


def _range_matrix(prefix: FloatMatrix) -> FloatMatrix:
    return prefix[None, :] - prefix[:, None]


def _range_max(values: FloatMatrix) -> FloatMatrix:
    """M[a, b] = max(values[a:b]) for a < b (0 elsewhere)."""
    n = len(values) + 1
    # row a: the values from layer a on, then their running maximum along the row
    rows = np.where(np.arange(n - 1)[None, :] >= np.arange(n)[:, None], values[None, :], 0.0)
    out = np.zeros((n, n))
    out[:, 1:] = np.maximum.accumulate(rows, axis=1)
    return out


@dataclass(frozen=True)
class OptionTables:
    """Memory and time of one stage kind's ranges under each option (search/terms.py)."""

    base: tuple[FloatMatrix, ...]  # per option: bytes not multiplied by in-flight count
    per_flight: tuple[FloatMatrix, ...]  # per option: bytes per micro-batch in flight
    allowed: tuple[BoolMatrix, ...]  # per option: may it be used at all (offload: host)
    capacity_bytes: float
    compute: FloatMatrix  # without recomputation
    compute_recomputed: FloatMatrix  # full recomputation
    compute_selective: FloatMatrix
    tail: FloatMatrix  # without offload
    tail_offloaded: FloatMatrix
    # offload's host memory per GPU per range, and what the kind's nodes have (None =
    # unknown, not checked)
    host_bytes: FloatMatrix | None = None
    host_capacity_bytes: float | None = None
    _choices: dict[int, npt.NDArray[np.int8]] = field(default_factory=dict, compare=False)
    _least: dict[int, list[list[float]]] = field(default_factory=dict, compare=False)

    def need(self, option: int, in_flight: int) -> FloatMatrix:
        need: FloatMatrix = self.base[option] + self.per_flight[option] * in_flight
        return need

    def choice(self, in_flight: int) -> npt.NDArray[np.int8]:
        """Per range: the option code taken (the first of CODES that fits), -1 = none fits."""
        cached = self._choices.get(in_flight)
        if cached is None:
            cached = np.full(self.compute.shape, -1, dtype=np.int8)
            for option in reversed(CODES):
                fits = (self.need(option, in_flight) <= self.capacity_bytes) & self.allowed[option]
                cached = np.where(fits, np.int8(option), cached)
            self._choices[in_flight] = cached
        return cached

    def compute_at(self, in_flight: int) -> FloatMatrix:
        return self.compute_for(self.choice(in_flight))

    def compute_for(self, codes: npt.NDArray[np.int8]) -> FloatMatrix:
        """Per range: the compute time under option `codes`."""
        level = recompute_level(codes)
        out: FloatMatrix = np.select(
            [level == 2, level == 1],
            [self.compute_recomputed, self.compute_selective],
            self.compute,
        )
        return out

    def tail_at(self, in_flight: int) -> FloatMatrix:
        return np.where(offloaded(self.choice(in_flight)), self.tail_offloaded, self.tail)

    def least_memory(self, a: int, b: int, in_flight: int) -> float:
        """The least memory range [a, b) needs with any option it may take."""
        least = self._least.get(in_flight)
        if least is None:
            needs = [
                np.where(self.allowed[option], self.need(option, in_flight), np.inf)
                for option in CODES
            ]
            least = self._least[in_flight] = np.min(needs, axis=0).tolist()
        return float(least[a][b])

    def host_refusal(self, a: int, b: int, in_flight: int) -> str:
        """Why offload, which would fit range [a, b) in GPU memory, was not taken: its host
        memory per GPU against the nodes' ("" where that is not what stopped it)."""
        if self.host_bytes is None or self.host_capacity_bytes is None:
            return ""
        gpu_fits = self.need(OFFLOAD, in_flight)[a, b] <= self.capacity_bytes
        host = float(self.host_bytes[a, b])
        if not gpu_fits or host <= self.host_capacity_bytes:
            return ""
        return (
            f"optimizer offload would fit it on the GPU but needs {host / GIB:.1f} GiB of host "
            f"memory per GPU, the nodes have {self.host_capacity_bytes / GIB:.1f} GiB"
        )


def option_tables(
    costs: CostModel,
    table: StageTable,
    *,
    dp: int,
    compute: FloatMatrix,
    allreduce: FloatMatrix,
    update: FloatMatrix,
    base: FloatMatrix,
    per_flight: FloatMatrix,
    boundary: FloatMatrix,
) -> OptionTables:
    """The option matrices of one kind, from terms.kind_tables' own (same arithmetic as
    CostModel.stage_memory_bytes and simulate() with the stage's options)."""
    factor = costs.constants.activation_allocator_factor
    overhead = costs.constants.framework_overhead_bytes
    tp = table.tensor_parallel
    params = table.parameter_matrix()  # with the shared-parameter copies
    n = costs.num_layers + 1
    assert table.kept_outputs is not None and table.layer_activations is not None
    kept = (_range_matrix(table.kept_outputs) + boundary) * factor
    recompute_base = base + _range_max(table.layer_activations) * factor
    # selective: each range keeps all but its attention cores, and holds its largest again
    assert table.attention_core is not None and table.core_forward is not None
    cores = _range_matrix(np.concatenate(([0.0], np.cumsum(table.attention_core))))
    selective_flight = per_flight - cores * factor
    selective_base = base + _range_max(table.attention_core) * factor
    selective_ok = cores > 0
    offload_states = costs.model_states(params, dp, tp, offload=True)
    offload_base = np.asarray(offload_states.total) + overhead
    no = np.zeros((n, n), dtype=bool)
    yes = np.ones((n, n), dtype=bool)
    link = costs.context.catalog.gpu(table.gpu_type).host_link_bytes_per_s
    host_bytes = np.asarray(offload_states.host)
    host = None
    if link is None or costs.context.optimizer != "adam":
        # unpriced without the host link; DeepSpeed's offload updates with CPU Adam only
        offload_ok, offload_tail = no, allreduce + update
    else:
        host = costs.host_memory_bytes(table.gpu_type)
        offload_ok = yes if host is None else host_bytes <= host
        offload_tail = allreduce + np.asarray(costs.offload_seconds(table.gpu_type, params, dp))
    return OptionTables(
        base=(
            base,
            offload_base,
            selective_base,
            offload_base + (selective_base - base),
            recompute_base,
            offload_base + (recompute_base - base),
        ),
        per_flight=(per_flight, per_flight, selective_flight, selective_flight, kept, kept),
        allowed=(yes, offload_ok, selective_ok, selective_ok & offload_ok, yes, offload_ok),
        capacity_bytes=costs.gpu_memory_bytes(table.gpu_type),
        compute=compute,
        compute_recomputed=compute + _range_matrix(table.forward),
        compute_selective=compute + _range_matrix(table.core_forward),
        tail=allreduce + update,
        tail_offloaded=offload_tail,
        host_bytes=host_bytes,
        host_capacity_bytes=host,
    )


class StageOptions(TypedDict, total=False):
    """The Stage fields a memory option sets."""

    recompute: Literal["none", "selective", "full"]
    optimizer_offload: bool


def stage_options(code: int) -> StageOptions:
    """Stage fields of an option code (>= 0)."""
    return StageOptions(recompute=_LEVELS[code // 2], optimizer_offload=code % 2 == 1)


def reason(plan: Plan, context: PlanningContext) -> str:
    """One sentence per stage that uses a memory option: what it takes, with the stage's
    predicted peak memory without and with it (simulate()'s terms)."""
    costs = context.costs
    parts = []
    for index, stage in enumerate(plan.stages):
        if stage.recompute == "none" and not stage.optimizer_offload:
            continue
        a, b = stage.layer_start, stage.layer_end
        without = with_options = 0.0
        for replica in stage.replicas:
            table = costs.require_table(
                replica.gpu_type, stage.tensor_parallel, plan.micro_batch_size
            )
            for options, recompute, offload in (
                (False, "none", False),
                (True, stage.recompute, stage.optimizer_offload),
            ):
                memory = costs.stage_memory_bytes(
                    table,
                    a,
                    b,
                    stage=index,
                    num_stages=plan.pipeline_depth,
                    num_micro_batches=plan.num_micro_batches,
                    data_parallel=plan.data_parallel,
                    recompute=recompute,
                    offload=offload,
                )
                if options:
                    with_options = max(with_options, memory)
                else:
                    without = max(without, memory)
        what = []
        if stage.recompute == "full":
            what.append("recomputes activations")
        elif stage.recompute == "selective":
            what.append("recomputes its attention cores (selective)")
        if stage.optimizer_offload:
            what.append("offloads the optimizer to the CPU")
        type_names = sorted({r.gpu_type for r in stage.replicas})
        sentence = (
            f"stage {index} on {'/'.join(type_names)} {' and '.join(what)}: "
            f"{without / GIB:.1f} GiB without, {with_options / GIB:.1f} GiB with"
        )
        if stage.optimizer_offload:
            table = costs.require_table(type_names[0], stage.tensor_parallel, plan.micro_batch_size)
            host = costs.stage_host_bytes(table, a, b, plan.data_parallel)
            unknown = [t for t in type_names if costs.host_memory_bytes(t) is None]
            sentence += f", {host / GIB:.1f} GiB of host memory per GPU" + (
                f" (not checked: the catalog does not know {'/'.join(unknown)} nodes' memory)"
                if unknown
                else ""
            )
        parts.append(sentence)
    return "; ".join(parts)
