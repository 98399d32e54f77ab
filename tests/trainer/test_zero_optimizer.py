"""ZeRO-1 ownership: every replica computes the same, balanced owner map."""

from __future__ import annotations

from sailplan.trainer.optimizer import assign_owners


def test_owners_balance_the_state_and_break_ties_by_lowest_rank() -> None:
    # largest first onto the least-loaded rank: 100 -> r0, 60 -> r1, 50 -> r1 (60 < 100),
    # 10 -> r0 (100 < 110), 10 -> r0 (110 = 110, lowest rank wins)
    assert assign_owners([10, 100, 50, 60, 10], 2) == [0, 0, 1, 1, 0]
    assert assign_owners([5, 5, 5], 1) == [0, 0, 0]


def test_each_rank_owns_a_near_even_share() -> None:
    sizes = [1000 + 37 * i for i in range(40)]
    owners = assign_owners(sizes, 4)
    loads = [sum(s for s, o in zip(sizes, owners, strict=True) if o == r) for r in range(4)]
    assert max(loads) - min(loads) <= max(sizes)
