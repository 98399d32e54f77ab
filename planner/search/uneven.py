"""The search's uneven-data-split pass (Metis' data load balancer): mixed-type DP degrees.

Why a pass of its own: the stage DP (stagedp.py) prices a stage at its slowest replica,
which is what an even split of the global batch runs at. A plan whose pipelines run on
GPUs of different speed is then priced at the slow type's pace and pruned, although
giving the fast pipelines more micro-batches (Plan.pipeline_micro_batches) would make it
the fastest plan. Here such plans are searched with the split priced in, never first
pruned under the even split.

Shape searched: D = D_f + D_s pipelines of one layer split and one TP degree, the D_f
"fast" ones wholly on GPU type F in one zone and the D_s others on type S in one zone, as
many fast pipelines as F's GPUs hold (D_f = min(D - 1, GPUs_F // (P * TP))). Per (micro-
batch, D, depth P, F, S, TP, zones) a lower bound comes first: pipeline r running n_r
micro-batches takes at least n_r * W_r / P (W_r: forward + backward of the whole model on
its type), so the iteration takes at least N / (P * sum_r 1 / W_r) for the N micro-
batches of the batch; a shape whose bound cannot beat the search's k-th best is skipped,
in bound order, as the main loop does. Otherwise stagedp.solve picks the layer split for
one combined kind whose stage time is the replicas' combined rate, D / (D_f / t_F + D_s /
t_S) (the split-aware per-micro-batch time of the stage), whose tail and memory are the
worse of the two types'. That pricing is an estimate, not a bound: the candidate is then
placed, given the per-pipeline counts that minimize its slowest pipeline (`split_counts`)
and priced by simulate() like every plan the search returns; it is offered only when
faster than the same placement split evenly, and its reason says by how much. The trainer's
ZeRO-2 cannot run different counts per pipeline, so the search skips this pass for it.

Memory options (PlanRequest.memory_options, search/memopts.py): a stage's options are one
pair of Stage fields for all its replicas, so a range takes the union of what each type
needs at the stage's in-flight count (the more recomputation of the two, offload if
either offloads: memopts.union_codes), the combined kind's compute and tail are the
two types' under that union, and the range fits only where the union fits both types'
GPU memory and is allowed on both (offload: host link and host memory). The stage DP
prices the union, the placed plan carries it, and simulate() prices it again.

Called by engine.Search.run after the even-split passes. Pure.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sailplan.planner.cluster import Pool
from sailplan.planner.plan import Plan, Predictions, Replica, Stage
from sailplan.planner.search import stagedp
from sailplan.planner.search.memopts import (
    CODES,
    NONE,
    offloaded,
    stage_options,
    union_codes,
)
from sailplan.planner.search.placement import _take
from sailplan.planner.search.terms import KindTables, kind_tables
from sailplan.planner.simulator import PlanningContext, simulate
from sailplan.planner.simulator.costs import Endpoint, one_f_one_b_seconds


@dataclass(frozen=True, order=True)
class SplitShape:
    """One uneven-split shape: the bound first, so a list of them sorts in search order."""

    bound: float
    mbs: int
    dp: int
    depth: int
    tp: int
    fast: tuple[str, str]  # (GPU type, zone) of the fast pipelines
    slow: tuple[str, str]
    fast_pipelines: int


def _combined(
    fast: npt.NDArray[np.float64], slow: npt.NDArray[np.float64], d_fast: int, d_slow: int
) -> npt.NDArray[np.float64]:
    """The split-aware time per micro-batch of a stage whose replicas are d_fast of one
    type and d_slow of the other: D / (d_fast / t_fast + d_slow / t_slow)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        combined = (d_fast + d_slow) / (d_fast / fast + d_slow / slow)
    out: npt.NDArray[np.float64] = np.where(np.isfinite(fast) & np.isfinite(slow), combined, np.inf)
    return out


class _Union:
    """The combined kind of two types under memory options: per range and in-flight count
    the union of both types' option codes (memopts.union_codes: offload if either
    offloads, the more recomputation of the two)."""

    def __init__(self, fast: KindTables, slow: KindTables, d_fast: int, d_slow: int) -> None:
        assert fast.options is not None and slow.options is not None
        self.fast, self.slow = fast.options, slow.options
        self.d_fast, self.d_slow = d_fast, d_slow
        # the ranges a stage can be at all (a < b, profiled): the kinds' finite entries
        self.ranges = np.isfinite(fast.compute) & np.isfinite(slow.compute)
        self._codes: dict[int, npt.NDArray[np.int8]] = {}
        self._rows: dict[tuple[str, int], list[list[float]]] = {}

    def codes(self, in_flight: int) -> npt.NDArray[np.int8]:
        """Per range: the union option, -1 where it does not fit or is not allowed on both."""
        cached = self._codes.get(in_flight)
        if cached is None:
            a, b = self.fast.choice(in_flight), self.slow.choice(in_flight)
            union = union_codes(a, b)
            ok = (a >= 0) & (b >= 0) & self.ranges
            for code in CODES:
                here = union == code
                for side in (self.fast, self.slow):
                    fits = side.need(code, in_flight) <= side.capacity_bytes
                    ok &= ~here | (fits & side.allowed[code])
            cached = self._codes[in_flight] = np.where(ok, union, np.int8(-1)).astype(np.int8)
        return cached

    def fits(self, in_flight: int) -> list[list[bool]]:
        fits: list[list[bool]] = (self.codes(in_flight) >= 0).tolist()
        return fits

    def compute_at(self, in_flight: int) -> list[list[float]]:
        rows = self._rows.get(("compute", in_flight))
        if rows is None:
            codes = self.codes(in_flight)
            fast = self.fast.compute_for(codes)
            slow = self.slow.compute_for(codes)
            combined = _combined(fast, slow, self.d_fast, self.d_slow)
            rows = self._rows["compute", in_flight] = np.where(
                self.ranges, combined, np.inf
            ).tolist()
        return rows

    def tail_at(self, in_flight: int) -> list[list[float]]:
        rows = self._rows.get(("tail", in_flight))
        if rows is None:
            codes = self.codes(in_flight)
            offload = offloaded(codes)
            fast = np.where(offload, self.fast.tail_offloaded, self.fast.tail)
            slow = np.where(offload, self.slow.tail_offloaded, self.slow.tail)
            rows = self._rows["tail", in_flight] = np.where(
                self.ranges, np.maximum(fast, slow), np.inf
            ).tolist()
        return rows

    def stage_options(self, a: int, b: int, in_flight: int) -> dict[str, object]:
        code = int(self.codes(in_flight)[a, b])
        return dict(stage_options(max(code, NONE)))


def pipeline_seconds(plan: Plan, context: PlanningContext, counts: tuple[int, ...]) -> list[float]:
    """Forward/backward seconds of each pipeline under `counts` (simulate()'s 1F1B per
    pipeline, see simulate._uneven_pipeline_seconds)."""
    costs = context.costs
    mbs = plan.micro_batch_size
    out = []
    for r in range(plan.data_parallel):
        stage_seconds = [
            costs.require_table(
                s.replicas[r].gpu_type, s.tensor_parallel, mbs
            ).forward_backward_seconds(s.layer_start, s.layer_end)
            for s in plan.stages
        ]
        links = [
            costs.boundary_seconds(
                costs.boundary_bytes(mbs, b.layer_start),
                a.replicas[r],
                b.replicas[r],
                a.tensor_parallel,
                b.tensor_parallel,
            )
            for a, b in zip(plan.stages, plan.stages[1:], strict=False)
        ]
        out.append(
            one_f_one_b_seconds(
                stage_seconds, links, counts[r], blocking_p2p=context.constants.blocking_p2p
            )
        )
    return out


def split_counts(plan: Plan, context: PlanningContext) -> tuple[int, ...]:
    """Micro-batches per pipeline for `plan`'s global batch that minimize the slowest
    pipeline's time. A pipeline's 1F1B time is linear in its count, T_r(n) = T_r(1) +
    (n - 1) c_r, so starting from one each and giving every next micro-batch to the pipeline
    that would then finish first is optimal for this min-max (an exchange argument: any
    assignment can be turned into the greedy's without raising the maximum). Ties go to the
    lower pipeline index (deterministic)."""
    total = plan.global_batch_size // plan.micro_batch_size
    depth = plan.data_parallel
    one = pipeline_seconds(plan, context, (1,) * depth)
    two = pipeline_seconds(plan, context, (2,) * depth)
    counts = [1] * depth
    heap = [(one[r] + (two[r] - one[r]), r) for r in range(depth)]
    heapq.heapify(heap)
    for _ in range(total - depth):
        finish, r = heapq.heappop(heap)
        counts[r] += 1
        heapq.heappush(heap, (finish + (two[r] - one[r]), r))
    return tuple(counts)


def with_split(plan: Plan, counts: tuple[int, ...]) -> Plan:
    return Plan.model_validate(
        plan.model_dump()
        | {"pipeline_micro_batches": counts, "num_micro_batches": max(counts), "predictions": None}
    )


def fits(plan: Plan, predictions: Predictions, context: PlanningContext) -> bool:
    """Every stage's predicted peak fits its smallest replica's GPU."""
    return all(
        predicted.peak_memory_bytes
        <= min(context.costs.gpu_memory_bytes(r.gpu_type) for r in stage.replicas)
        for stage, predicted in zip(plan.stages, predictions.stages, strict=True)
    )


def describe(plan: Plan, uneven: Predictions, even: Predictions | None) -> str:
    """The plan's reason for its split, e.g. "A100-40 pipelines take 5 micro-batches,
    V100-16 ones 3: 1.40x faster than an even split"."""
    counts = plan.pipeline_micro_batches or ()
    by_type: dict[str, list[int]] = {}
    for r, count in enumerate(counts):
        by_type.setdefault(plan.stages[0].replicas[r].gpu_type, []).append(count)

    def spell(values: list[int]) -> str:
        low, high = min(values), max(values)
        return f"{low}" if low == high else f"{low}-{high}"

    order = sorted(by_type, key=lambda g: (-max(by_type[g]), g))
    parts = [f"{order[0]} pipelines take {spell(by_type[order[0]])} micro-batches"]
    parts += [f"{g} ones {spell(by_type[g])}" for g in order[1:]]
    if even is None:
        gain = "the same placement split evenly does not fit in memory"
    else:
        ratio = even.iteration_seconds / uneven.iteration_seconds
        gain = f"{ratio:.2f}x faster than an even split"
    return f"uneven data split: {', '.join(parts)}: {gain}"


class UnevenPass:
    """Searches the uneven-split shapes of one request (see the module docstring)."""

    def __init__(
        self,
        *,
        context: PlanningContext,
        pools: tuple[Pool, ...],
        prices: tuple[float, ...],
        tensor_parallel_degrees: Callable[[str], list[int]],
        representative: Callable[[str, int, str], Endpoint | None],
        value_lower: Callable[[float, float], float],
        time_limit_ok: Callable[[float, float], bool],
        memory_options: bool = False,
    ) -> None:
        self.memory_options = memory_options
        self.context = context
        self.costs = context.costs
        self.pools = pools
        self.prices = prices
        self.tensor_parallel_degrees = tensor_parallel_degrees
        self.representative = representative
        self.value_lower = value_lower
        self.time_limit_ok = time_limit_ok

    def _slots(self, tp: int) -> list[tuple[str, str, int, float]]:
        """(GPU type, zone, GPUs whose nodes hold TP groups of tp, cheapest price)."""
        found: dict[tuple[str, str], tuple[int, float]] = {}
        for pool, price in zip(self.pools, self.prices, strict=True):
            gpu_type, zone = pool.gpu_type, pool.zone
            if pool.gpus_per_node % tp or tp not in self.tensor_parallel_degrees(gpu_type):
                continue
            gpus, cheapest = found.get((gpu_type, zone), (0, float("inf")))
            found[(gpu_type, zone)] = (gpus + pool.gpus, min(cheapest, price))
        return sorted((g, z, n, p) for (g, z), (n, p) in found.items())

    def shapes(
        self, prepared: list[tuple[int, int]], max_depth: int, batch: int
    ) -> list[SplitShape]:
        """Every shape with two GPU types, each with its lower bound, in bound order."""
        costs = self.costs
        out: list[SplitShape] = []
        for mbs, dp in prepared:
            if dp < 2:
                continue
            total = self.context.model.num_layers
            micro = batch // mbs  # micro-batches of the global batch, over all pipelines
            types = {p.gpu_type for p in self.pools}
            for tp in sorted({t for g in types for t in self.tensor_parallel_degrees(g)}):
                slots = self._slots(tp)
                work, update = {}, {}
                for gpu_type, _zone, _n, _p in slots:
                    table = costs.table(gpu_type, tp, mbs)
                    if table is not None:
                        work[gpu_type] = table.forward_backward_seconds(0, total)
                        update[gpu_type] = table.update_seconds(0, total)
                for fast in slots:
                    for slow in slots:
                        if fast[0] == slow[0] or fast[0] not in work or slow[0] not in work:
                            continue
                        if work[fast[0]] >= work[slow[0]]:
                            continue
                        for depth in range(1, max_depth + 1):
                            d_fast = min(dp - 1, fast[2] // (depth * tp))
                            d_slow = dp - d_fast
                            if d_fast < 1 or d_slow * depth * tp > slow[2]:
                                continue
                            rate = d_fast / work[fast[0]] + d_slow / work[slow[0]]
                            # pipeline r: T >= W_r + (n_r - 1) W_r / P (its first micro-batch
                            # crosses every stage, the others leave at the slowest stage's
                            # pace, at least W_r / P); equal T over sum n_r = N gives this,
                            # plus the slowest stage's update (at least the model's / P)
                            time_lower = (micro + dp * (depth - 1)) / (depth * rate) + min(
                                update[fast[0]], update[slow[0]]
                            ) / depth
                            usd_lower = depth * tp * (d_fast * fast[3] + d_slow * slow[3])
                            if not self.time_limit_ok(time_lower, usd_lower):
                                continue
                            out.append(
                                SplitShape(
                                    bound=self.value_lower(time_lower, usd_lower),
                                    mbs=mbs,
                                    dp=dp,
                                    depth=depth,
                                    tp=tp,
                                    fast=(fast[0], fast[1]),
                                    slow=(slow[0], slow[1]),
                                    fast_pipelines=d_fast,
                                )
                            )
        out.sort()
        return out

    def run(
        self,
        prepared: list[tuple[int, int]],
        *,
        max_depth: int,
        batch: int,
        kth: Callable[[], float],
        offer: Callable[[Plan], None],
        out_of_time: Callable[[], bool],
    ) -> None:
        """Solve the shapes in bound order until one cannot beat kth(); hand each priced
        candidate to offer (the search checks constraints and keeps the top k)."""
        for shape in self.shapes(prepared, max_depth, batch):
            if shape.bound > kth() * (1 + 1e-9) or out_of_time():
                break
            plan = self.candidate(shape, batch)
            if plan is None:
                continue
            usd = sum(
                r.tensor_parallel * self.costs.price_per_gpu_hour(r.pool) for r in plan.workers()
            )

            # a time whose value (time, or cost at this placement's price) cannot enter the
            # top k is not worth pricing further
            def worth(seconds: float, usd: float = usd) -> bool:
                return self.value_lower(seconds, usd) <= kth() * (1 + 1e-9)

            balanced = priced(plan, self.context, worth)
            if balanced is not None:
                offer(balanced)

    def candidate(self, shape: SplitShape, batch: int) -> Plan | None:
        """The shape's best layer split under the combined pricing, placed, with its counts
        (not yet priced by simulate()); None when no split fits or the pools cannot host it."""
        costs = self.costs
        num_layers = self.context.model.num_layers
        tp, dp = shape.tp, shape.dp
        d_fast, d_slow = shape.fast_pipelines, shape.dp - shape.fast_pipelines
        end_fast = self.representative(shape.fast[0], tp, shape.fast[1])
        end_slow = self.representative(shape.slow[0], tp, shape.slow[1])
        if end_fast is None or end_slow is None:
            return None
        layout = costs.allreduce_layout([end_fast] * d_fast + [end_slow] * d_slow, tp)
        micro = batch // (shape.mbs * dp)
        pair = self._tables(shape, layout, micro)
        if pair is None:
            return None
        fast, slow = pair
        combined = _combined(fast.compute, slow.compute, d_fast, d_slow)
        tail = np.maximum(fast.tail, slow.tail)
        union: _Union | None = None
        if fast.options is None:
            kind = stagedp.Kind(
                slot=0,
                gpus=dp * tp,
                compute=combined.tolist(),
                tail=tail.tolist(),
                fits=lambda in_flight: (fast.fits(in_flight) & slow.fits(in_flight)).tolist(),
            )
        else:
            union = _Union(fast, slow, d_fast, d_slow)
            kind = stagedp.Kind(
                slot=0,
                gpus=dp * tp,
                compute=combined.tolist(),
                tail=tail.tolist(),
                fits=union.fits,
                compute_at=union.compute_at,
                tail_at=union.tail_at,
            )
        hops = []
        for start in range(num_layers):
            nbytes = costs.boundary_bytes(shape.mbs, max(start, 1))
            hops.append(
                [
                    [
                        max(
                            costs.boundary_seconds(nbytes, end_fast, end_fast, tp, tp),
                            costs.boundary_seconds(nbytes, end_slow, end_slow, tp, tp),
                        )
                    ]
                ]
            )
        zeros = np.zeros(num_layers + 2)
        results = stagedp.solve(
            num_layers=num_layers,
            depth=shape.depth,
            micro_batches=micro,
            constant=0.0,
            kinds=[kind],
            num_slots=1,
            boundary=hops,
            usage_ok=lambda usage: True,
            final_ok=lambda usage: True,
            limit=lambda usage: float("inf"),
            rest_lower=zeros[: num_layers + 1],
            rest_heavy=zeros[: num_layers + 1],
            tail_lower=zeros,
            split_lower=[zeros[: num_layers + 1]] * (shape.depth + 1),
            stage_speed=lambda usage, r: 1.0,
        )
        if not results:
            return None
        best = min(results, key=lambda r: (r.time, r.boundaries))
        replicas = self._place(shape)
        if replicas is None:
            return None
        edges = best.boundaries

        def options(i: int) -> dict[str, object]:
            if union is None:
                return {}
            # the in-flight count stagedp priced stage i at (1F1B: its depth to the end)
            in_flight = min(shape.depth - i, micro)
            return dict(union.stage_options(edges[i], edges[i + 1], in_flight))

        even = Plan(
            model=self.context.model,
            global_batch_size=batch,
            micro_batch_size=shape.mbs,
            num_micro_batches=micro,
            stages=tuple(
                Stage(
                    layer_start=edges[i],
                    layer_end=edges[i + 1],
                    tensor_parallel=tp,
                    replicas=replicas[i],
                    **options(i),
                )
                for i in range(shape.depth)
            ),
        )
        return even

    def _tables(
        self, shape: SplitShape, layout: object, micro: int
    ) -> tuple[KindTables, KindTables] | None:
        """Both types' kind tables; with memory options, both with option tables as soon
        as either needs them (a stage's options are the union of both types' needs)."""

        def build(gpu_type: str, force: bool = False) -> KindTables | None:
            return kind_tables(
                self.costs,
                gpu_type=gpu_type,
                tp=shape.tp,
                mbs=shape.mbs,
                dp=shape.dp,
                layout=layout,  # type: ignore[arg-type]
                memory_options=self.memory_options,
                max_in_flight=micro,
                force_options=force,
            )

        fast, slow = build(shape.fast[0]), build(shape.slow[0])
        if fast is None or slow is None:
            return None
        if (fast.options is None) != (slow.options is None):
            if fast.options is None:
                fast = build(shape.fast[0], force=True)
            else:
                slow = build(shape.slow[0], force=True)
            if fast is None or slow is None:
                return None
        return fast, slow

    def _place(self, shape: SplitShape) -> list[tuple[Replica, ...]] | None:
        """Per stage: the fast pipelines' replicas on F's pools, then the slow ones' on S's,
        cheapest pools first (then by name); pipeline r is replica r of every stage."""
        free = [p.gpus for p in self.pools]

        def pools_of(slot: tuple[str, str]) -> list[int]:
            return sorted(
                (
                    i
                    for i, p in enumerate(self.pools)
                    if (p.gpu_type, p.zone) == slot and p.gpus_per_node % shape.tp == 0
                ),
                key=lambda i: (self.prices[i], self.pools[i].name),
            )

        rows = []
        for _ in range(shape.depth):
            fast = _take(free, pools_of(shape.fast), shape.tp, shape.fast_pipelines)
            slow = _take(free, pools_of(shape.slow), shape.tp, shape.dp - shape.fast_pipelines)
            if fast is None or slow is None:
                return None
            rows.append(
                tuple(
                    Replica(
                        pool=self.pools[i].name,
                        gpu_type=self.pools[i].gpu_type,
                        zone=self.pools[i].zone,
                    )
                    for i in fast + slow
                )
            )
        return rows


def priced(
    plan: Plan,
    context: PlanningContext,
    worth: Callable[[float], bool] = lambda seconds: True,
) -> Plan | None:
    """`plan` (an even split of a mixed placement) with its uneven counts and simulate()'s
    predictions, its reason saying why; None when the split is not faster than the even
    one, does not fit in memory, or its iteration time cannot be worth it (`worth`, asked
    with a lower bound first: the slowest pipeline alone, then simulate()'s)."""
    counts = split_counts(plan, context)
    if len(set(counts)) == 1:
        return None
    if not worth(max(pipeline_seconds(plan, context, counts))):
        return None
    uneven = with_split(plan, counts)
    predictions = simulate(uneven, context)
    if not fits(uneven, predictions, context) or not worth(predictions.iteration_seconds):
        return None
    even: Predictions | None = simulate(plan, context)
    assert even is not None
    if even.iteration_seconds <= predictions.iteration_seconds * (1 + 1e-9):
        return None
    if not fits(plan, even, context):
        even = None
    return uneven.model_copy(
        update={"predictions": predictions, "reason": describe(uneven, predictions, even)}
    )
