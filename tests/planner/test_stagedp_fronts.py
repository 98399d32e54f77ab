"""The stage DP's canonical labels keep it exact: its best time equals a brute force.

stagedp.solve stores each partial pipeline's (closed cycle, open cycle) in a canonical
form: the closed cycle raised to what the stages still to come force anyway (the open
stage's cycle with the cheapest outgoing hop, the spread bound of the layers left), the
open cycle raised to where no outgoing hop can make it matter. Labels that only differed
there then dominate each other. That is exact only if every completion scores both forms
alike; these tests check it against an enumeration of every layer split and every kind
per stage, scored by the iteration-time formula in stagedp's docstring, on random
instances whose hops depend on the cut layer and on both kinds (so the dearest and the
cheapest hop out of a stage differ), whose memory depends on the in-flight count, with
capacity limits and with bounds that bind. Blocks of identical time (the case that made
the fronts large) and irregular ones are both drawn.
"""

from __future__ import annotations

import pytest
from stagedp_cases import brute_force, instance

from sailplan.planner.search import stagedp


@pytest.mark.parametrize("identical_blocks", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_canonical_fronts_keep_the_exact_optimum(seed: int, identical_blocks: bool) -> None:
    args, _ = instance(seed, identical_blocks=identical_blocks)
    layers = int(args["num_layers"])  # type: ignore[call-overload]
    for depth in range(1, layers + 1):
        expected = brute_force(args, depth)
        unbounded = stagedp.solve(depth=depth, limit=lambda usage: float("inf"), **args)  # type: ignore[arg-type]
        got = {(r.usage, r.kinds[-1]): r.time for r in unbounded}
        assert got.keys() == expected.keys()
        for key, time in expected.items():
            assert got[key] == pytest.approx(time, rel=1e-12, abs=1e-12), (depth, key)
        if not expected:
            continue
        # with the optimum as the bar, the bounds prune hard and the optimum must survive
        optimum = min(expected.values())
        bar = optimum * (1 + 1e-12)
        barred = stagedp.solve(depth=depth, limit=lambda usage, bar=bar: bar, **args)  # type: ignore[arg-type]
        assert min(r.time for r in barred) == pytest.approx(optimum, rel=1e-12)
