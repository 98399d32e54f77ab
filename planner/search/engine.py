"""The search: best plan and top-k alternatives for a request, by exact branch and bound.

Outer loop: every (micro-batch size m, data-parallel degree D, pipeline depth P) with
m * D dividing the global batch and enough GPUs for P stages of D replicas, ordered by an
optimistic bound: every layer at its fastest kind's time, balanced over the P stages as
well as the GPU types' capacity allows (_SpeedBound) and as layer granularity allows
(_min_max_split), the cheapest hop per boundary (and, on the slowest cycle, the mean of
the P cycles, which hold every inner boundary twice), the cheapest all-reduce + update the
longest stage can have. Triples are solved in that order and the loop stops at the first
bound that cannot beat the current k-th best: a full search, no sampling, with the same
optimum as enumerating everything. A first pass restricted to one TP degree and to
zone-pure kinds finds a strong k-th best cheaply; the second pass searches every kind.

Inner: for a triple, stagedp.solve picks the layer split and each stage's kind (GPU type,
TP, zone) jointly and exactly under capacity (capacity.py); placement.py maps the result
onto pools; simulate() prices it, so every prediction the search returns is simulate()'s.
The DP prices a stage as if all its replicas were of its kind in its zone: exactly what
simulate() computes for zone-pure stages of one GPU type, a lower bound for stages that
span zones, so pruning with it never drops the optimum (test_optimality.py checks this
against a brute force over every plan, mixed types and zones included).

Called by search/__init__.py (`plan`) and, through it, by api.make_plan. Pure.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import numpy.typing as npt

from sailplan.planner.api import Infeasible, Planned, PlanRequest, PlanResult
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import Plan, Stage
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.search import memopts, stagedp, uneven
from sailplan.planner.search.capacity import CapacityModel, KindServers, TypeServers
from sailplan.planner.search.cyclebound import CycleInputs
from sailplan.planner.search.energy import (
    EnergyBound,
    input_problem,
    price_floors,
    with_energy,
)
from sailplan.planner.search.explain import describe_inputs, reasons
from sailplan.planner.search.objective import Goal, TopK
from sailplan.planner.search.placement import StageShape, place
from sailplan.planner.search.terms import KindTables, kind_tables
from sailplan.planner.simulator import PlanningContext, simulate
from sailplan.planner.simulator.collectives import AllReduceLayout
from sailplan.planner.simulator.costs import CostModel, Endpoint

GIB = 1024**3
# the first bar a triple is solved under, relative to its optimistic bound (see _pass)
_GUESS = 1.25
# powers of per-GPU speed tried as GPU-type weights by the DP's work bound (_weightings)
_WEIGHT_POWERS = (0.0, 1.0, 2.0)
# per-usage spread bounds the groups may keep in all (about 0.5 KB each on a 50-layer model):
# past it they are dropped and recomputed, which bounds a long search's memory
_SPREAD_CACHE_ENTRIES = 100_000


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, order=True)
class _KindKey:
    """A stage kind: slowest GPU type, TP degree, and the zone all its replicas are in
    ("" = a stage whose replicas span zones, priced optimistically by the DP)."""

    gpu_type: str
    tensor_parallel: int
    zone: str


@dataclass
class _Stats:
    evaluated: int = 0  # complete plans the DP scored (best per capacity use and last kind)
    simulated: int = 0  # of those, the ones that could enter the top k, priced by simulate()
    dp_runs: int = 0
    memory_shortfall: float | None = None
    shortfall_where: str = ""
    # per layer, the least memory it needs on any kind beyond the fixed overhead
    layer_memory: npt.NDArray[np.float64] | None = None
    roomiest: float = 0.0


@dataclass
class _Group:
    """What Search._group caches per (micro-batch, DP degree, kinds)."""

    micro_batches: int
    servers: list[KindServers]
    capacity: CapacityModel
    spreads: dict[tuple[tuple[int, ...], int], Sequence[float]]  # the DP's spread_cache
    dp_args: dict[str, object]  # stagedp.solve's keyword arguments but depth, limit, expired


class _SpeedBound:
    """How many "fastest-kind stages" r more stages can be worth, given what is used.

    A stage of kind k takes at least slowdown_k times the fastest time of its (heavy)
    layers, so the slowest of r stages covering work W takes at least W / sum(1/slowdown).
    Each stage needs at least D GPUs of one type, so a type with G GPUs left hosts at most
    G // D stages, each worth at most the best 1/slowdown among kinds it serves; filling
    the best values first under the GPUs left is the bound. Over the whole cluster a
    second cap holds: a stage of TP t uses D * t GPUs, so all stages together are worth at
    most sum over types of GPUs / D * max(1/slowdown / t).
    """

    def __init__(
        self,
        dp: int,
        value_by_type: dict[str, float],
        value_per_gpu: dict[str, float],
        capacity: dict[str, int],
        exclusive: dict[tuple[str, str], str | None],
    ) -> None:
        self.dp = dp
        self.order = sorted(value_by_type, key=lambda g: (-value_by_type[g], g))
        self.value_by_type = value_by_type
        self.capacity = capacity
        self.total = sum(capacity.values())
        self.exclusive = exclusive
        self.value_per_gpu = value_per_gpu
        self._cache: dict[tuple[tuple[int, ...], int], float] = {}

    def stages(self, r: int) -> float:
        """Bound for r stages on the whole cluster (0 stages fit: 0)."""
        return self._greedy(dict(self.capacity), self.total, r)

    def max_depth(self) -> int:
        return sum(self.capacity[g] // self.dp for g in self.capacity)

    def remaining(self, slots: list[tuple[str, str]], usage: tuple[int, ...], r: int) -> float:
        key = (usage, r)
        cached = self._cache.get(key)
        if cached is None:
            left = dict(self.capacity)
            for slot, used in zip(slots, usage, strict=True):
                only = self.exclusive.get(slot)
                if only is not None and used:
                    left[only] -= used
            cached = self._greedy(left, self.total - sum(usage), r)
            self._cache[key] = cached
        return cached

    def _greedy(self, left: dict[str, int], budget: int, r: int) -> float:
        per_gpu = sum(self.value_per_gpu[g] * max(left[g], 0) / self.dp for g in left)
        return min(self._by_count(dict(left), budget, r), per_gpu)

    def _by_count(self, left: dict[str, int], budget: int, r: int) -> float:
        total, taken = 0.0, 0
        for gpu_type in self.order:
            n = min(max(left[gpu_type], 0) // self.dp, max(budget, 0) // self.dp, r - taken)
            total += n * self.value_by_type[gpu_type]
            budget -= n * self.dp
            taken += n
            if taken == r:
                break
        return total


class Search:
    """One search over one request; holds the shared context and caches."""

    def __init__(
        self,
        request: PlanRequest,
        profiles: ProfileSet,
        catalog: Catalog,
        deadline: float | None = None,
    ) -> None:
        self.request = request
        self._profiles, self._catalog = profiles, catalog
        # time.monotonic() after which no new DP starts and a running one stops
        self.deadline = deadline
        self.expired = False
        self.context = PlanningContext(
            model=request.model,
            cluster=request.cluster,
            profiles=profiles,
            catalog=catalog,
            optimizer=request.optimizer,
            training=request.training_setup(),
            constants=request.constants(),
        )
        self.costs: CostModel = self.context.costs
        self.goal = Goal(request.objective, request.global_batch_size)
        self.pools = tuple(
            sorted((p for p in request.cluster.pools if p.gpus > 0), key=lambda p: p.name)
        )
        self.prices = price_floors(self.costs, self.pools)
        # the energy objective: exact energies, pruned by their lower bound (energy.py)
        floor = request.objective.min_samples_per_second
        self.energy = (
            EnergyBound(
                self.context,
                self.pools,
                request.global_batch_size,
                max_slowdown=request.energy_max_slowdown,
                max_iteration_seconds=request.global_batch_size / floor if floor else None,
                tensor_parallel_degrees=self._tensor_parallel_degrees,
            )
            if request.objective.kind == "energy"
            else None
        )
        self.total_gpus = sum(p.gpus for p in self.pools)
        self.gpu_types = sorted({p.gpu_type for p in self.pools})
        self.zones = sorted({p.zone for p in self.pools})
        self.earlier_twins = self._zone_symmetry()
        self.num_layers = request.model.num_layers
        self.stats = _Stats()
        self.top = TopK(request.top_k)
        # the energy objective: no plan the search did not price uses less (energy.py)
        self.energy_floor = float("inf")
        self._boundaries: dict[tuple[int, tuple[_KindKey, ...]], list[list[list[float]]]] = {}
        self._capacities: dict[tuple[TypeServers, ...], CapacityModel] = {}
        self._groups: dict[tuple[int, int, tuple[_KindKey, ...]], _Group] = {}
        self._spreads_cached = 0  # entries in all groups' spread caches

    def _zone_symmetry(self) -> dict[str, list[str]]:
        """For each zone, the interchangeable zones that sort before it.

        Zones of one region holding identical pools (type, node size, GPUs, price) are
        interchangeable: relabelling them changes no link, price or capacity. Any plan can
        be relabelled so such zones are first used in name order, so the DP only opens a
        zone once its earlier twins are in use: the same optimum, far fewer states. Egress
        overrides in the snapshot may break the symmetry, so then no zone has twins.
        """
        if self.request.cluster.egress_usd_per_gb:
            return {z: [] for z in self.zones}

        def signature(zone: str) -> tuple[object, ...]:
            pools = sorted(
                (p.gpu_type, p.gpus_per_node, p.gpus, self.prices[i], p.spot)
                for i, p in enumerate(self.pools)
                if p.zone == zone
            )
            region = next(p.region for p in self.pools if p.zone == zone)
            return (region, tuple(pools))

        signatures = {z: signature(z) for z in self.zones}
        return {
            z: [other for other in self.zones if other < z and signatures[other] == signatures[z]]
            for z in self.zones
        }

    # -- kinds ---------------------------------------------------------------------------

    def _tensor_parallel_degrees(self, gpu_type: str) -> list[int]:
        node_sizes = {p.gpus_per_node for p in self.pools if p.gpu_type == gpu_type}
        largest = max(node_sizes)
        return [
            t
            for t in range(1, largest + 1)
            if self.request.model.supports_tensor_parallel(t)
            and any(n % t == 0 for n in node_sizes)
        ]

    def micro_batch_sizes(self) -> list[int]:
        wanted = self.request.micro_batch_sizes
        sizes = set()
        for gpu_type in self.gpu_types:
            for t in self._tensor_parallel_degrees(gpu_type):
                for m in _divisors(self.request.global_batch_size):
                    if (wanted is None or m in wanted) and self.costs.table(gpu_type, t, m):
                        sizes.add(m)
        return sorted(sizes)

    def _representative(self, gpu_type: str, tp: int, zone: str) -> Endpoint | None:
        """An endpoint of the kind's largest node that fits tp, for its links' curves."""
        pools = [
            p
            for p in self.pools
            if p.gpu_type == gpu_type and p.gpus_per_node % tp == 0 and (not zone or p.zone == zone)
        ]
        if not pools:
            return None
        pool = max(pools, key=lambda p: (p.gpus_per_node, p.gpus, p.name))
        return Endpoint(pool=pool.name, gpu_type=gpu_type, zone=zone)

    def _spanning_layout(self, gpu_type: str, tp: int, dp: int) -> AllReduceLayout | None:
        """The fastest layout a zone-spanning stage of this type can have (its all-reduce is
        at least that slow): dp replicas split over the best pair of zones."""
        ends = [e for z in self.zones if (e := self._representative(gpu_type, tp, z)) is not None]
        if len(ends) < 2:
            return None
        layouts = [
            self.costs.allreduce_layout([a] * (dp - dp // 2) + [b] * (dp // 2), tp)
            for a, b in combinations(ends, 2)
        ]
        probe = np.array([64e6])
        return min(
            layouts,
            key=lambda lay: float(self.costs.allreduce_seconds_array(probe, lay, tp)[0]),
        )

    def kinds(self, mbs: int, dp: int) -> tuple[list[_KindKey], list[KindTables]]:
        keys: list[_KindKey] = []
        tables: list[KindTables] = []
        for gpu_type in self.gpu_types:
            for tp in self._tensor_parallel_degrees(gpu_type):
                if self.costs.table(gpu_type, tp, mbs) is None:
                    continue
                for zone in self.zones:
                    endpoint = self._representative(gpu_type, tp, zone)
                    if endpoint is None:
                        continue
                    layout = self.costs.allreduce_layout([endpoint] * dp, tp)
                    built = kind_tables(
                        self.costs,
                        gpu_type=gpu_type,
                        tp=tp,
                        mbs=mbs,
                        dp=dp,
                        layout=layout,
                        memory_options=self.request.memory_options,
                        max_in_flight=self.request.global_batch_size // (mbs * dp),
                    )
                    if built is not None:
                        keys.append(_KindKey(gpu_type, tp, zone))
                        tables.append(built)
                spanning = self._spanning_layout(gpu_type, tp, dp) if dp > 1 else None
                if spanning is not None:
                    built = kind_tables(
                        self.costs,
                        gpu_type=gpu_type,
                        tp=tp,
                        mbs=mbs,
                        dp=dp,
                        layout=spanning,
                        memory_options=self.request.memory_options,
                        max_in_flight=self.request.global_batch_size // (mbs * dp),
                    )
                    if built is not None:
                        keys.append(_KindKey(gpu_type, tp, ""))
                        tables.append(built)
        return keys, tables

    def _boundary(self, mbs: int, keys: list[_KindKey]) -> list[list[list[float]]]:
        """[start][a][b]: seconds to move one activation from a stage of kind a to one of
        kind b that starts at layer `start` (row 0 unused: the first stage receives
        nothing). Boundaries that carry the same bytes share one matrix."""
        cache_key = (mbs, tuple(keys))
        cached = self._boundaries.get(cache_key)
        if cached is None:
            by_size: dict[int, list[list[float]]] = {}
            cached = []
            for start in range(self.num_layers):
                nbytes = self.costs.boundary_bytes(mbs, max(start, 1))
                if nbytes not in by_size:
                    by_size[nbytes] = [[self._hop(nbytes, a, b) for b in keys] for a in keys]
                cached.append(by_size[nbytes])
            self._boundaries[cache_key] = cached
        return cached

    def _hop(self, nbytes: int, a: _KindKey, b: _KindKey) -> float:
        """One activation from a stage of kind a to one of kind b (slowest pipeline).

        Both zone-pure: their zones' link. Both spanning: pipelines may align zone by zone,
        so the intra-zone link (a lower bound). One spanning, one pure in zone z: the
        spanning stage has a replica outside z, so some pipeline crosses zones: the
        fastest cross-zone link between the two types (a lower bound).
        """
        tp_a, tp_b = a.tensor_parallel, b.tensor_parallel
        if (a.zone and b.zone) or (not a.zone and not b.zone):
            end_a = self._representative(a.gpu_type, a.tensor_parallel, a.zone)
            end_b = self._representative(b.gpu_type, b.tensor_parallel, b.zone)
            assert end_a is not None and end_b is not None
            return self.costs.boundary_seconds(nbytes, end_a, end_b, tp_a, tp_b)
        hops = []
        for zone_a in [a.zone] if a.zone else self.zones:
            for zone_b in [b.zone] if b.zone else self.zones:
                if zone_a == zone_b:
                    continue
                end_a = self._representative(a.gpu_type, a.tensor_parallel, zone_a)
                end_b = self._representative(b.gpu_type, b.tensor_parallel, zone_b)
                if end_a is not None and end_b is not None:
                    hops.append(self.costs.boundary_seconds(nbytes, end_a, end_b, tp_a, tp_b))
        return min(hops, default=0.0)

    def _tail_by_length(self, tables: list[KindTables]) -> npt.NDArray[np.float64]:
        """[c] = least all-reduce + update of any stage of at least c layers, any kind."""
        n = self.num_layers + 1
        stacked = np.stack([kt.tail for kt in tables])
        exact = np.full(n + 1, np.inf)
        for c in range(1, n):
            exact[c] = float(np.diagonal(stacked, offset=c, axis1=1, axis2=2).min())
        # at least c layers: the minimum over every length >= c
        return np.minimum.accumulate(exact[::-1])[::-1]

    @staticmethod
    def _min_max_split(
        per_layer: npt.NDArray[np.float64], depth: int
    ) -> list[npt.NDArray[np.float64]]:
        """[r][b] = least possible slowest-stage time when layers [b, L) form r stages,
        every layer at its fastest kind's time: a lower bound that, unlike the average,
        knows layers are indivisible (a heavy head cannot be shared)."""
        n = len(per_layer)
        prefix = np.concatenate([[0.0], np.cumsum(per_layer)])
        span = prefix[None, :] - prefix[:, None]  # span[a, b] = layers [a, b)
        depth = max(depth, 1)
        table = [np.full(n + 1, np.inf) for _ in range(depth + 1)]
        current = np.full(n + 1, np.inf)
        current[:n] = span[:n, n]
        table[1] = current
        upper = np.triu(np.ones((n + 1, n + 1), dtype=bool), k=1)
        for r in range(2, depth + 1):
            candidates = np.where(upper, np.maximum(span, current[None, :]), np.inf)
            current = candidates.min(axis=1)
            table[r] = current
        return table

    @staticmethod
    def _heavy(per_layer: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Fastest per-layer times with light layers (the embedding) zeroed.

        The cycle bound only needs SOME set of layers: a stage's time is at least its
        slowdown times the fastest time of its heavy layers. Leaving out layers much
        lighter than the rest keeps an almost-free embedding from making every slow GPU
        type look as fast as the fastest.
        """
        heavy = per_layer >= 0.25 * float(np.median(per_layer))
        return np.where(heavy, per_layer, 0.0)

    def _stage_speed_bound(
        self,
        dp: int,
        keys: list[_KindKey],
        tables: list[KindTables],
        heavy: npt.NDArray[np.float64],
    ) -> _SpeedBound:
        """Upper bounds of sum over r stages of 1/slowdown (see _SpeedBound)."""
        servers = self.servers(keys, tables)
        value_by_type: dict[str, float] = {}
        value_per_gpu: dict[str, float] = {}
        exclusive: dict[tuple[str, str], str | None] = {}
        mask = heavy > 0
        for key, server, kt in zip(keys, servers, tables, strict=True):
            times = np.diagonal(kt.compute, offset=1)
            value = 1.0 / float(np.min(times[mask] / heavy[mask]))
            served = {self.pools[i].gpu_type for i in server.pools}
            for gpu_type in served:
                value_by_type[gpu_type] = max(value_by_type.get(gpu_type, 0.0), value)
                per_gpu = value / key.tensor_parallel
                value_per_gpu[gpu_type] = max(value_per_gpu.get(gpu_type, 0.0), per_gpu)
            slot = (key.gpu_type, key.zone)
            only = next(iter(served)) if len(served) == 1 else None
            exclusive[slot] = only if exclusive.get(slot, only) == only else None
        capacity = {g: sum(p.gpus for p in self.pools if p.gpu_type == g) for g in value_by_type}
        return _SpeedBound(dp, value_by_type, value_per_gpu, capacity, exclusive)

    def _weightings(
        self,
        speed: _SpeedBound,
        servers: list[KindServers],
        type_servers: list[TypeServers],
    ) -> list[stagedp.Weighting]:
        """GPU-type weights for the DP's capacity-aware work bound (stagedp.WorkRows).

        A weight per type of its best per-GPU speed to a few powers: no single power is
        tightest on every cluster, and each is valid because a kind (and a slot) is given
        the least weight of the pools that may serve it. Power 0 is the plain GPU count.
        """
        out = []
        for power in _WEIGHT_POWERS:
            weight = {
                p.gpu_type: speed.value_per_gpu.get(p.gpu_type, 0.0) ** power for p in self.pools
            }
            if min(weight.values()) <= 0.0:
                continue
            out.append(
                stagedp.Weighting(
                    kind=[
                        min((weight[self.pools[i].gpu_type] for i in sv.pools), default=0.0)
                        for sv in servers
                    ],
                    slot=[
                        min((weight[self.pools[i].gpu_type] for i in ts.pools), default=0.0)
                        for ts in type_servers
                    ],
                    capacity=sum(weight[p.gpu_type] * p.gpus for p in self.pools),
                )
            )
        return out

    def servers(self, keys: list[_KindKey], tables: list[KindTables]) -> list[KindServers]:
        """Per kind: pools of its own type or of a helper type (see capacity.py)."""
        out: list[KindServers] = []
        for key, kt in zip(keys, tables, strict=True):
            helper_types = {key.gpu_type}
            own = kt.table
            for other, ot in zip(keys, tables, strict=True):
                if other.tensor_parallel != key.tensor_parallel or other.gpu_type == key.gpu_type:
                    continue
                oth = ot.table
                faster = bool(
                    np.all(
                        np.diff(oth.forward + oth.backward) <= np.diff(own.forward + own.backward)
                    )
                    and np.all(np.diff(oth.update) <= np.diff(own.update))
                )
                if faster and ot.capacity_bytes >= kt.capacity_bytes:
                    helper_types.add(other.gpu_type)
            pool_ids = tuple(
                i
                for i, p in enumerate(self.pools)
                if p.gpu_type in helper_types
                and p.gpus_per_node % key.tensor_parallel == 0
                and (not key.zone or p.zone == key.zone)
            )
            cheapest = min((self.prices[i] for i in pool_ids), default=float("inf"))
            out.append(KindServers(key.gpu_type, key.tensor_parallel, key.zone, pool_ids, cheapest))
        return out

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> list[Plan]:
        """Two passes: the first, with one TP degree for all stages and zone-pure kinds
        only, finds good plans fast; the second searches every kind with those as the bar.
        Under a deadline with memory options, the search without them runs first (below)."""
        if self.request.memory_options and self.deadline is not None:
            self._seed_without_options()
        batch = self.request.global_batch_size
        prepared: list[tuple[int, int, list[_KindKey], list[KindTables]]] = []
        for mbs in self.micro_batch_sizes():
            for dp in _divisors(batch // mbs):
                if dp > self.total_gpus:
                    break
                keys, tables = self.kinds(mbs, dp)
                if keys:
                    self._note_memory(mbs, keys, tables)
                    prepared.append((mbs, dp, keys, tables))
        seeds = []
        for mbs, dp, keys, tables in prepared:
            for tp in sorted({k.tensor_parallel for k in keys}):
                # zone-pure kinds only where there are some: the DP prices them exactly,
                # so no finalist it hands over disappoints simulate() (spanning kinds are
                # priced optimistically and would cost simulations for nothing here)
                chosen = [i for i, k in enumerate(keys) if k.tensor_parallel == tp and k.zone]
                if not chosen:
                    chosen = [i for i, k in enumerate(keys) if k.tensor_parallel == tp]
                seeds.append((mbs, dp, [keys[i] for i in chosen], [tables[i] for i in chosen]))
        self._pass(seeds)
        self._pass(prepared)
        uneven_ok = (
            self.request.uneven_data_split
            and self.request.zero_stage != 2
            and self.request.objective.kind in ("throughput", "cost")
        )
        if len(self.gpu_types) > 1 and uneven_ok:
            # the trainer's ZeRO-2 reduces per micro-batch: its pipelines cannot split unevenly
            self._uneven_pass([(mbs, dp) for mbs, dp, _, _ in prepared])
        return self.top.plans()

    def _seed_without_options(self) -> None:
        """Run the search without memory options first and keep its best plans.

        With the options the first configurations tried often have no feasible plan, and
        with no plan known each DP runs without a bar, so a deadline-bound search could end
        with nothing (benchmarks/first_plan.py). Without them the search finds a plan in
        about a CPU second there. Every plan it finds is also a plan with options (a stage that
        fits needs none), so its top k are a valid incumbent: the search with options
        returns them or better. The seed gets at most half the time left (its first plan
        comes in about a second), so a model that fits only with options keeps the other
        half to find one.
        """
        assert self.deadline is not None
        now = time.monotonic()
        plain = Search(
            self.request.model_copy(update={"memory_options": False}),
            self._profiles,
            self._catalog,
            now + max(self.deadline - now, 0.0) / 2,
        )
        plain.run()
        for value, _, plan in plain.top.entries:
            self.top.offer(value, plan)
        self.stats.evaluated += plain.stats.evaluated
        self.stats.simulated += plain.stats.simulated
        self.stats.dp_runs += plain.stats.dp_runs
        self.energy_floor = min(self.energy_floor, plain.energy_floor)

    def _uneven_pass(self, prepared: list[tuple[int, int]]) -> None:
        """Plans whose pipelines run on two GPU types with the batch split by speed
        (uneven.py), priced with the split rather than at the slow type's pace."""

        def offer(plan: Plan) -> None:
            self.stats.simulated += 1
            if plan.predictions is not None and self.goal.satisfied(plan.predictions):
                self.top.offer(self.goal.value(plan.predictions), plan)

        uneven.UnevenPass(
            context=self.context,
            pools=self.pools,
            prices=self.prices,
            tensor_parallel_degrees=self._tensor_parallel_degrees,
            representative=self._representative,
            value_lower=self.goal.value_lower,
            time_limit_ok=lambda t, usd: self.goal.time_limit(float("inf"), usd) >= t,
            memory_options=self.request.memory_options,
        ).run(
            prepared,
            max_depth=min(self.num_layers, self.request.max_pipeline_depth or self.num_layers),
            batch=self.request.global_batch_size,
            kth=self.top.kth,
            offer=offer,
            out_of_time=self._out_of_time,
        )

    def _pass(self, prepared: list[tuple[int, int, list[_KindKey], list[KindTables]]]) -> None:
        batch = self.request.global_batch_size
        max_depth = min(self.num_layers, self.request.max_pipeline_depth or self.num_layers)
        cheapest_price = min(self.prices) if self.prices else 0.0
        triples: list[tuple[float, int, int, int, int]] = []
        for index, (mbs, dp, keys, tables) in enumerate(prepared):
            if not keys:
                continue
            per_layer = np.min(
                np.stack([np.diagonal(kt.compute, offset=1) for kt in tables]), axis=0
            )
            work = float(per_layer.sum())
            hop = min(min(row) for matrix in self._boundary(mbs, keys)[1:] for row in matrix)
            shortest_tail = self._tail_by_length(tables)
            heavy = self._heavy(per_layer)
            heavy_work = float(heavy.sum())
            speed = self._stage_speed_bound(dp, keys, tables, heavy)
            split = self._min_max_split(per_layer, min(max_depth, speed.max_depth()))
            micro = batch // (mbs * dp)
            in_flight = min(self.num_layers, micro)
            steps_kept = not any(_may_offload(kt, in_flight) for kt in tables)
            for depth in range(1, min(max_depth, speed.max_depth()) + 1):
                # fill/drain + steady state + the slowest stage's all-reduce/update: all
                # layers on their fastest kind, perfectly balanced, the cheapest hop per
                # boundary, and the longest stage (>= L/P layers) at its cheapest tail
                links = hop if depth > 1 else 0.0
                longest = -(-self.num_layers // depth)
                cycle = max(heavy_work / speed.stages(depth), float(split[depth][0])) + links
                if depth > 1:
                    # the P cycles hold every stage once and every boundary twice, so the
                    # slowest is at least their mean; weighted by stage speeds (the two end
                    # stages have one hop, worth at most the best single stage each), at
                    # least (heavy - 2 hop v_max) / V + 2 hop
                    cycle = max(cycle, (work + 2 * (depth - 1) * hop) / depth)
                    heavy_left = heavy_work - 2 * hop * speed.stages(1)
                    if heavy_left >= 0.0:
                        cycle = max(cycle, heavy_left / speed.stages(depth) + 2 * hop)
                time_lower = (
                    work
                    + 2 * (depth - 1) * links
                    + (micro - 1) * cycle
                    + float(shortest_tail[longest])
                )
                rate_lower = dp * depth * cheapest_price
                energy = self._energy_lower(mbs, dp, depth, steps_kept)
                if self.goal.time_limit(float("inf"), rate_lower, *energy) < time_lower:
                    continue
                bound = self.goal.value_lower(time_lower, rate_lower, *energy)
                triples.append((bound, mbs, dp, depth, index))
        triples.sort()
        for bound, mbs, dp, depth, index in triples:
            if bound > self.top.kth() * (1 + 1e-9) or self._out_of_time():
                break
            _, _, keys, tables = prepared[index]
            # Until k plans are known the DP has no bar and prunes nothing: then first with
            # a bar a little above the bound (_GUESS). Every plan that drops is slower than
            # the bar, so if the k-th best is then at or under the bar the triple is done
            # exactly; otherwise it runs again with the true bar.
            guess = bound * _GUESS
            if self.top.kth() == float("inf"):
                self._solve(mbs, dp, depth, keys, tables, cap=guess)
                if self.top.kth() <= guess:
                    continue
            self._solve(mbs, dp, depth, keys, tables)

    def _energy_lower(self, mbs: int, dp: int, depth: int, steps_kept: bool) -> tuple[float, float]:
        """(least blocking watts, least joules beyond them) of a plan of dp x depth stage
        replicas at micro-batch mbs ((0, 0) for the other objectives; search/energy.py);
        steps_kept: no stage may offload its optimizer step (_may_offload)."""
        if self.energy is None:
            return 0.0, 0.0
        joules = self.energy.joules_lower(mbs, dp, updates=steps_kept)
        return dp * depth * self.energy.least_watts, joules

    def _out_of_time(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.expired = True
        return self.expired

    def _priced_constraints(self) -> bool:
        o = self.request.objective
        return o.max_usd_per_hour is not None or o.max_usd_per_iteration is not None

    def _note_memory(self, mbs: int, keys: list[_KindKey], tables: list[KindTables]) -> None:
        """Track the smallest memory shortfall: the worst layer alone on its roomiest kind."""
        worst = -float("inf")
        where = ""
        for layer in range(self.num_layers):
            best = float("inf")
            best_where = ""
            for key, kt in zip(keys, tables, strict=True):
                need = kt.memory_bytes(layer, layer + 1, 1) - kt.capacity_bytes
                if need < best:
                    best = need
                    best_where = (
                        f"layer {layer} ({self.request.model.layer_kind(layer)}) needs "
                        f"{(need + kt.capacity_bytes) / GIB:.1f} GiB on {key.gpu_type} "
                        f"({kt.capacity_bytes / GIB:.0f} GiB) even alone at TP {key.tensor_parallel}, "
                        f"micro-batch {mbs}"
                    )
                    refusal = kt.options.host_refusal(layer, layer + 1, 1) if kt.options else ""
                    if refusal:
                        best_where += f"; {refusal}"
            if best > worst:
                worst, where = best, best_where
        if self.stats.memory_shortfall is None or worst < self.stats.memory_shortfall:
            self.stats.memory_shortfall = worst
            self.stats.shortfall_where = where
        overhead = self.costs.constants.framework_overhead_bytes
        layer_need = np.array(
            [
                min(kt.memory_bytes(layer, layer + 1, 1) for kt in tables) - overhead
                for layer in range(self.num_layers)
            ]
        )
        previous = self.stats.layer_memory
        self.stats.layer_memory = (
            layer_need if previous is None else np.minimum(previous, layer_need)
        )
        self.stats.roomiest = max(self.stats.roomiest, *(kt.capacity_bytes for kt in tables))

    def _group(self, mbs: int, dp: int, keys: list[_KindKey], tables: list[KindTables]) -> _Group:
        """Everything the DP of a (micro-batch, DP, kinds) needs that does not depend on
        the depth or the bar: built once and shared by every depth's DP (the outer loop
        solves tens of depths per pair, and both passes meet the same kinds)."""
        group_key = (mbs, dp, tuple(keys))
        cached = self._groups.get(group_key)
        if cached is not None:
            return cached
        micro = self.request.global_batch_size // (mbs * dp)
        servers = self.servers(keys, tables)
        slot_keys = sorted({(k.gpu_type, k.zone) for k in keys})
        type_servers = []
        for gpu_type, zone in slot_keys:
            # stages of one (type, zone) slot may use what any of its kinds may use
            pool_sets = [
                set(sv.pools) for sv in servers if (sv.gpu_type, sv.zone) == (gpu_type, zone)
            ]
            union = tuple(sorted(set.union(*pool_sets)))
            type_servers.append(
                TypeServers(
                    gpu_type,
                    union,
                    min((self.prices[i] for i in union), default=float("inf")),
                )
            )
        # one model per distinct slot set: its feasibility cache then serves every triple
        capacity = self._capacities.get(tuple(type_servers))
        if capacity is None:
            capacity = CapacityModel(self.pools, self.prices, type_servers)
            self._capacities[tuple(type_servers)] = capacity
        per_layer = np.min(np.stack([np.diagonal(kt.compute, offset=1) for kt in tables]), axis=0)
        heavy = self._heavy(per_layer)
        speed = self._stage_speed_bound(dp, keys, tables, heavy)
        kinds = [
            stagedp.Kind(
                slot=slot_keys.index((k.gpu_type, k.zone)),
                gpus=dp * k.tensor_parallel,
                compute=kt.compute_list(),
                tail=kt.tail_list(),
                fits=kt.fits_list,
                compute_at=kt.compute_list_at if kt.options is not None else None,
                tail_at=kt.tail_list_at if kt.options is not None else None,
                joules=(
                    self.energy.stage_joules(
                        sorted({self.pools[i].gpu_type for i in sv.pools}),
                        k.tensor_parallel,
                        mbs,
                        dp,
                        _kept_steps(kt, min(self.num_layers, micro)),
                    )
                    if self.energy is not None
                    else None
                ),
            )
            for k, kt, sv in zip(keys, tables, servers, strict=True)
        ]
        # a zone-pure kind may only open its zone once the zone's earlier twins are used
        zone_slots = {
            zone: [i for i, (_, z) in enumerate(slot_keys) if z == zone] for zone in self.zones
        }
        twins_of_kind = [
            [zone_slots[twin] for twin in self.earlier_twins.get(k.zone, [])] if k.zone else []
            for k in keys
        ]

        def kind_allowed(usage: tuple[int, ...], k: int) -> bool:
            return all(any(usage[i] for i in slots) for slots in twins_of_kind[k])

        spreads: dict[tuple[tuple[int, ...], int], Sequence[float]] = {}
        # the work bound's rows do not depend on the depth either (see stagedp.WorkRows)
        work_bounds = [
            (
                stagedp.WorkRows(
                    [kt.compute for kt in tables],
                    [dp * k.tensor_parallel * w for k, w in zip(keys, weighting.kind, strict=True)],
                    lambda in_flight: [kt.fits(in_flight) for kt in tables],
                    micro,
                ),
                weighting,
            )
            for weighting in self._weightings(speed, servers, type_servers)
        ]
        boundary = self._boundary(mbs, keys)
        cycle_inputs = self._cycle_inputs(
            tables, kinds, boundary, [w for _, w in work_bounds], capacity
        )
        group = _Group(
            micro_batches=micro,
            servers=servers,
            capacity=capacity,
            spreads=spreads,
            dp_args={
                "num_layers": self.num_layers,
                "micro_batches": micro,
                "constant": 0.0,
                "kinds": kinds,
                "num_slots": len(slot_keys),
                "boundary": boundary,
                "usage_ok": capacity.feasible,
                "final_ok": capacity.feasible,
                "rest_lower": np.concatenate([np.cumsum(per_layer[::-1])[::-1], [0.0]]),
                "rest_heavy": np.concatenate([np.cumsum(heavy[::-1])[::-1], [0.0]]),
                "tail_lower": self._tail_by_length(tables),
                # row r (r stages covering [b, L)) is the same for every depth >= r
                "split_lower": self._min_max_split(per_layer, self.num_layers),
                "stage_speed": lambda usage, r: speed.remaining(slot_keys, usage, r),
                "kind_allowed": kind_allowed if any(twins_of_kind) else None,
                "work_bounds": work_bounds,
                "spread_cache": spreads,
                "cycle_inputs": cycle_inputs,
            },
        )
        self._groups[group_key] = group
        return group

    def _cycle_inputs(
        self,
        tables: list[KindTables],
        kinds: list[stagedp.Kind],
        boundary: list[list[list[float]]],
        weightings: list[stagedp.Weighting],
        capacity: CapacityModel,
    ) -> CycleInputs:
        """The stage DP's capacity-aware cycle bound (cyclebound.py) for one group: the
        work bound's weightings, and Hall's condition per usage slot and over all of them
        (capacity.py), each a valid count of what a stage of each kind takes."""
        n = self.num_layers + 1
        hop_in = np.full((n, len(kinds)), np.inf)
        hop_out = np.full((n, len(kinds)), np.inf)
        for b in range(1, self.num_layers):
            hops = np.asarray(boundary[b], dtype=np.float64)  # [from kind, to kind]
            hop_in[b] = hops.min(axis=0)
            hop_out[b] = hops.min(axis=1)
        gpus = np.array([k.gpus for k in kinds], dtype=np.float64)
        slots = len(capacity.servers)
        costs, slot_weights, totals = [], [], []
        for weighting in weightings:
            costs.append(gpus * np.asarray(weighting.kind))
            slot_weights.append(np.asarray(weighting.slot, dtype=np.float64))
            totals.append(weighting.capacity)
        subsets = [[i] for i in range(slots)] + ([list(range(slots))] if slots > 1 else [])
        for subset in subsets:
            pools = {p for i in subset for p in capacity.servers[i].pools}
            costs.append(np.where([k.slot in subset for k in kinds], gpus, 0.0))
            slot_weights.append(np.array([1.0 if i in subset else 0.0 for i in range(slots)]))
            totals.append(float(sum(self.pools[p].gpus for p in pools)))

        def compute_at(in_flight: int) -> list[npt.NDArray[np.float64]]:
            return [
                kt.compute if kt.options is None else kt.options.compute_at(in_flight)
                for kt in tables
            ]

        return CycleInputs(
            compute_at=compute_at,
            fits=lambda in_flight: [kt.fits(in_flight) for kt in tables],
            hop_in=hop_in,
            hop_out=hop_out,
            kind_cost=np.array(costs),
            slot_weight=np.array(slot_weights),
            capacity=np.array(totals),
        )

    def _solve(
        self,
        mbs: int,
        dp: int,
        depth: int,
        keys: list[_KindKey],
        tables: list[KindTables],
        *,
        cap: float = float("inf"),
    ) -> None:
        """Solve one triple; plans whose objective value exceeds min(k-th best, cap) may
        be dropped unseen."""
        batch = self.request.global_batch_size
        group = self._group(mbs, dp, keys, tables)
        micro = group.micro_batches
        servers = group.servers
        capacity = group.capacity

        def limit(usage: tuple[int, ...]) -> float:
            return self.goal.time_limit(
                min(self.top.kth(), cap), capacity.usd_per_hour_lower(usage)
            )

        # every stage still to come takes at least dp GPUs at the cheapest price: a cost
        # limit from the GPUs used so far alone lets a deep pipeline's first stages run on
        # almost unpruned (the cost search's DPs spent most of their time there)
        floor = dp * min(self.prices)

        def limit_ahead(usage: tuple[int, ...], after: int) -> float:
            return self.goal.time_limit(
                min(self.top.kth(), cap), capacity.usd_per_hour_lower(usage) + after * floor
            )

        kind = self.request.objective.kind
        priced = kind == "cost" or (kind == "throughput" and self._priced_constraints())
        ahead = limit_ahead if priced else None
        if self.request.objective.kind == "throughput" and not self._priced_constraints():
            # the time limit does not depend on the price: skip the per-usage pricing
            def limit(usage: tuple[int, ...]) -> float:
                return self.goal.time_limit(min(self.top.kth(), cap), 0.0)

        energy = self.energy
        joules = 0.0
        if energy is not None:
            slot_watts = energy.slot_watts(capacity.servers)
            in_flight = min(self.num_layers, micro)
            joules = energy.joules_lower(
                mbs, dp, updates=not any(_may_offload(kt, in_flight) for kt in tables)
            )
            stage_watts = dp * energy.least_watts

            def limit(usage: tuple[int, ...]) -> float:
                watts = sum(u * w for u, w in zip(usage, slot_watts, strict=True))
                return self.goal.time_limit(
                    min(self.top.kth(), cap), capacity.usd_per_hour_lower(usage), watts, joules
                )

            # every stage still to come holds at least dp GPUs at the least blocking power
            def energy_ahead(usage: tuple[int, ...], after: int) -> float:
                watts = sum(u * w for u, w in zip(usage, slot_watts, strict=True))
                return self.goal.time_limit(
                    min(self.top.kth(), cap),
                    capacity.usd_per_hour_lower(usage),
                    watts + after * stage_watts,
                    joules,
                )

            ahead = energy_ahead

        self.stats.dp_runs += 1
        common = {
            **group.dp_args,
            "depth": depth,
            "expired": self._out_of_time if self.deadline is not None else None,
            "limit_ahead": ahead,
        }
        if kind == "cost" or energy is not None:
            # the time limit falls with the GPUs a plan uses, so the cycle bound could only
            # take the loosest (an empty cluster's), which prunes too little to pay for
            # itself (the min-cost searches ran about 1.5x longer with it; a throughput
            # search under a budget runs faster with it)
            common["cycle_inputs"] = None
        cached = len(group.spreads)
        try:
            results = stagedp.solve(
                limit=limit,
                every_label=energy is not None,
                **common,  # type: ignore[arg-type]
            )
        except stagedp.DeadlineReachedError:
            return
        finally:
            self._spreads_cached += len(group.spreads) - cached
            if self._spreads_cached > _SPREAD_CACHE_ENTRIES:
                # a cache only: clearing it in place (the DPs hold the same dicts) changes
                # nothing but the time to recompute
                for other in self._groups.values():
                    other.spreads.clear()
                self._spreads_cached = 0
        self.stats.evaluated += len(results)
        results.sort(key=lambda r: (r.time, r.usage, r.boundaries, r.kinds))
        if energy is not None:
            # a plan the DP dropped as dominated uses at least the energy bound of one of
            # these (search/energy.py): the least of them bounds the optimum from below
            for result in results:
                watts = sum(u * w for u, w in zip(result.usage, slot_watts, strict=True))
                self.energy_floor = min(self.energy_floor, result.time * watts + result.joules)
        for result in results:
            if result.time > limit(result.usage):
                continue
            if energy is not None:
                # the DP's own bound of this plan (its stages' joules): most of the labels
                # it hands over cannot enter the top k, and need no simulation
                watts = sum(u * w for u, w in zip(result.usage, slot_watts, strict=True))
                if result.time * watts + result.joules > self.top.kth() * (1 + 1e-9):
                    continue
            shapes = [
                StageShape(
                    kind=k,
                    gpu_type=keys[k].gpu_type,
                    tensor_parallel=keys[k].tensor_parallel,
                    zone=keys[k].zone,
                )
                for k in result.kinds
            ]
            placed = place(dp, shapes, servers, self.pools, self.prices)
            if placed is None:
                continue
            edges = result.boundaries
            plan = Plan(
                model=self.request.model,
                optimizer=self.request.optimizer,
                global_batch_size=batch,
                micro_batch_size=mbs,
                num_micro_batches=micro,
                stages=tuple(
                    Stage(
                        layer_start=edges[i],
                        layer_end=edges[i + 1],
                        tensor_parallel=shapes[i].tensor_parallel,
                        replicas=tuple(placed[i]),
                        # recomputation / offload where the range needs it at this depth
                        **tables[shapes[i].kind].stage_options(
                            edges[i], edges[i + 1], min(depth - i, micro)
                        ),
                    )
                    for i in range(depth)
                ),
            )
            placed_bound = None
            if energy is not None:
                # the plan's own bound (its pipelines' slack, search/energy.py): it is only
                # worth simulating, and its exact energy only worth solving, when this can
                # still enter the top k
                placed_bound = energy.placed(plan)
                if placed_bound.lower() > self.top.kth() * (1 + 1e-9):
                    continue
            predictions = simulate(plan, self.context)
            self.stats.simulated += 1
            if not self.goal.satisfied(predictions):
                continue
            if energy is not None and placed_bound is not None:
                lower = max(
                    predictions.iteration_seconds * energy.plan_watts(plan) + result.joules,
                    placed_bound.lower(predictions),
                )
                if lower > self.top.kth() * (1 + 1e-9):
                    continue
                predictions = energy.exact(plan, predictions)
            self.top.offer(
                self.goal.value(predictions), plan.model_copy(update={"predictions": predictions})
            )


def _kept_steps(kt: KindTables, in_flight: int) -> npt.NDArray[np.bool_] | None:
    """Ranges of a kind whose optimizer step stays on the GPU at every position (None:
    all): memory options offload a range's step only where offload is allowed and the
    range does not fit without options, and a stage holds at most `in_flight` = min(L, M)
    micro-batches, so a range that fits without options with that many never offloads
    (search/energy.py counts only these steps)."""
    options = kt.options
    if options is None:
        return None
    offload = options.allowed[memopts.OFFLOAD]
    for code in (memopts.SELECTIVE_OFFLOAD, memopts.BOTH):
        offload = offload | options.allowed[code]
    kept: npt.NDArray[np.bool_] = (options.choice(in_flight) == memopts.NONE) | ~offload
    return kept


def _may_offload(kt: KindTables, in_flight: int) -> bool:
    """May some stage of this kind offload its optimizer step (see _kept_steps)?"""
    kept = _kept_steps(kt, in_flight)
    if kept is None:
        return False
    upper = np.triu(np.ones(kept.shape, dtype=bool), k=1)
    return bool(np.any(upper & ~kept))


def search(request: PlanRequest, profiles: ProfileSet, catalog: Catalog) -> PlanResult:
    """Run the search and package the answer (see module docstring). With
    request.deadline_seconds, the search stops when it runs out: the best plans found so far
    come back with exhaustive=False."""
    started = time.perf_counter()
    deadline = time.monotonic() + request.deadline_seconds if request.deadline_seconds else None
    problem = input_problem(request, catalog, profiles)
    if problem is not None:
        return Infeasible(code="NoProfile", reason=problem)
    engine = Search(request, profiles, catalog, deadline)
    if not engine.pools:
        return Infeasible(code="NoCapacity", reason="the cluster has no ready GPUs")
    if not engine.micro_batch_sizes():
        types = ", ".join(engine.gpu_types)
        return Infeasible(
            code="NoProfile",
            reason=(
                f"no compute profile of {request.model.name} for any GPU type of the cluster "
                f"({types}) at a micro-batch size dividing {request.global_batch_size}"
            ),
        )
    plans = engine.run()
    if not plans and engine.expired:
        return Infeasible(
            code="SearchDeadline",
            reason=(
                f"the search found no feasible plan within its deadline of "
                f"{request.deadline_seconds:g} s ({engine.stats.dp_runs} stage DPs run); allow "
                "more time, or narrow the search (max pipeline depth, fewer pools)"
            ),
        )
    if not plans:
        return _explain_infeasible(request, profiles, catalog, engine, deadline)
    if request.energy_predictions and engine.energy is None:
        floor = request.objective.min_samples_per_second
        plans = [
            p.model_copy(
                update={
                    "predictions": with_energy(
                        p,
                        p.predictions,
                        engine.context,
                        max_slowdown=request.energy_max_slowdown,
                        max_iteration_seconds=(
                            request.global_batch_size / floor if floor else None
                        ),
                    )
                }
            )
            if p.predictions is not None
            else p
            for p in plans
        ]
    inputs = describe_inputs(plans, engine.context, request.cluster.content_hash())
    explained = reasons(plans, engine.goal)
    for i, plan in enumerate(plans):
        memory = memopts.reason(plan, engine.context)
        if memory:
            explained[i] = f"{explained[i]}; {memory}" if explained[i] else memory
    finished = [
        # an uneven split's own reason (uneven.describe) follows the ranking's
        p.model_copy(
            update={
                "inputs": inputs[i],
                "reason": "; ".join(filter(None, [explained[i], p.reason])),
            }
        )
        for i, p in enumerate(plans)
    ]
    lower = None
    if engine.energy is not None and not engine.expired:
        best_energy = engine.goal.value(plans[0].predictions) if plans[0].predictions else 0.0
        lower = min(engine.energy_floor, best_energy)
    return Planned(
        best=finished[0],
        alternatives=tuple(finished[1:]),
        plans_evaluated=engine.stats.evaluated,
        search_seconds=time.perf_counter() - started,
        exhaustive=not engine.expired,
        energy_lower_bound=lower,
    )


def _explain_infeasible(
    request: PlanRequest,
    profiles: ProfileSet,
    catalog: Catalog,
    engine: Search,
    deadline: float | None = None,
) -> Infeasible:
    shortfall = engine.stats.memory_shortfall
    if shortfall is not None and shortfall > 0:
        return Infeasible(
            code="OutOfMemory",
            reason=f"short of {shortfall / GIB:.1f} GiB of GPU memory: {engine.stats.shortfall_where}",
            smallest_memory_shortfall_bytes=int(np.ceil(shortfall)),
        )
    objective = request.objective
    has_constraints = (
        objective.min_samples_per_second is not None
        or objective.max_usd_per_hour is not None
        or objective.max_usd_per_iteration is not None
    )
    if not has_constraints and engine.stats.layer_memory is not None:
        # every layer fits alone: the GPUs together are too small. Lower bound of the
        # deficit: each layer at its smallest footprint, one overhead per GPU in use, on
        # the largest GPUs the cluster has.
        gpus = min(engine.num_layers, engine.total_gpus)
        need = float(engine.stats.layer_memory.sum()) + gpus * (
            engine.costs.constants.framework_overhead_bytes
        )
        have = gpus * engine.stats.roomiest
        if need > have:
            return Infeasible(
                code="OutOfMemory",
                reason=(
                    f"short of at least {(need - have) / GIB:.1f} GiB of GPU memory: "
                    f"{request.model.name} needs {need / GIB:.1f} GiB in model states, "
                    f"activations and per-GPU overhead, the {engine.total_gpus} GPU(s) "
                    f"usable as pipeline stages hold {have / GIB:.1f} GiB"
                ),
                smallest_memory_shortfall_bytes=int(np.ceil(need - have)),
            )
    if not has_constraints:
        return Infeasible(
            code="OutOfMemory" if engine.stats.dp_runs else "NoCapacity",
            reason=(
                "no split of the model into pipeline stages fits in GPU memory with the "
                f"{engine.total_gpus} GPUs available (every layer fits alone, but not a whole "
                "pipeline on the capacity there is)"
            ),
        )
    # Two more searches say by how much the constraints miss; under a deadline they share
    # what is left of it (their answers are then the best found, not proven optima).
    fastest = Search(
        request.model_copy(update={"objective": type(objective)(kind="throughput"), "top_k": 1}),
        profiles,
        catalog,
        deadline,
    ).run()
    cheapest = Search(
        request.model_copy(update={"objective": type(objective)(kind="cost"), "top_k": 1}),
        profiles,
        catalog,
        deadline,
    ).run()
    best_rate = (
        fastest[0].predictions.samples_per_second if fastest and fastest[0].predictions else None
    )
    cheapest_hour = (
        min(p.predictions.usd_per_hour for p in cheapest if p.predictions) if cheapest else None
    )
    if objective.min_samples_per_second is not None and (
        best_rate is None or best_rate < objective.min_samples_per_second
    ):
        return Infeasible(
            code="BelowThroughputFloor",
            reason=(
                f"the fastest plan reaches {best_rate or 0:.1f} samples/s, below the floor of "
                f"{objective.min_samples_per_second:.1f}"
            ),
            best_samples_per_second=best_rate,
            cheapest_usd_per_hour=cheapest_hour,
        )
    cheapest_iteration = (
        cheapest[0].predictions.usd_per_iteration if cheapest and cheapest[0].predictions else None
    )
    budget = []
    if objective.max_usd_per_hour is not None:
        budget.append(f"{objective.max_usd_per_hour:.2f} USD/hour")
    if objective.max_usd_per_iteration is not None:
        budget.append(f"{objective.max_usd_per_iteration:.4f} USD/iteration")
    return Infeasible(
        code="OverBudget",
        reason=(
            f"no plan within {' and '.join(budget) or 'the budget'} meets the constraints; the "
            f"cheapest plan costs {cheapest_hour or 0:.2f} USD/hour, "
            f"{cheapest_iteration or 0:.4f} USD/iteration"
        ),
        best_samples_per_second=best_rate,
        cheapest_usd_per_hour=cheapest_hour,
    )
