"""profiles.rescale: a model on a GPU from another model of its family measured there.

The roofline gives how the two models' layers compare, the reference's measurement the
level per layer kind and direction; expectations are computed from the roofline by hand.
"""

from __future__ import annotations

import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.estimate import estimate_compute_profile
from sailplan.planner.profiles.rescale import rescale_profile
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance

CATALOG = default_catalog()
OPT = CATALOG.model("OPT-350M")
NEO = CATALOG.model("GPT-Neo-2.7B")
LLAMA = CATALOG.model("LLaMA-3-8B")
GH200 = CATALOG.gpu("GH200-96")
MODELS = {m.name: m for m in (OPT, NEO, LLAMA)}


def roofline(model: ModelSpec, tp: int, mbs: int) -> ComputeProfile:
    return estimate_compute_profile(model, GH200, tp, mbs)


def measured(model: ModelSpec, scale: float, update: float = 0.002) -> ComputeProfile:
    """The roofline of `model` x `scale` (x 3 for the head), as if measured."""
    roof = roofline(model, 1, 2)
    head = [3.0 if model.layer_kind(i) == "head" else 1.0 for i in range(model.num_layers)]
    return ComputeProfile(
        model=model.name,
        gpu_type="GH200-96",
        tensor_parallel=1,
        micro_batch_size=2,
        forward_s=tuple(t * scale * h for t, h in zip(roof.forward_s, head, strict=True)),
        backward_s=tuple(t * scale * h for t, h in zip(roof.backward_s, head, strict=True)),
        update_s=tuple(update for _ in roof.update_s),
        provenance=Provenance(source="measured", tool="test"),
    )


def test_each_layer_kind_takes_the_level_the_reference_measured() -> None:
    found = rescale_profile(
        NEO,
        "GH200-96",
        1,
        2,
        measured=ProfileSet(compute=(measured(OPT, 1.5),)),
        models=MODELS,
        roofline=roofline,
    )
    assert found is not None and found.provenance.source == "estimated"
    roof = roofline(NEO, 1, 2)
    assert found.forward_s[1] == pytest.approx(1.5 * roof.forward_s[1])
    assert found.backward_s[5] == pytest.approx(1.5 * roof.backward_s[5])
    assert found.forward_s[-1] == pytest.approx(4.5 * roof.forward_s[-1])
    assert "OPT-350M" in found.provenance.note


def test_another_family_or_grid_point_is_no_reference() -> None:
    swiglu = ProfileSet(compute=(measured(LLAMA, 1.5),))
    assert (
        rescale_profile(NEO, "GH200-96", 1, 2, measured=swiglu, models=MODELS, roofline=roofline)
        is None
    )
    gelu = ProfileSet(compute=(measured(OPT, 1.5),))
    assert (
        rescale_profile(NEO, "GH200-96", 1, 4, measured=gelu, models=MODELS, roofline=roofline)
        is None
    )
    assert (
        rescale_profile(NEO, "A100-40", 1, 2, measured=gelu, models=MODELS, roofline=roofline)
        is None
    )


def test_two_references_give_their_geometric_mean() -> None:
    opt30 = CATALOG.model("OPT-30B")
    found = rescale_profile(
        NEO,
        "GH200-96",
        1,
        2,
        measured=ProfileSet(compute=(measured(OPT, 1.0), measured(opt30, 4.0))),
        models={**MODELS, opt30.name: opt30},
        roofline=roofline,
    )
    assert found is not None
    assert found.forward_s[3] == pytest.approx(2.0 * roofline(NEO, 1, 2).forward_s[3])
