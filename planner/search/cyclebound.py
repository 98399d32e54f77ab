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

The recurrence is a min-plus sweep over positions, vectorised over kinds and weightings: a
range's time grows with its end layer and its memory too (the DP relies on both), so the
ends a range may take from a start lie in an interval that starts at the next layer, and
the best continuation over it is a prefix minimum of the row after.

Called by stagedp.solve with the inputs engine._group builds once per (micro-batch, DP
degree, kinds). Pure numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

# relative slack on weighted capacities: speed weights are floats, and a plan exactly at
# capacity must not be dropped by rounding
_SLACK = 1e-9


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
    # per in-flight count: the kinds' last fitting end per start (small: kept for every DP;
    # the times themselves are a matrix per kind and count, rebuilt per DP instead)
    _fit_ends: dict[int, IntArray] = field(default_factory=dict, repr=False)

    @property
    def num_layers(self) -> int:
        return int(self.hop_in.shape[0]) - 1

    def times(self, in_flight: int) -> FloatArray:
        """[k, a, b]: compute_at(in_flight) of every kind, as one array."""
        return np.stack([np.asarray(m, dtype=np.float64) for m in self.compute_at(in_flight)])

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


class CycleRoom:
    """need[r][w, b]: least weighted GPUs (weighting w) of r stages covering [b, L) at the
    last r positions of a depth-P pipeline, each within `cycle` (module docstring)."""

    def __init__(self, inputs: CycleInputs, depth: int, micro_batches: int, cycle: float) -> None:
        self._inputs = inputs
        n = inputs.num_layers + 1
        weightings = inputs.kind_cost.shape[0]
        starts = np.arange(n)
        later = _later(n)
        # the hop out depends on the end layer: its least over all ends keeps a range's
        # cycle non-decreasing in its end (so its ends within the limit are an interval),
        # and is still a lower bound
        least_out = inputs.hop_out.min(axis=0)[:, None, None]
        hop_in = inputs.hop_in.T[:, :, None]  # [k, a, 1]
        # per (in-flight, hop in, hop out): [k, a] the last end that fits within the cycle
        last_ends: dict[tuple[int, bool, bool], IntArray] = {}
        done = np.full((weightings, n), np.inf)
        done[:, n - 1] = 0.0
        need = [done]
        for r in range(1, depth + 1):
            position = depth - r
            in_flight = min(r, micro_batches)
            key = (in_flight, position > 0, position < depth - 1)
            last = last_ends.get(key)
            if last is None:
                times = inputs.times(in_flight)
                if key[1]:
                    times = times + hop_in
                if key[2]:
                    times = times + least_out
                within = _last_true((times <= cycle) & later)
                # every end that fits and keeps the cycle lies in (a, last]
                last = np.minimum(within, inputs.fit_ends(in_flight))
                last_ends[key] = last
            # reach[w, a, h] = least need of the rest from an end in (a, h]
            reach = np.minimum.accumulate(np.where(later, need[-1][:, None, :], np.inf), axis=2)
            # [w, k, a]: a stage of kind k from a, then the rest (inf where no end is left)
            via = reach[:, starts[None, :], last] + inputs.kind_cost[:, :, None]
            need.append(via.min(axis=1))
        self.need = need
        self._room = inputs.capacity * (1 + _SLACK)
        self.feasible = bool(np.all(need[depth][:, 0] <= self._room))
        self._ends: dict[tuple[tuple[int, ...], int], list[bool]] = {}

    def ends(self, usage: tuple[int, ...], stages_after: int) -> list[bool]:
        """Per end layer: can `stages_after` more stages cover the rest with what `usage`
        leaves (False: no plan through this end with this usage beats the bar)."""
        key = (usage, stages_after)
        cached = self._ends.get(key)
        if cached is None:
            used = self._inputs.slot_weight @ np.asarray(usage, dtype=np.float64)
            ok = np.all(self.need[stages_after] + used[:, None] <= self._room[:, None], axis=0)
            cached = ok.tolist()
            self._ends[key] = cached
        return cached
