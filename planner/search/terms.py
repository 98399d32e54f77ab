"""Stage cost matrices for the search, from the simulator's fast cost API.

For one micro-batch size and data-parallel degree, every stage *kind* (GPU type, TP degree)
gets (L+1) x (L+1) matrices over layer ranges [a, b): forward+backward seconds, exposed
all-reduce + optimizer seconds, and peak memory per in-flight count. They are built with
numpy from the CostModel's prefix sums (one vector operation per matrix, not one call per
range), with the same arithmetic as simulate() for a stage whose replicas all sit in one
zone: the search ranks with these and then prices its finalists with simulate() itself.

Called by engine.py; pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
import numpy.typing as npt

from sailplan.planner.search.memopts import (
    OptionTables,
    StageOptions,
    offloaded,
    option_tables,
    recompute_level,
    stage_options,
)
from sailplan.planner.simulator.collectives import AllReduceLayout
from sailplan.planner.simulator.costs import CostModel, StageTable

FloatMatrix = npt.NDArray[np.float64]
BoolMatrix = npt.NDArray[np.bool_]


def _range_matrix(prefix: npt.NDArray[np.float64]) -> FloatMatrix:
    """M[a, b] = prefix[b] - prefix[a] (meaningful for a < b)."""
    return prefix[None, :] - prefix[:, None]


class OptionRows:
    """Rows of a stage kind's compute or tail with the memory options taken, built when the
    DP first reads them: a row where no range takes an option is the plain row itself, so
    a kind that needs options on a few ranges costs a few rows, not a matrix per depth."""

    def __init__(self, plain: list[list[float]], varied: FloatMatrix, used: BoolMatrix) -> None:
        self._plain, self._varied, self._used = plain, varied, used
        # per start layer: does any range take the option (a plain list: read per DP state)
        self._any = cast(list[bool], used.any(axis=1).tolist())
        self._rows: dict[int, list[float]] = {}

    def __getitem__(self, start: int) -> list[float]:
        if not self._any[start]:
            return self._plain[start]
        row = self._rows.get(start)
        if row is None:
            plain = np.asarray(self._plain[start])
            row = np.where(self._used[start], self._varied[start], plain).tolist()
            self._rows[start] = row
        return row


@dataclass(frozen=True)
class KindTables:
    """Cost matrices of one stage kind at one (micro-batch size, data-parallel degree)."""

    gpu_type: str
    tensor_parallel: int
    table: StageTable
    compute: FloatMatrix  # forward + backward of one micro-batch
    tail: FloatMatrix  # exposed all-reduce + optimizer update
    capacity_bytes: float
    _memory_base: FloatMatrix = field(repr=False)
    _memory_per_flight: FloatMatrix = field(repr=False)
    _lists: dict[object, list[list[float]] | list[list[bool]] | OptionRows] = field(
        default_factory=dict, repr=False, compare=False
    )
    # recomputation and offload where a range does not fit without (search/memopts.py);
    # None = the request turned them off, or every range fits without
    options: OptionTables | None = field(default=None, repr=False, compare=False)

    def fits(self, in_flight: int) -> BoolMatrix:
        if self.options is not None:
            fits: BoolMatrix = self.options.choice(in_flight) >= 0
            return fits
        need = self._memory_base + self._memory_per_flight * in_flight
        return need <= self.capacity_bytes

    def stage_options(self, a: int, b: int, in_flight: int) -> StageOptions:
        """The Stage fields (recompute, optimizer_offload) of range [a, b) at this depth."""
        if self.options is None:
            return StageOptions()
        return stage_options(int(self.options.choice(in_flight)[a, b]))

    # Python lists of the matrices for the DP's scalar loops (indexing a list is several
    # times faster than a numpy scalar), built once per kind and reused by every depth.
    def fits_list(self, in_flight: int) -> list[list[bool]]:
        key = ("fits", in_flight)
        if key not in self._lists:
            self._lists[key] = self.fits(in_flight).tolist()
        return self._lists[key]  # type: ignore[return-value]

    def compute_list(self) -> list[list[float]]:
        if "compute" not in self._lists:
            self._lists["compute"] = self.compute.tolist()
        return self._lists["compute"]  # type: ignore[return-value]

    def tail_list(self) -> list[list[float]]:
        if "tail" not in self._lists:
            self._lists["tail"] = self.tail.tolist()
        return self._lists["tail"]  # type: ignore[return-value]

    # the stage's compute and tail with the options its ranges take at an in-flight count
    # (stagedp.Kind.compute_at / tail_at)
    def compute_list_at(self, in_flight: int) -> OptionRows | list[list[float]]:
        key = ("compute", in_flight)
        if key not in self._lists:
            assert self.options is not None
            choice = self.options.choice(in_flight)
            used = recompute_level(choice) > 0
            self._lists[key] = (
                OptionRows(self.compute_list(), self.options.compute_for(choice), used)
                if used.any()
                else self.compute_list()
            )
        return self._lists[key]  # type: ignore[return-value]

    def tail_list_at(self, in_flight: int) -> OptionRows | list[list[float]]:
        key = ("tail", in_flight)
        if key not in self._lists:
            assert self.options is not None
            choice = self.options.choice(in_flight)
            used = offloaded(choice)
            self._lists[key] = (
                OptionRows(self.tail_list_plain(), self.options.tail_offloaded, used)
                if used.any()
                else self.tail_list_plain()
            )
        return self._lists[key]  # type: ignore[return-value]

    def tail_list_plain(self) -> list[list[float]]:
        """The tails without offload (`tail` is the bounds' least of both)."""
        if "tail_plain" not in self._lists:
            assert self.options is not None
            plain = np.where(np.isfinite(self.tail), self.options.tail, np.inf)
            self._lists["tail_plain"] = plain.tolist()
        return self._lists["tail_plain"]  # type: ignore[return-value]

    def memory_bytes(self, a: int, b: int, in_flight: int) -> float:
        """The least memory the range needs (with the options that save the most)."""
        if self.options is not None:
            return self.options.least_memory(a, b, in_flight)
        return float(self._memory_base[a, b] + self._memory_per_flight[a, b] * in_flight)


def kind_tables(
    costs: CostModel,
    *,
    gpu_type: str,
    tp: int,
    mbs: int,
    dp: int,
    layout: AllReduceLayout,
    memory_options: bool = False,
    max_in_flight: int | None = None,
    force_options: bool = False,
) -> KindTables | None:
    """Matrices for a stage of `dp` replicas of (gpu_type, tp) whose all-reduce runs on layout;
    with `memory_options`, recomputation and offload where a range does not fit without
    (with `max_in_flight`, at most that many micro-batches in flight: the pipeline's count);
    `force_options` builds the option tables even where every range fits (the uneven split
    asks a type what an option another type needs costs it)."""
    table = costs.table(gpu_type, tp, mbs)
    if table is None:
        return None
    n = costs.num_layers + 1
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    compute = _range_matrix(table.forward) + _range_matrix(table.backward)
    update = _range_matrix(table.update)
    params = table.parameter_matrix()  # with the shared-parameter copies
    grads = np.where(upper, params * tp * costs.training.gradient_bytes, 0.0)
    allreduce = costs.allreduce_seconds_array(grads, layout, tp)
    if costs.constants.overlap_allreduce and dp > 1:
        # simulate(): what the last backward cannot hide, at least the last bucket
        bucket = costs.group_bucket_bytes(tp)
        last = grads - bucket * np.floor(np.maximum(grads - 1e-9, 0.0) / bucket)
        hidden = np.maximum(0.0, allreduce - _range_matrix(table.backward))
        allreduce = np.maximum(hidden, costs.allreduce_seconds_array(last, layout, tp))
    tail = allreduce + update
    activations = _range_matrix(table.activations)
    boundary = np.zeros((n, 1))
    # a stage that is not first holds its input: row a = a stage starting at layer a
    for a in range(1, n - 1):
        boundary[a, 0] = costs.boundary_bytes(mbs, a)
    base = costs.model_state_bytes(params, dp, tp) + costs.constants.framework_overhead_bytes
    per_flight = (activations + boundary) * costs.constants.activation_allocator_factor
    inf = np.inf
    options = None
    capacity = costs.gpu_memory_bytes(gpu_type)
    # every range fits even at the most micro-batches in flight: nothing to choose
    deepest = base + per_flight * min(costs.num_layers, max_in_flight or costs.num_layers)
    if memory_options and (force_options or not np.all(deepest[upper] <= capacity)):
        options = option_tables(
            costs,
            table,
            dp=dp,
            compute=compute,
            allreduce=allreduce,
            update=update,
            base=np.asarray(base),
            per_flight=per_flight,
            boundary=boundary,
        )
        # the bounds read `tail`: the least of both (offload may beat a slow GPU update)
        tail = np.minimum(tail, options.tail_offloaded)
    return KindTables(
        gpu_type=gpu_type,
        tensor_parallel=tp,
        table=table,
        compute=np.where(upper, compute, inf),
        tail=np.where(upper, tail, inf),
        capacity_bytes=costs.gpu_memory_bytes(gpu_type),
        _memory_base=np.where(upper, base, inf),
        _memory_per_flight=np.where(upper, per_flight, 0.0),
        options=options,
    )
