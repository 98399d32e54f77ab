"""Can the layers still to place keep the steady-state cycle a plan needs, with the GPUs left?

The stage DP (stagedp.py) keeps one Pareto front per (end layer, GPUs used per slot, last
kind). On deep pipelines of large models over scarce fast GPUs the number of usage vectors
explodes, and most of those partial plans are doomed from the start: a plan that beats the
bar B needs every stage's cycle (its forward+backward plus the hops on both sides) within

    C = (B - F) / (M - 1),

F being the DP's own lower bound of everything but the steady state (the fastest time of
every layer, the cheapest hop per boundary, the least tail of the longest stage). Memory
forces the stages early in the pipeline (many micro-batches in flight) onto high TP degrees,
and a cycle of C forces slow kinds onto short layer ranges, so covering the layers left can
need more GPUs than are left. The DP only learned that when it ran out of capacity, stages
later (row 6 of benchmarks/search_speed.py spent seconds per triple on such labels).

This module answers, per DP call (the limit depends on the bar), the relaxed question
exactly: the least *weighted* GPU count that covers layers [b, L) with r stages, each at the
position it would hold (its in-flight micro-batches decide its memory), each of a kind whose
range fits in memory and whose time plus the cheapest hop into and out of it (over every
neighbouring kind) is at most C. Any plan that can still beat the bar uses at least that
many weighted GPUs for those stages, for every weighting whose condition holds
(stagedp.Weighting: a stage of kind k takes at least its GPUs times kind[k], the slots
already used hold at least usage[i] x slot[i], the cluster has `capacity` in all). The
weightings are the work bound's (GPU count and speed powers) and Hall's condition per usage
slot and over all slots (capacity.py: a slot's stages fit on the pools that may serve it).
Kinds' zone symmetry breaking is ignored, which only loosens the bound. So dropping a partial
plan that cannot cover the rest is exact: tests/planner/test_cyclebound.py checks the bound
against brute force and the DP with it against the DP without.

Each row is minimised by its own covering, so every row can pass while no single covering
passes them all: on row 6 the least GPU count covers the layers with the scarce fast type
alone, and the least fast-type use needs twice the cluster. When the rows alone leave room,
the bound also tries every pair of rows, each scaled to its capacity, added with weights
(a Lagrangian relaxation: a non-negative sum of valid constraints is one). That proves
most of row 6's deep single-pipeline DPs empty before they start, 30% below their optimum.

The recurrence is a min-plus sweep over positions, vectorised over kinds and rows: a range's
time grows with its end layer and its memory too (the DP relies on both), so the ends a
range may take from a start lie in an interval that starts at the next layer, and the best
continuation over it is a range minimum of the row after (a sparse table). A row for r
stages that do not include the pipeline's first does not depend on the depth, so a group
keeps its rows per cycle and the DPs of all its depths share them; the cycle is rounded up
to a 1/256 step for that (a bound at a longer cycle is looser, and still valid).

Called by stagedp.solve with the inputs engine._group builds once per (micro-batch, DP
degree, kinds). Pure numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

# relative slack on weighted capacities: speed weights are floats, and a plan exactly at
# capacity must not be dropped by rounding
_SLACK = 1e-9
# weights of the second constraint of a pair, relative to the first, in the paired rows
# (CycleRoom): a factor-2 ladder around 1. On row 6 of benchmarks/search_speed.py every
# DP the pairs prove infeasible is proved so by a multiplier within 1/8 to 8, nine in ten
# of them within 1/4 to 4.
_MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0)
# rooms are built at cycles rounded up to powers of 1 + this (CycleRoom): a DP's bar moves
# its cycle by less than that between the depths of a group, so they share their rows
_CYCLE_STEP = 1 / 256
# cycles whose rows a group keeps (each up to a row per position and constraint row)
_CYCLES_KEPT = 8


@dataclass
class CycleInputs:
    """What the bound needs of one (micro-batch, DP degree, kinds); depth- and bar-free.

    compute_at(f): per kind, (L+1) x (L+1) seconds of a stage over [a, b) with f micro-
    batches in flight (with the memory options it takes there; non-decreasing in b);
    fits(f): per kind, whether [a, b) fits with f in flight (non-increasing in b).
    hop_in[b, k]: least hop into a stage of kind k that starts at layer b (row 0 unused);
    hop_out[b, k]: least hop out of a stage of kind k that ends at layer b (row L unused).
    kind_cost[w, k]: weighted GPUs a stage of kind k takes under weighting w;
    slot_weight[w, i]: weight of one GPU counted in usage slot i; capacity[w]: the total.
    """

    compute_at: Callable[[int], Sequence[FloatArray]]
    fits: Callable[[int], Sequence[BoolArray]]
    hop_in: FloatArray
    hop_out: FloatArray
    kind_cost: FloatArray
    slot_weight: FloatArray
    capacity: FloatArray
    # per in-flight count: the kinds' last fitting end per start, and their times (kept for
    # every DP of the group: building them was most of a room's cost)
    _fit_ends: dict[int, IntArray] = field(default_factory=dict, repr=False)
    _times: dict[int, FloatArray] = field(default_factory=dict, repr=False)
    # the latest cycles' shared rows (CycleRoom), oldest first
    _cycles: dict[tuple[int, float], _AtCycle] = field(default_factory=dict, repr=False)
    # the pairs' rows (_pairs), built when a room first needs them
    _paired: tuple[FloatArray, FloatArray, FloatArray] | None = field(default=None, repr=False)

    @property
    def num_layers(self) -> int:
        return int(self.hop_in.shape[0]) - 1

    def times(self, in_flight: int) -> FloatArray:
        """[k, a, b]: compute_at(in_flight) of every kind, as one array."""
        cached = self._times.get(in_flight)
        if cached is None:
            cached = np.stack([np.asarray(m, dtype=np.float64) for m in self.compute_at(in_flight)])
            self._times[in_flight] = cached
        return cached

    def at_cycle(self, micro_batches: int, cycle: float) -> _AtCycle:
        """The shared rows at `cycle` rounded up to the next power of 1 + _CYCLE_STEP."""
        if cycle > 0.0 and np.isfinite(cycle):
            step = np.log1p(_CYCLE_STEP)
            cycle = max(cycle, float(np.exp(np.ceil(np.log(cycle) / step) * step)))
        key = (micro_batches, cycle)
        at = self._cycles.pop(key, None)
        if at is None:
            at = _AtCycle(self, micro_batches, cycle)
            if len(self._cycles) >= _CYCLES_KEPT:
                del self._cycles[next(iter(self._cycles))]
        self._cycles[key] = at
        return at

    def paired(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(kind_cost, slot_weight, capacity) of every pair of the inputs' rows (_pairs)."""
        if self._paired is None:
            self._paired = _pairs(self.kind_cost, self.slot_weight, self.capacity)
        return self._paired

    def fit_ends(self, in_flight: int) -> IntArray:
        """[k, a]: the last end b whose range [a, b) fits (a when none does)."""
        cached = self._fit_ends.get(in_flight)
        if cached is None:
            fits = np.stack([np.asarray(m, dtype=bool) for m in self.fits(in_flight)])
            cached = _last_true(fits & _later(self.num_layers + 1))
            self._fit_ends[in_flight] = cached
        return cached


def _later(n: int) -> BoolArray:
    """[a, b] = b > a: the ends a stage starting at a may have."""
    starts = np.arange(n)
    later: BoolArray = starts[None, :] > starts[:, None]
    return later


def _last_true(ok: BoolArray) -> IntArray:
    """[..., a]: the last b with ok[..., a, b] (a when there is none)."""
    n = ok.shape[-1]
    last = n - 1 - np.argmax(ok[..., ::-1], axis=-1)
    starts = np.broadcast_to(np.arange(n), last.shape)
    found: IntArray = np.where(ok.any(axis=-1), last, starts).astype(np.int64)
    return found


def _pairs(
    kind_cost: FloatArray, slot_weight: FloatArray, capacity: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Every pair of the inputs' constraints, each scaled to a capacity of 1, added with the
    second weighed by each of _MULTIPLIERS: rows (kind_cost, slot_weight, capacity) that
    hold for every plan the inputs' rows hold for (a non-negative sum of valid inequalities
    is one). Constraints with no capacity are left out (they are tested on their own), and
    so are repeats (one GPU type in one zone: Hall's condition over all slots is the GPU
    count)."""
    rows: list[tuple[FloatArray, FloatArray]] = []
    for w in range(capacity.shape[0]):
        if capacity[w] <= 0.0:
            continue
        scaled = (kind_cost[w] / capacity[w], slot_weight[w] / capacity[w])
        if not any(np.array_equal(scaled[0], c) and np.array_equal(scaled[1], s) for c, s in rows):
            rows.append(scaled)
    costs, slots, totals = [], [], []
    for (cost_i, slot_i), (cost_j, slot_j) in combinations(rows, 2):
        for factor in _MULTIPLIERS:
            costs.append(cost_i + factor * cost_j)
            slots.append(slot_i + factor * slot_j)
            totals.append(1.0 + factor)
    if not costs:
        return np.zeros((0, kind_cost.shape[1])), np.zeros((0, slot_weight.shape[1])), np.zeros(0)
    return np.array(costs), np.array(slots), np.array(totals)


def _range_min(values: FloatArray, low: IntArray, high: IntArray) -> FloatArray:
    """[w, k, a] = min of values[w, b] over low[k, a] <= b <= high[k, a] (inf where the
    range is empty), by a sparse table: the sweep asks this once per position."""
    n = values.shape[1]
    levels = [values]
    span = 1
    while 2 * span <= n:
        previous = levels[-1]
        level = previous.copy()
        level[:, : n - span] = np.minimum(previous[:, : n - span], previous[:, span:])
        levels.append(level)
        span *= 2
    table = np.stack(levels, axis=1)  # [w, level, b]
    length = np.maximum(high - low + 1, 1)
    level_of = np.floor(np.log2(length)).astype(np.int64)
    left = table[:, level_of, low]
    right = table[:, level_of, np.maximum(high - (1 << level_of) + 1, low)]
    out: FloatArray = np.where(high >= low, np.minimum(left, right), np.inf)
    return out


class _Rows:
    """need[r] of one set of constraint rows at one cycle, for r stages whose first is not
    the pipeline's first (it has a hop in): those do not depend on the depth, so the DPs
    of every depth of a group share them. Grown on demand, one position per row."""

    def __init__(
        self, at: _AtCycle, kind_cost: FloatArray, slot_weight: FloatArray, capacity: FloatArray
    ) -> None:
        self._at = at
        self.kind_cost, self.slot_weight, self.capacity = kind_cost, slot_weight, capacity
        n = at.inputs.num_layers + 1
        done = np.full((kind_cost.shape[0], n), np.inf)
        done[:, n - 1] = 0.0
        self._need = [done]

    def row(self, r: int) -> FloatArray:
        while len(self._need) <= r:
            self._need.append(self._step(len(self._need), first=False))
        return self._need[r]

    def first(self, depth: int) -> FloatArray:
        """need[depth] of a depth-stage pipeline: its first stage has no hop in."""
        self.row(depth - 1)
        return self._step(depth, first=True)

    def _step(self, r: int, *, first: bool) -> FloatArray:
        last = self._at.last_end(r, first=first)
        n = last.shape[1]
        starts = np.arange(n)
        # [w, k, a]: a stage of kind k from a to an end in (a, last], then the rest (inf
        # where no end is left)
        low = np.broadcast_to(starts + 1, last.shape).clip(max=n - 1)
        via = _range_min(self._need[r - 1], low, np.where(last > starts, last, -1))
        step: FloatArray = (via + self.kind_cost[:, :, None]).min(axis=1)
        return step


class _AtCycle:
    """Everything a group's rooms at one cycle share: the last end each range may take per
    position, and the rows of the inputs' constraints and of their pairs."""

    def __init__(self, inputs: CycleInputs, micro_batches: int, cycle: float) -> None:
        self.inputs, self.micro_batches, self.cycle = inputs, micro_batches, cycle
        # per (in-flight, hop in, hop out): [k, a] the last end that fits within the cycle
        self._last_ends: dict[tuple[int, bool, bool], IntArray] = {}
        self.base = _Rows(self, inputs.kind_cost, inputs.slot_weight, inputs.capacity)
        self._paired: _Rows | None = None

    def paired(self) -> _Rows | None:
        """The pairs' rows (None: the inputs have fewer than two constraints)."""
        if self._paired is None and self.inputs.paired()[2].size:
            self._paired = _Rows(self, *self.inputs.paired())
        return self._paired

    def last_end(self, r: int, *, first: bool) -> IntArray:
        """[k, a]: the last end of a range from a, r stages from the pipeline's end, that
        fits in memory and keeps the cycle (every such end lies in (a, last])."""
        key = (min(r, self.micro_batches), not first, r > 1)
        last = self._last_ends.get(key)
        if last is None:
            inputs = self.inputs
            times = inputs.times(key[0])
            if key[1]:
                times = times + inputs.hop_in.T[:, :, None]  # [k, a, 1]
            if key[2]:
                # the hop out depends on the end layer: its least over all ends keeps a
                # range's cycle non-decreasing in its end (so its ends within the limit are
                # an interval), and is still a lower bound
                times = times + inputs.hop_out.min(axis=0)[:, None, None]
            within = _last_true((times <= self.cycle) & _later(inputs.num_layers + 1))
            last = np.minimum(within, inputs.fit_ends(key[0]))
            self._last_ends[key] = last
        return last


class CycleRoom:
    """need[r][w, b]: least weighted GPUs (constraint row w) of r stages covering [b, L) at
    the last r positions of a depth-P pipeline, each within `cycle` (module docstring).

    The rows are the inputs' own and, when those alone leave the pipeline feasible, their
    pairwise sums (_pairs): each row is minimised by its own covering, so rows that each
    pass may still admit no single covering that passes them all (the fast type's GPUs
    within its capacity by one row, the GPU total within the cluster's by another, but not
    both at once); a weighted sum of two sees that (Lagrangian relaxation). `kind_cost`,
    `slot_weight` and `capacity` are the rows in use.

    The cycle is the caller's rounded up to the next power of 1 + _CYCLE_STEP: a looser
    bound, still valid, that lets the rooms of a group's depths share their rows."""

    def __init__(self, inputs: CycleInputs, depth: int, micro_batches: int, cycle: float) -> None:
        at = inputs.at_cycle(micro_batches, cycle)
        self.cycle = at.cycle
        self._depth = depth
        self._rows = [at.base]
        self._firsts = [at.base.first(depth)]
        self.feasible = _within(self._firsts[0][:, 0], at.base.capacity)
        paired = at.paired() if self.feasible else None
        if paired is not None:
            self._rows.append(paired)
            self._firsts.append(paired.first(depth))
            self.feasible = _within(self._firsts[1][:, 0], paired.capacity)
        self.kind_cost = np.concatenate([rows.kind_cost for rows in self._rows])
        self.slot_weight = np.concatenate([rows.slot_weight for rows in self._rows])
        self.capacity = np.concatenate([rows.capacity for rows in self._rows])
        self._room = self.capacity * (1 + _SLACK)
        self._needs: dict[int, FloatArray] = {}
        self._ends: dict[tuple[tuple[int, ...], int], list[bool]] = {}

    def need_at(self, r: int) -> FloatArray:
        """[w, b] for r of the depth stages (the whole pipeline at r = depth)."""
        need = self._needs.get(r)
        if need is None:
            parts = self._firsts if r == self._depth else [rows.row(r) for rows in self._rows]
            need = self._needs[r] = np.concatenate(parts)
        return need

    @property
    def need(self) -> list[FloatArray]:
        return [self.need_at(r) for r in range(self._depth + 1)]

    def ends(self, usage: tuple[int, ...], stages_after: int) -> list[bool]:
        """Per end layer: can `stages_after` more stages cover the rest with what `usage`
        leaves (False: no plan through this end with this usage beats the bar)."""
        key = (usage, stages_after)
        cached = self._ends.get(key)
        if cached is None:
            used = self.slot_weight @ np.asarray(usage, dtype=np.float64)
            need = self.need_at(stages_after)
            ok = np.all(need + used[:, None] <= self._room[:, None], axis=0)
            cached = ok.tolist()
            self._ends[key] = cached
        return cached


def _within(need: FloatArray, capacity: FloatArray) -> bool:
    return bool(np.all(need <= capacity * (1 + _SLACK)))
