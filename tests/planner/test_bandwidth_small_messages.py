"""A bandwidth fit is not extrapolated into smaller messages taking longer.

The Sailor artifact's link fits are degree-2 polynomials of bandwidth in log2(MB); below
the sizes measured they bend down to zero, where the 1 MB/s floor made a 10 KB message on
a Titan-RTX VM link take 10 ms, 145x a 45 KB one. BandwidthCurve holds the time at the
knee below which that happens; every evaluation site (the scalar rate, the search's
vectorized transfer time, the all-reduce's rate) must agree.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from sailplan.planner.profiles.types import BandwidthCurve
from sailplan.planner.simulator.collectives import _rate
from sailplan.planner.simulator.costs import transfer_seconds_array

# network/multizone_bandwidths_het.json, Titan-RTX 1 GPU/VM to Titan-RTX 1 GPU/VM
TITAN = BandwidthCurve(
    coefficients=(-0.02187029, 0.25919871, 2.24710243), max_bytes_per_s=2856544700.716824
)
# network/intra_node_bandwidths.json, RTX-3090 with 2 GPUs
RTX3090_X2 = BandwidthCurve(
    coefficients=(-0.20465065, 5.5235483, 18.34015839), max_bytes_per_s=49769218367.58904
)
SIZES = np.geomspace(1.0, 1e10, 400)


def seconds(curve: BandwidthCurve, nbytes: float) -> float:
    return nbytes / curve.bytes_per_second(nbytes)


@pytest.mark.parametrize("curve", [TITAN, RTX3090_X2])
def test_a_smaller_message_never_takes_longer(curve: BandwidthCurve) -> None:
    times = [seconds(curve, float(n)) for n in SIZES]
    assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(times))
    assert math.isfinite(curve.small_message_knee) and curve.small_message_knee < 0


def test_the_fit_is_kept_where_it_was_measured_and_a_10_kb_message_costs_microseconds() -> None:
    c0, c1, c2 = TITAN.coefficients
    for megabytes in (1.0, 16.0, 500.0):
        x = math.log2(megabytes)
        assert TITAN.bytes_per_second(megabytes * 1e6) == pytest.approx(
            min((c0 * x * x + c1 * x + c2) * 1e9, TITAN.max_bytes_per_s), rel=1e-12
        )
    knee_bytes = 2**TITAN.small_message_knee * 1e6
    assert seconds(TITAN, 1e4) == pytest.approx(seconds(TITAN, knee_bytes), rel=1e-9)
    assert seconds(TITAN, 1e4) < 1e-3  # the raw fit is below 0 there: 10 ms at 1 MB/s


def test_flat_curves_have_no_knee() -> None:
    flat = BandwidthCurve(coefficients=(0.0, 0.0, 2.0), max_bytes_per_s=2e9)
    assert flat.small_message_knee == -math.inf
    assert flat.bytes_per_second(10.0) == pytest.approx(2e9)


@pytest.mark.parametrize("curve", [TITAN, RTX3090_X2])
def test_every_evaluation_site_agrees(curve: BandwidthCurve) -> None:
    scalar = np.array([curve.bytes_per_second(float(n)) for n in SIZES])
    assert np.allclose(_rate(curve, SIZES), scalar, rtol=1e-12)
    assert np.allclose(transfer_seconds_array(curve, SIZES), SIZES / scalar, rtol=1e-12)
