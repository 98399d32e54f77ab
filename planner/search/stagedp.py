"""Exact stage-by-stage dynamic program: which layers and which GPU kind each stage gets.

The search (engine.py) fixes the data-parallel degree D, the micro-batch size and the
pipeline depth P; this module then chooses, jointly and exactly, the layer boundaries (any
contiguous split, not only uniform ones) and each stage's *kind* (GPU type, TP degree,
zone) under the cluster's capacity.

Why a DP with Pareto fronts: the simulator's iteration time is

    T = sum_i t_i + 2 sum_k x_k + (M - 1) max_i (t_i + x_{i-1} + x_i) + max_i z_i + c

(t: a stage's forward+backward per micro-batch, x: the boundary transfer between adjacent
stages, which depends on the two kinds and on the layer of the cut, z: a stage's exposed
all-reduce + optimizer step).
Two max-terms and a sum do not decompose, so a plain min-DP would be wrong. Keeping, per
(boundary layer, GPUs used per GPU type and zone, last kind), the Pareto front of (closed
max cycle, sum, max z, open cycle of the last stage) is exact; with real models' layer
counts (tens) the fronts stay small once each label's cycles are put in a canonical form
that no completion can tell apart (_Label). A partial state whose optimistic completion (every
bound the caller passes: remaining layers at their fastest, capacity-aware balance, layer
granularity, the cheapest hops and tails still to come) cannot beat the caller's threshold
(the current k-th best) is dropped: branch and bound, exact for the best plan.

Called only by engine.py. Pure python/numpy, no I/O.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from sailplan.planner.search.cyclebound import CycleInputs, CycleRoom

Usage = tuple[int, ...]
"""GPUs demanded per usage slot (a GPU type in a zone, or spanning zones)."""


class RowsOf(Protocol):
    """Rows of a range matrix by start layer (a list of lists, or built on demand)."""

    def __getitem__(self, start: int, /) -> list[float]: ...


@dataclass(frozen=True)
class Kind:
    """One stage kind for the DP: its matrices ([a, b] = stage of layers [a, b))."""

    slot: int  # usage index: the (GPU type, zone) whose capacity the stage draws on
    gpus: int  # GPUs one stage of this kind takes (D x TP)
    compute: list[list[float]]
    tail: list[list[float]]
    fits: Callable[[int], list[list[bool]]]  # in-flight micro-batches -> feasible ranges
    # compute and tail by in-flight count when memory options (search/memopts.py) make
    # them depend on it; None = `compute` and `tail` at every position (also the bounds')
    compute_at: Callable[[int], RowsOf] | None = None
    tail_at: Callable[[int], RowsOf] | None = None
    # the energy objective (search/energy.py): [a][b] = least GPU joules of such a stage
    # beyond its blocking power, a fifth Pareto criterion; None = not tracked
    joules: list[list[float]] | None = None


@dataclass(frozen=True)
class DPResult:
    """Best completion for one (final usage vector, last kind)."""

    time: float
    usage: Usage
    boundaries: tuple[int, ...]
    kinds: tuple[int, ...]
    joules: float = 0.0  # sum of the stages' Kind.joules (0 when not tracked)


@dataclass(frozen=True)
class Weighting:
    """Weights that make GPU-seconds of different GPU types comparable (see WorkRows).

    kind[k]: weight of one GPU-second of a stage of kind k on its own type; slot[i]: the
    least weight of any GPU a stage of usage slot i may run on (its own type or a faster
    helper), so at most capacity - sum(usage[i] * slot[i]) weighted GPUs are left. Valid
    for any weights with kind[k] <= the weight of every pool that may serve kind k.
    """

    kind: list[float]
    slot: list[float]
    capacity: float


@dataclass(slots=True)
class _Label:
    """A partial pipeline: what its completions' iteration time depends on, and its path.

    (closed, open_cycle) are kept canonical, which is exact: the finished plan's slowest
    cycle is max(closed, open_cycle + x, the later stages' cycles), x being the hop out of
    the last stage (between the cheapest and the dearest hop from its kind at its end
    layer), and the later stages' cycles are at least the spread bound of the layers
    left. So closed is raised to max(closed, open_cycle + cheapest hop, spread), and
    open_cycle to closed - dearest hop where it is below: no completion scores the raised
    label differently, and labels that differed only there (many, when a model's blocks
    all take the same time and the splits trade one stage's slack for another's) become
    comparable, so dominance keeps one of them. A final label's closed is the plan's
    slowest cycle. tests/planner/test_stagedp_fronts.py checks the DP against a brute
    force."""

    closed: float  # largest cycle of the stages whose both neighbours are known (canonical)
    total: float  # sum of stage times and twice the boundary times so far
    max_tail: float
    open_cycle: float  # the last stage's cycle without its outgoing boundary (canonical)
    # the plan so far as a chain to the previous stage's label: copying whole tuples per
    # label cost more than the DP's arithmetic on deep pipelines
    parent: _Label | None
    end: int  # the last stage's end layer (0 for the empty start)
    kind: int  # the last stage's kind (-1 for the empty start)
    joules: float = 0.0  # sum of the stages' Kind.joules so far

    def path(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(boundaries from 0, kinds) of the plan this label ends."""
        ends: list[int] = []
        kinds: list[int] = []
        label: _Label | None = self
        while label is not None:
            ends.append(label.end)
            if label.kind >= 0:
                kinds.append(label.kind)
            label = label.parent
        return tuple(reversed(ends)), tuple(reversed(kinds))

    def dominates(self, other: _Label) -> bool:
        return (
            self.closed <= other.closed
            and self.total <= other.total
            and self.max_tail <= other.max_tail
            and self.open_cycle <= other.open_cycle
            and self.joules <= other.joules
        )


def _insert(front: list[_Label], label: _Label) -> None:
    closed, total, tail, open_cycle = label.closed, label.total, label.max_tail, label.open_cycle
    joules = label.joules
    beaten = False
    for existing in front:
        if (
            existing.closed <= closed
            and existing.total <= total
            and existing.max_tail <= tail
            and existing.open_cycle <= open_cycle
            and existing.joules <= joules
        ):
            return
        if (
            closed <= existing.closed
            and total <= existing.total
            and tail <= existing.max_tail
            and open_cycle <= existing.open_cycle
            and joules <= existing.joules
        ):
            beaten = True
    if beaten:
        front[:] = [f for f in front if not label.dominates(f)]
    front.append(label)


def _usage_entry(
    usage: Usage,
    *,
    usage_ok: Callable[[Usage], bool],
    limit: Callable[[Usage], float],
    stage_speed: Callable[[Usage, int], float],
    stages_after: int,
    rest: npt.NDArray[np.float64],
    rest_heavy: npt.NDArray[np.float64],
    split_after: npt.NDArray[np.float64],
    min_hop: float,
    num_layers: int,
    no_spread: list[float],
    work_bounds: Sequence[tuple[WorkRows, Weighting]] = (),
    spread_cache: dict[tuple[Usage, int], Sequence[float]] | None = None,
    limit_ahead: Callable[[Usage, int], float] | None = None,
) -> tuple[float, Sequence[float]] | None:
    """A grown usage's time limit and, per end layer, the least cycle the stages still to
    come force (None: the usage can never be served or can never matter).

    The per-end bounds depend only on the usage and the number of stages after it, not on
    the depth or the bar, so spread_cache (the caller's, one per set of bounds) keeps them
    for the DPs of the other depths."""
    if not usage_ok(usage):
        return None
    bound = limit(usage) if limit_ahead is None else limit_ahead(usage, stages_after)
    if bound <= 0:
        return None
    if not stages_after:
        return bound, no_spread
    if spread_cache is not None:
        cached = spread_cache.get((usage, stages_after))
        if cached is not None:
            return bound, cached
    speed = max(stage_speed(usage, stages_after), 1e-300)
    # the best single stage still possible: no remaining stage is worth more
    best_one = stage_speed(usage, 1)
    r = stages_after
    # no stage left to fill (speed 0) makes the shares infinite: inf is the right bound
    with np.errstate(over="ignore"):
        # per end layer e < L (numpy: the same IEEE arithmetic as scalar code, once per usage)
        heavy = rest_heavy[:num_layers]
        # the layers still to place go to the remaining stages: one of them takes at least
        # its share, so the cycle is at least that
        spread = np.maximum(heavy / speed, split_after[:num_layers]) + min_hop
        # every remaining stage has an incoming hop and all but the last an outgoing one:
        # the r cycles sum to at least the rest's work plus 2r - 1 hops
        spread = np.maximum(spread, (rest[:num_layers] + (2 * r - 1) * min_hop) / r)
        # the same with stage speeds: sum_j (C - e_j h) v_j >= heavy work, the hop counts
        # e_j are 2 but for the last stage (v_last <= best_one), sum_j v_j <= speed
        heavy_left = heavy - min_hop * best_one
        weighted = np.where(heavy_left >= 0.0, heavy_left / speed + 2.0 * min_hop, 0.0)
        spread = np.maximum(spread, weighted)
        # the stages still to come share the weighted GPUs left: the slowest of them
        # takes at least their weighted GPU-seconds over that (see WorkRows)
        for rows, weighting in work_bounds:
            work = rows.row(stages_after)
            left = weighting.capacity - sum(
                used * w for used, w in zip(usage, weighting.slot, strict=True)
            )
            share = work[:num_layers] / left if left > 0 else np.full(num_layers, np.inf)
            spread = np.maximum(spread, share + min_hop)
        # an array of doubles: the same values as a list, a quarter of its memory (the
        # cache holds tens of thousands of these on deep pipelines)
        spreads = array("d", spread.tobytes())
    spreads.append(0.0)
    if spread_cache is not None:
        spread_cache[(usage, stages_after)] = spreads
    return bound, spreads


class WorkRows:
    """[r][b] = least weighted GPU-seconds per micro-batch of the LAST r stages of a
    pipeline covering layers [b, L), each on a kind that holds its layers in memory at its
    position.

    Why: the cycle C is at least every stage's time t_j, so C times the weighted GPUs
    still free is at least sum_j t_j * GPUs_j * weight_j. Deep pipelines of large models
    are capacity-bound: memory forces high TP (fewer layers per GPU-second) on early
    stages and the fast type is scarce, which neither the per-layer balance nor the
    memory-blind speed bound sees. Capacity per type enters only through the weights and
    the free total, so this is a lower bound, and pruning with it stays exact.

    A stage with r stages from it to the end (itself included) keeps min(r, M) micro-
    batches in flight under 1F1B, whatever the depth, so row r does not depend on the
    pipeline depth: one WorkRows serves every depth of a (micro-batch, DP, kinds) and
    grows its rows on demand (a backward min-sum, one stage per row). Stage s of a
    depth-P pipeline and the stages after it are row P - s.
    """

    def __init__(
        self,
        seconds: Sequence[npt.NDArray[np.float64]],
        scales: Sequence[float],
        masks: Callable[[int], Sequence[npt.NDArray[np.bool_]]],
        micro_batches: int,
    ) -> None:
        """seconds[k]: kind k's (L+1) x (L+1) stage seconds, scales[k]: its GPUs times its
        weight; masks(f): per kind, the ranges that fit with f micro-batches in flight.
        The weighted matrices are formed again for each row rather than kept: a search
        holds one WorkRows per (micro-batch, DP, kinds, weighting)."""
        self._seconds = list(seconds)
        self._scales = list(scales)
        self._masks = masks
        self._micro_batches = micro_batches
        n = self._seconds[0].shape[0]  # L + 1 boundaries
        first = np.full(n, np.inf)
        first[n - 1] = 0.0
        self._rows: list[npt.NDArray[np.float64]] = [first]

    def row(self, r: int) -> npt.NDArray[np.float64]:
        while len(self._rows) <= r:
            stages = len(self._rows)
            masks = self._masks(min(stages, self._micro_batches))
            stage = np.full_like(self._seconds[0], np.inf)
            for fits, seconds, scale in zip(masks, self._seconds, self._scales, strict=True):
                stage = np.where(fits, np.minimum(stage, seconds * scale), stage)
            self._rows.append((stage + self._rows[-1][None, :]).min(axis=1))
        return self._rows[r]


class DeadlineReachedError(Exception):
    """The caller's deadline ran out in the middle of a DP (see `expired`)."""


def solve(
    *,
    num_layers: int,
    depth: int,
    micro_batches: int,
    constant: float,
    kinds: Sequence[Kind],
    num_slots: int,
    boundary: Sequence[Sequence[Sequence[float]]],
    usage_ok: Callable[[Usage], bool],
    final_ok: Callable[[Usage], bool],
    limit: Callable[[Usage], float],
    rest_lower: npt.NDArray[np.float64],
    rest_heavy: npt.NDArray[np.float64],
    tail_lower: npt.NDArray[np.float64],
    split_lower: Sequence[npt.NDArray[np.float64]],
    stage_speed: Callable[[Usage, int], float],
    kind_allowed: Callable[[Usage, int], bool] | None = None,
    expired: Callable[[], bool] | None = None,
    work_bounds: Sequence[tuple[WorkRows, Weighting]] = (),
    spread_cache: dict[tuple[Usage, int], Sequence[float]] | None = None,
    limit_ahead: Callable[[Usage, int], float] | None = None,
    every_label: bool = False,
    cycle_inputs: CycleInputs | None = None,
) -> list[DPResult]:
    """Minimum iteration time per feasible (usage, last kind) for a P = depth pipeline;
    with every_label, every plan of the final Pareto fronts (for the energy objective,
    whose value trades the time against the kinds' joules: Kind.joules).

    boundary[b][k][j]: seconds to move one activation from a stage of kind k to one of
    kind j that starts at layer b (what crosses may depend on where the cut is).
    usage_ok prunes partial usage that can never be served (must be monotone), final_ok is
    the exact capacity check of a complete pipeline. limit(usage) is the time a plan with
    that usage must not exceed to matter (k-th best so far, constraints); it must not
    increase as usage grows. rest_lower[b] lower-bounds sum_i t_i over layers [b, L), and
    stage_speed(usage, r) bounds from above how many "fastest-kind stages" r more stages
    are worth with what `usage` leaves, so the slowest of them takes at least
    rest_heavy[b] / stage_speed(usage, r)
    (rest_heavy: the same sums over the layers the speed bound was computed on), and
    tail_lower[c] lower-bounds the tail of any stage of at least c layers, and
    split_lower[r][b] the slowest of r stages covering layers [b, L). kind_allowed(usage, k)
    may forbid kind k after `usage` (the caller's symmetry breaking). expired() is asked
    once per stage position; when it says so, DeadlineReachedError is raised.
    work_bounds: the capacity-aware work bound (WorkRows) per GPU-type weighting; each
    weighting must satisfy Weighting's condition. spread_cache: a dict the caller keeps
    across the depths of calls with the same arguments but depth, limit and expired.
    limit_ahead(usage, r), when given, replaces limit for a usage with r stages still to
    come: the time limit knowing those stages use GPUs too (under a cost objective the
    price of the GPUs a plan will use at least, not only of those used so far); it must
    equal limit at r = 0 and not increase as a stage is added. cycle_inputs, when given,
    drops partial plans whose remaining layers cannot keep the cycle the bar allows with
    the GPUs left (cyclebound.py), and the whole DP when no plan can.
    """
    m1 = micro_batches - 1
    # python lists: the loops below index single entries, much faster than numpy scalars
    rest_list = rest_lower.tolist()
    min_hop = min(min(row) for matrix in boundary[1:] for row in matrix) if num_layers > 1 else 0.0
    tail_by_length = tail_lower.tolist()
    no_spread = [0.0] * (num_layers + 1)
    # per cut layer and kind: the dearest hop out of a stage of that kind ending there
    # (the canonical open cycle below needs an upper bound on the outgoing hop)
    hop_max = [[max(row) for row in matrix] if b else [] for b, matrix in enumerate(boundary)]
    zero: Usage = (0,) * num_slots
    room: CycleRoom | None = None
    if cycle_inputs is not None and micro_batches > 1 and depth > 1:
        # every plan here takes at least `fill` beyond its (M - 1) steady cycles, so one
        # that beats the loosest limit any of them can have keeps every cycle within this
        bar = limit(zero) if limit_ahead is None else limit_ahead(zero, depth)
        fill = (
            rest_list[0]
            + 2.0 * min_hop * (depth - 1)
            + tail_by_length[-(-num_layers // depth)]
            + constant
        )
        cycle = (bar - fill) / m1 * (1 + 1e-9)
        if cycle < float("inf"):
            # built before the first stage: its rows are shared by the group's DPs at this
            # cycle (cyclebound.py), so a DP it proves empty costs well under a millisecond,
            # and the first stage's usages it dooms skip their spread bounds
            room = CycleRoom(cycle_inputs, depth, micro_batches, cycle)
            if not room.feasible:
                return []
    # state: (first free layer, usage, last kind or -1) -> Pareto front
    fronts: dict[tuple[int, Usage, int], list[_Label]] = {
        (0, zero, -1): [_Label(0.0, 0.0, 0.0, 0.0, None, 0, -1)]
    }
    for s in range(depth):
        if expired is not None and expired():
            raise DeadlineReachedError
        last_stage = s == depth - 1
        last_end = num_layers - (depth - s - 1)
        stages_after = depth - s - 1
        next_fronts: dict[tuple[int, Usage, int], list[_Label]] = {}
        split_after = np.asarray(split_lower[stages_after], dtype=np.float64)
        hops_after = 2.0 * min_hop * stages_after
        # every boundary still to come costs at least the cheapest hop, twice in the
        # fill/drain and once in the cycles of the stages on both its sides
        hop_out = min_hop if stages_after else 0.0
        # per end layer: the least tail the longest remaining stage has (built per stage
        # reached: most DPs stop after a few stages of a deep pipeline)
        tail_floor = [
            tail_by_length[-(-(num_layers - end) // stages_after)]
            if stages_after and end < num_layers
            else 0.0
            for end in range(num_layers + 1)
        ]
        in_flight = min(depth - s, micro_batches)
        stage_fits = [k.fits(in_flight) for k in kinds]
        stage_compute = [
            k.compute if k.compute_at is None else k.compute_at(in_flight) for k in kinds
        ]
        stage_tail = [k.tail if k.tail_at is None else k.tail_at(in_flight) for k in kinds]
        # per grown usage: (its time limit, the per-end spread bound); many states of this
        # stage grow to the same usage, and neither depends on anything else
        per_usage: dict[Usage, tuple[float, Sequence[float]] | None] = {}
        allowed_after: dict[Usage, list[tuple[int, Kind]]] = {}
        for (start, usage, previous), front in sorted(fronts.items()):
            allowed = allowed_after.get(usage)
            if allowed is None:
                allowed = allowed_after[usage] = [
                    (k, kind)
                    for k, kind in enumerate(kinds)
                    if kind_allowed is None or kind_allowed(usage, k)
                ]
            for k, kind in allowed:
                grown = list(usage)
                grown[kind.slot] += kind.gpus
                new_usage: Usage = tuple(grown)
                roomy = (
                    room.ends(new_usage, stages_after)
                    if room is not None and stages_after
                    else None
                )
                if roomy is not None and not any(roomy):
                    continue  # the GPUs left cannot cover the rest from any end
                if new_usage in per_usage:
                    entry = per_usage[new_usage]
                else:
                    entry = per_usage[new_usage] = _usage_entry(
                        new_usage,
                        usage_ok=usage_ok,
                        limit=limit,
                        stage_speed=stage_speed,
                        stages_after=stages_after,
                        rest=rest_lower,
                        rest_heavy=rest_heavy,
                        split_after=split_after,
                        min_hop=min_hop,
                        num_layers=num_layers,
                        no_spread=no_spread,
                        work_bounds=work_bounds,
                        spread_cache=spread_cache,
                        limit_ahead=limit_ahead,
                    )
                if entry is None:
                    continue
                bound, spreads = entry
                x = boundary[start][previous][k] if previous >= 0 else 0.0
                ends = (
                    range(num_layers, num_layers + 1)
                    if last_stage
                    else range(start + 1, last_end + 1)
                )
                feasible = stage_fits[k][start]
                compute_row = stage_compute[k][start]
                tail_row = stage_tail[k][start]
                joules_row = kind.joules[start] if kind.joules is not None else None
                two_x = 2.0 * x
                # the innermost loop: plain comparisons instead of max(), a builtin call
                # costs several times more here (PLR1730 is silenced for that reason)
                for label in front:
                    if previous >= 0:
                        closed = label.open_cycle + x
                        if label.closed > closed:  # noqa: PLR1730
                            closed = label.closed
                    else:
                        closed = 0.0
                    label_total = label.total
                    label_tail = label.max_tail
                    base = label_total + two_x + constant + hops_after + label_tail
                    for end in ends:
                        # memory and this lower bound only grow with the stage's end layer
                        # (its time grows by at least what the rest bound loses), so the
                        # first failing end ends the loop
                        if not feasible[end]:
                            break
                        t = compute_row[end]
                        open_cycle = t + x
                        steady = open_cycle + hop_out
                        if closed > steady:  # noqa: PLR1730
                            steady = closed
                        growing = base + t + rest_list[end] + m1 * steady
                        if growing > bound:
                            break
                        max_tail = tail_row[end]
                        if label_tail > max_tail:  # noqa: PLR1730
                            max_tail = label_tail
                        floor = tail_floor[end]
                        if floor > max_tail:  # noqa: PLR1730
                            max_tail = floor
                        if roomy is not None and not roomy[end]:
                            continue  # the stages after cannot cover the rest in time
                        optimistic = growing + (max_tail - label_tail)
                        spread = spreads[end]
                        if spread > steady:
                            optimistic += m1 * (spread - steady)
                        if optimistic > bound:
                            continue
                        # the label's canonical (closed, open) (see _Label): labels that
                        # differ only where no completion can tell them apart become
                        # equal, so one dominates the other and the fronts stay small
                        if last_stage:
                            if open_cycle > steady:  # noqa: PLR1730
                                steady = open_cycle
                            kept_open = steady
                        else:
                            if spread > steady:  # noqa: PLR1730
                                steady = spread
                            kept_open = steady - hop_max[end][k]
                            if open_cycle > kept_open:  # noqa: PLR1730
                                kept_open = open_cycle
                        grown_label = _Label(
                            steady, label_total + t + two_x, max_tail, kept_open, label, end, k
                        )
                        if joules_row is not None:
                            grown_label.joules = label.joules + joules_row[end]
                        key = (end, new_usage, k)
                        bucket = next_fronts.get(key)
                        if bucket is None:
                            next_fronts[key] = [grown_label]
                        else:
                            _insert(bucket, grown_label)
        fronts = next_fronts
        if not fronts:
            return []
    results: list[DPResult] = []
    for (end, usage, _last), front in sorted(fronts.items()):
        if end != num_layers or not final_ok(usage):
            continue
        scored = [
            (
                label.total + m1 * max(label.closed, label.open_cycle) + label.max_tail + constant,
                *label.path(),
                label.joules,
            )
            for label in front
        ]
        for time, boundaries, chosen, joules in scored if every_label else [min(scored)]:
            results.append(
                DPResult(time=time, usage=usage, boundaries=boundaries, kinds=chosen, joules=joules)
            )
    return results
