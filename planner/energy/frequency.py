"""Per-stage SM clocks of one pipeline under the simulator's 1F1B schedule, for a deadline.

The simulator prices a 1F1B pipeline (costs.one_f_one_b_seconds) as

    T = sum_i t_i + 2 sum_k x_k + (M - 1) max_i (t_i + x_{i-1} + x_i)

The first term is the warm-up/cool-down chain: one micro-batch's forward through every stage
and its backward back (each stage's first forward and last backward), on the critical path
of every stage. The last term is the steady state, paced by the slowest stage's cycle; a
stage whose cycle is shorter waits (blocks) for the rest of each cycle: that slack is
Perseus' intrinsic energy bloat. Per-pass planning (solve) gives each stage two clocks:
`fill` for its warm-up / cool-down pass and `steady` for its other M - 1 forward/backward
passes, and

    T(fill, steady) = sum_i t_i(fill_i) + 2 sum_k x_k + (M - 1) max_i (t_i(steady_i) + x_{i-1} + x_i)

With every clock at its maximum this is exactly the simulator's time.

Energy: a GPU draws its blocking power P_b for the whole iteration and P(f) - P_b more
while it computes at clock f, so the part clocks can change is the *effective* energy
sum over passes of (P(f) - P_b) t(f) (Perseus' effective energy, in lowtime's
examples/perseus.py: cost -= p_p2p * time); the blocking baseline P_b x T is added by the
caller, who knows the iteration time of every pipeline.

solve() minimizes effective energy subject to T <= deadline greedily: from the fastest
state it repeatedly takes the move that saves the most effective energy per second of
added pipeline time and still meets the deadline -- lowering one stage's fill clock by any
number of levels, or lengthening the steady cycle to any longer breakpoint (every stage
then runs its steady passes at its least-energy clock that fits the cycle). At the
fastest deadline only free moves fit: stages off the critical cycle slow down until they
just meet it (Perseus' "no slowdown" point); later deadlines trade time for energy. The
greedy is a heuristic (Perseus solves its per-instruction DAG, an NP-hard problem, with
an approximate graph-cut-based algorithm: ml-energy/zeus docs/research_overview/
perseus.md); each move strictly lowers the energy, so it terminates and never ends above
the fastest state's energy.

solve_single() is what a GPU can apply: the node agent locks one clock per GPU, so every
pass of a stage runs at one clock (fill_i == steady_i). A slower stage then lengthens the
fill chain as well as, possibly, the cycle:

    T(l) = sum_i t_i(l_i) + 2 sum_k x_k + (M - 1) max_i (t_i(l_i) + x_{i-1} + x_i)

and at the fastest deadline no stage can slow down at all (unless a lower clock costs it
no time): the saving Perseus gets at no slowdown needs per-pass clock switching. A small
allowed slowdown buys most of it back, since a non-critical stage's slowing costs only its
one fill pass. solve_single() is exact (see its docstring); solve() stays the per-pass
(two-clock) answer, reported as what per-pass switching would save.

Pure and deterministic; numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_REL_TOL = 1e-12


@dataclass(frozen=True)
class StageOptions:
    """One stage of one pipeline: its clock levels, sorted fastest first.

    seconds[l] = forward + backward of one micro-batch at level l; effective_joules[l] =
    (P(f) - P_b) x seconds[l] for the whole replica (all its TP GPUs); links = the
    activation transfers its steady cycle includes (x_{i-1} + x_i).
    """

    mhz: tuple[int, ...]
    seconds: tuple[float, ...]
    effective_joules: tuple[float, ...]
    links: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.mhz)
        if n == 0 or len(self.seconds) != n or len(self.effective_joules) != n:
            raise ValueError("StageOptions needs one seconds and joules value per clock level")
        if any(b < a for a, b in zip(self.seconds, self.seconds[1:], strict=False)):
            raise ValueError("StageOptions levels must be sorted fastest first")


@dataclass(frozen=True)
class PipelineProblem:
    stages: tuple[StageOptions, ...]
    micro_batches: int
    fill_links: float = 0.0  # 2 x sum of the boundary transfers


@dataclass(frozen=True)
class PipelineClocks:
    """A solution: level indices per stage, the pipeline time and its effective energy."""

    fill: tuple[int, ...]
    steady: tuple[int, ...]
    seconds: float
    effective_joules: float

    def fill_mhz(self, problem: PipelineProblem) -> tuple[int, ...]:
        return tuple(s.mhz[i] for s, i in zip(problem.stages, self.fill, strict=True))

    def steady_mhz(self, problem: PipelineProblem) -> tuple[int, ...]:
        return tuple(s.mhz[i] for s, i in zip(problem.stages, self.steady, strict=True))


def pipeline_seconds(problem: PipelineProblem, fill: Sequence[int], steady: Sequence[int]) -> float:
    """T(fill, steady) of the module docstring."""
    stages = problem.stages
    fill_time = sum(s.seconds[i] for s, i in zip(stages, fill, strict=True))
    cycle = max(s.seconds[i] + s.links for s, i in zip(stages, steady, strict=True))
    return fill_time + problem.fill_links + (problem.micro_batches - 1) * cycle


def effective_joules(problem: PipelineProblem, fill: Sequence[int], steady: Sequence[int]) -> float:
    m = problem.micro_batches - 1
    return sum(
        s.effective_joules[f] + m * s.effective_joules[q]
        for s, f, q in zip(problem.stages, fill, steady, strict=True)
    )


def default_clocks(problem: PipelineProblem) -> PipelineClocks:
    """Every stage at its fastest level (the maximum clock)."""
    zeros = (0,) * len(problem.stages)
    return PipelineClocks(
        fill=zeros,
        steady=zeros,
        seconds=pipeline_seconds(problem, zeros, zeros),
        effective_joules=effective_joules(problem, zeros, zeros),
    )


@dataclass
class _Steady:
    """Effective energy of the steady passes as a function of the cycle length."""

    cycles: FloatArray  # candidate cycle lengths, increasing; cycles[0] = the fastest cycle
    joules: FloatArray  # sum over stages of the best effective joules fitting each cycle
    levels: IntArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))


def _steady_table(problem: PipelineProblem) -> _Steady:
    stages = problem.stages
    fastest = max(s.seconds[0] + s.links for s in stages)
    candidates = {fastest}
    for s in stages:
        for t in s.seconds:
            if t + s.links > fastest:
                candidates.add(t + s.links)
    cycles = np.array(sorted(candidates), dtype=np.float64)
    joules = np.zeros(len(cycles), dtype=np.float64)
    levels = np.zeros((len(stages), len(cycles)), dtype=np.int64)
    for k, s in enumerate(stages):
        seconds = np.asarray(s.seconds, dtype=np.float64)
        energy = np.asarray(s.effective_joules, dtype=np.float64)
        # best level among the first j+1 (prefix argmin of the energy)
        best_index = np.zeros(len(energy), dtype=np.int64)
        for j in range(1, len(energy)):
            prev = best_index[j - 1]
            best_index[j] = j if energy[j] < energy[prev] else prev
        budget = cycles - s.links
        fits = np.searchsorted(seconds, budget * (1 + _REL_TOL), side="right") - 1
        fits = np.maximum(fits, 0)
        chosen = best_index[fits]
        levels[k] = chosen
        joules += energy[chosen]
    return _Steady(cycles=cycles, joules=joules, levels=levels)


def solve(problem: PipelineProblem, deadline: float) -> PipelineClocks:
    """Least effective energy (greedily) with the pipeline time at most `deadline`.

    A deadline below the fastest time gives the fastest state (all clocks at maximum,
    steady passes of stages off the critical cycle slowed for free).
    """
    stages = problem.stages
    n = len(stages)
    m = problem.micro_batches - 1
    steady = _steady_table(problem)
    fill = [0] * n
    c = 0
    fill_time = sum(s.seconds[0] for s in stages)
    time = fill_time + problem.fill_links + m * float(steady.cycles[0])
    energy = sum(s.effective_joules[0] for s in stages) + m * float(steady.joules[0])
    scale = max(abs(energy), 1e-30)
    slack_tol = _REL_TOL * max(deadline, time) if np.isfinite(deadline) else 0.0
    seconds = [np.asarray(s.seconds, dtype=np.float64) for s in stages]
    joules = [np.asarray(s.effective_joules, dtype=np.float64) for s in stages]
    while True:
        slack = deadline - time + slack_tol
        best: tuple[float, int, int] | None = None  # (ratio, stage or -1 for cycle, level)
        if m > 0 and c + 1 < len(steady.cycles):
            d_time = m * (steady.cycles[c + 1 :] - steady.cycles[c])
            d_energy = m * (steady.joules[c + 1 :] - steady.joules[c])
            ok = (d_time <= slack) & (d_energy < -_REL_TOL * scale)
            if ok.any():
                ratio = np.where(ok, d_energy / np.maximum(d_time, 1e-300), np.inf)
                j = int(np.argmin(ratio))
                best = (float(ratio[j]), -1, c + 1 + j)
        for i in range(n):
            cur = fill[i]
            if cur + 1 >= len(seconds[i]):
                continue
            d_time = seconds[i][cur + 1 :] - seconds[i][cur]
            d_energy = joules[i][cur + 1 :] - joules[i][cur]
            ok = (d_time <= slack) & (d_energy < -_REL_TOL * scale)
            if not ok.any():
                continue
            ratio = np.where(
                ok, np.where(d_time > 0, d_energy / np.maximum(d_time, 1e-300), -np.inf), np.inf
            )
            j = int(np.argmin(ratio))
            if best is None or float(ratio[j]) < best[0]:
                best = (float(ratio[j]), i, cur + 1 + j)
        if best is None:
            break
        _, which, level = best
        if which < 0:
            time += m * float(steady.cycles[level] - steady.cycles[c])
            energy += m * float(steady.joules[level] - steady.joules[c])
            c = level
        else:
            time += float(seconds[which][level] - seconds[which][fill[which]])
            energy += float(joules[which][level] - joules[which][fill[which]])
            fill[which] = level
    steady_levels = tuple(int(steady.levels[k][c]) for k in range(n))
    fill_levels = tuple(fill)
    return PipelineClocks(
        fill=fill_levels,
        steady=steady_levels,
        seconds=pipeline_seconds(problem, fill_levels, steady_levels),
        effective_joules=effective_joules(problem, fill_levels, steady_levels),
    )


def _efficient_levels(stage: StageOptions) -> list[int]:
    """Levels (fastest first) whose energy is below every faster level's: any other level
    is dominated by a faster one that costs no more energy."""
    kept = [0]
    for level in range(1, len(stage.seconds)):
        if stage.effective_joules[level] < stage.effective_joules[kept[-1]]:
            kept.append(level)
    return kept


def solve_single(
    problem: PipelineProblem, deadline: float, *, watts_of_time: float = 0.0
) -> PipelineClocks:
    """Least effective energy with ONE clock per stage (fill == steady) and the pipeline
    time at most `deadline`; exact. With watts_of_time > 0 the objective is the effective
    energy plus watts_of_time x the pipeline time (the blocking power every GPU draws for
    as long as the iteration lasts), still exact.

    Method: the answer's cycle is one of the stages' cycle lengths t_i(l) + links_i (at a
    level no faster level beats in energy: any other level is dominated). For each such
    cycle C with (M - 1) C within the deadline, every stage may take the levels whose
    cycle fits C, and the fill chain sum_i t_i(l_i) has the budget
    deadline - 2 sum x - (M - 1) C: a multiple-choice knapsack (stage i's cost at level l
    is M e_i(l) + watts_of_time t_i(l)), solved exactly by merging the stages' Pareto
    fronts of (time, cost) (Nemhauser-Ullmann), pruned by the budget and by the best
    objective found so far. The least over C is the optimum: at the optimum's own cycle
    its assignment is feasible and priced exactly, and an assignment feasible for any C
    meets the deadline at no more than the price it was given. A deadline below the
    fastest time gives the fastest state.
    """
    stages = problem.stages
    m = problem.micro_batches - 1
    fastest = tuple(0 for _ in stages)
    t_fast = pipeline_seconds(problem, fastest, fastest)
    tol = _REL_TOL * max(abs(deadline), t_fast) if np.isfinite(deadline) else 0.0
    limit = max(deadline, t_fast) + tol
    options = [_efficient_levels(s) for s in stages]
    seconds = [
        np.asarray(s.seconds, dtype=np.float64)[o] for s, o in zip(stages, options, strict=True)
    ]
    costs = [
        (m + 1) * np.asarray(s.effective_joules, dtype=np.float64)[o] + watts_of_time * sec
        for s, o, sec in zip(stages, options, seconds, strict=True)
    ]
    cycles_of = [sec + s.links for sec, s in zip(seconds, stages, strict=True)]
    c0 = max(float(c[0]) for c in cycles_of)
    if m > 0:
        candidates = sorted(
            {c0}
            | {float(x) for c in cycles_of for x in c if x > c0 and m * (x - c0) <= limit - t_fast}
        )
    else:
        candidates = [max(float(c[-1]) for c in cycles_of)]  # no steady state: any cycle
    best_value = np.inf
    best: tuple[int, ...] = fastest
    min_time = [float(sec[0]) for sec in seconds]
    for cycle in candidates:
        allowed = [int(np.searchsorted(c, cycle * (1 + _REL_TOL), side="right")) for c in cycles_of]
        budget = limit - problem.fill_links - m * cycle
        steady_cost = watts_of_time * m * cycle
        cheapest = [int(np.argmin(c[:a])) for c, a in zip(costs, allowed, strict=True)]
        least = [float(c[k]) for c, k in zip(costs, cheapest, strict=True)]
        bound = sum(least) + steady_cost
        if np.isfinite(best_value) and bound >= best_value - _REL_TOL * abs(best_value):
            continue  # even unconstrained by the budget this cycle cannot do better
        if sum(float(sec[k]) for sec, k in zip(seconds, cheapest, strict=True)) <= budget:
            best_value, best = bound, tuple(cheapest)
            continue
        found = _knapsack(
            [sec[:a] for sec, a in zip(seconds, allowed, strict=True)],
            [c[:a] for c, a in zip(costs, allowed, strict=True)],
            budget=budget,
            ceiling=best_value - steady_cost,
            min_time=min_time,
            least=least,
        )
        if found is not None:
            best_value, best = found[0] + steady_cost, found[1]
    levels = tuple(options[i][k] for i, k in enumerate(best))
    return PipelineClocks(
        fill=levels,
        steady=levels,
        seconds=pipeline_seconds(problem, levels, levels),
        effective_joules=effective_joules(problem, levels, levels),
    )


def _knapsack(
    seconds: Sequence[FloatArray],
    costs: Sequence[FloatArray],
    *,
    budget: float,
    ceiling: float,
    min_time: Sequence[float],
    least: Sequence[float],
) -> tuple[float, tuple[int, ...]] | None:
    """Least sum of costs with sum of seconds <= budget, one option per stage (seconds
    rising): Pareto fronts of (time, cost) merged stage by stage, pruned by the budget and
    the ceiling (min_time, least: each stage's least time and cost, for the stages still to
    come). None when nothing costs less than `ceiling`."""
    n = len(seconds)
    below = ceiling - _REL_TOL * abs(ceiling) if np.isfinite(ceiling) else np.inf
    rest_time = np.concatenate([np.cumsum(np.asarray(min_time[::-1]))[::-1], [0.0]])
    rest_cost = np.concatenate([np.cumsum(np.asarray(least[::-1]))[::-1], [0.0]])
    front_t = np.zeros(1)
    front_c = np.zeros(1)
    history: list[tuple[IntArray, IntArray]] = []
    for i in range(n):
        sec = seconds[i]
        t = (front_t[:, None] + sec[None, :]).ravel()
        c = (front_c[:, None] + costs[i][None, :]).ravel()
        parent = np.repeat(np.arange(len(front_t)), len(sec))
        level = np.tile(np.arange(len(sec)), len(front_t))
        keep = (t + rest_time[i + 1] <= budget) & (c + rest_cost[i + 1] < below)
        t, c, parent, level = t[keep], c[keep], parent[keep], level[keep]
        if len(t) == 0:
            return None
        order = np.lexsort((c, t))
        t, c, parent, level = t[order], c[order], parent[order], level[order]
        running = np.minimum.accumulate(c)
        pareto = np.ones(len(c), dtype=bool)
        pareto[1:] = c[1:] < running[:-1]
        front_t, front_c = t[pareto], c[pareto]
        history.append((parent[pareto], level[pareto]))
    k = int(np.argmin(front_c))
    value = float(front_c[k])
    chosen = [0] * n
    for i in range(n - 1, -1, -1):
        parents, levels = history[i]
        chosen[i] = int(levels[k])
        k = int(parents[k])
    return value, tuple(chosen)
