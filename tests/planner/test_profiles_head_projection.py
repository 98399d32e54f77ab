"""A measured head faster than its output projection at the GPU's peak did not run it, and
gets it back at its own profile's block rate (profiles/head_projection.py).

The expectations follow by hand from the synthetic profiles: GPT-Neo-2.7B's projection is
2 x 50257 x 2560 FLOPs per token, its block's matmuls 2 x 12 x 2560^2 plus attention.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.profiles.flops import layer_forward_flops
from sailplan.planner.profiles.head_projection import (
    head_runs_its_projection,
    with_head_projection,
)
from sailplan.planner.profiles.sailor import import_artifact
from sailplan.planner.profiles.types import ComputeProfile, Provenance

CATALOG = default_catalog()
NEO = CATALOG.model("GPT-Neo-2.7B")
A100 = CATALOG.gpu("A100-40")


def neo_profile(head_forward: float, block_forward: float = 0.04) -> ComputeProfile:
    n = NEO.num_layers
    forward = [0.006] + [block_forward] * (n - 2) + [head_forward]
    return ComputeProfile(
        model=NEO.name,
        gpu_type="A100-40",
        tensor_parallel=1,
        micro_batch_size=8,
        forward_s=tuple(forward),
        backward_s=tuple(2.5 * t for t in forward),
        update_s=(0.001,) * n,
        provenance=Provenance(source="measured", tool="test"),
    )


def test_a_head_faster_than_its_projection_at_peak_gets_it_at_the_block_rate() -> None:
    head = NEO.num_layers - 1
    projection = layer_forward_flops(NEO, head, 1, 8)
    assert projection / A100.peak_flops > 0.0014  # 13.5 ms: a 1.4 ms head cannot hold it
    short = neo_profile(head_forward=0.0014)
    assert not head_runs_its_projection(short, NEO, A100)
    fixed = with_head_projection(short, NEO, A100)
    block = layer_forward_flops(NEO, 1, 1, 8)
    assert fixed.forward_s[head] == pytest.approx(0.0014 + 0.04 * projection / block)
    # backward at the block's backward rate (2x the forward FLOPs in 2.5x the time)
    assert fixed.backward_s[head] == pytest.approx(2.5 * 0.0014 + 0.1 * projection / block)
    assert fixed.forward_s[:head] == short.forward_s[:head]
    assert "output projection" in fixed.provenance.note


def test_a_head_that_can_hold_its_projection_is_left_alone() -> None:
    head = NEO.num_layers - 1
    plausible = neo_profile(head_forward=2 * layer_forward_flops(NEO, head, 1, 8) / A100.peak_flops)
    assert with_head_projection(plausible, NEO, A100) == plausible


def test_the_sailor_importer_puts_the_projection_back(tmp_path: Path) -> None:
    path = tmp_path / "profiles" / "GPT-Neo-2.7" / "A100-40" / "profile.json"
    path.parent.mkdir(parents=True)
    rows = {str(i): [0.04, 0.1, 0.001] for i in range(NEO.num_layers)}
    rows["0"], rows[str(NEO.num_layers - 1)] = [0.006, 0.0, 0.001], [0.0014, 0.0013, 0.001]
    path.write_text(json.dumps({"8": {"1": rows}}))
    (found,) = import_artifact(tmp_path, CATALOG).profiles.compute
    assert found.forward_s[-1] > 0.04  # more than a block: the projection is back
    assert "output projection" in found.provenance.note
