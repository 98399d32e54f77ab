"""T5 and wide-ResNet through the planner: the search places every layer once, a stage
boundary inside T5's decoder pays for the encoder output it carries, and a convnet is never
split by tensor parallelism.

Expected values come from the shapes (sequence lengths, hidden size), not from the planner.
"""

from __future__ import annotations

import pytest
from planner_search_cases import cluster, pool
from typer.testing import CliRunner

from sailplan.operator.cli.main import app
from sailplan.planner.api import Planned, PlanRequest, make_plan
from sailplan.planner.catalog import default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.types import ProfileSet
from sailplan.planner.simulator import PlanningContext, simulate

ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"


def _plans(model: ModelSpec, batch: int, *pools_: object) -> list[Plan]:
    request = PlanRequest(
        model=model,
        global_batch_size=batch,
        cluster=cluster(*pools_),
        top_k=5,  # type: ignore[arg-type]
    )
    result = make_plan(request)
    assert isinstance(result, Planned), result
    return [result.best, *result.alternatives]


@pytest.mark.parametrize("name", ["T5-Base", "T5-Large", "WideResNet-50-2"])
def test_the_search_places_every_layer_exactly_once(name: str) -> None:
    model = default_catalog().model(name)
    # V100-16 nodes of 8 GPUs and A100-40: T5-Large's states (737.7M x 16 bytes) do not
    # fit one V100, so some plans pipeline it
    plans = _plans(
        model,
        64,
        pool("V100-16", ZONE_A, 16, per_node=8),
        pool("A100-40", ZONE_A, 8, per_node=8),
    )
    for plan in plans:
        covered = [layer for s in plan.stages for layer in range(s.layer_start, s.layer_end)]
        assert covered == list(range(model.num_layers))
        assert plan.predictions is not None
        assert plan.predictions.stages  # simulate() priced it


def test_wide_resnet_plans_never_use_tensor_parallelism() -> None:
    model = default_catalog().model("WideResNet-50-2")
    plans = _plans(model, 64, pool("A100-40", ZONE_A, 16, per_node=8))
    assert {s.tensor_parallel for plan in plans for s in plan.stages} == {1}
    with pytest.raises(
        ValueError, match="WideResNet-50-2 is a convnet: the trainer does not split its channels"
    ):
        Plan(
            model=model,
            global_batch_size=8,
            micro_batch_size=1,
            num_micro_batches=8,
            stages=(
                Stage(
                    layer_start=0,
                    layer_end=model.num_layers,
                    tensor_parallel=2,
                    replicas=(Replica(pool="p", gpu_type="A100-40", zone=ZONE_A),),
                ),
            ),
        )


def _two_zone_plan(model: ModelSpec, cut: int) -> Plan:
    """Two stages of one A100 each, in two zones, cut before layer `cut`."""
    a = Replica(pool=f"a100-40-{ZONE_A}", gpu_type="A100-40", zone=ZONE_A)
    b = Replica(pool=f"a100-40-{ZONE_B}", gpu_type="A100-40", zone=ZONE_B)
    return Plan(
        model=model,
        global_batch_size=8,
        micro_batch_size=2,
        num_micro_batches=4,
        stages=(
            Stage(layer_start=0, layer_end=cut, tensor_parallel=1, replicas=(a,)),
            Stage(layer_start=cut, layer_end=model.num_layers, tensor_parallel=1, replicas=(b,)),
        ),
    )


def _context(model: ModelSpec) -> PlanningContext:
    snapshot = cluster(pool("A100-40", ZONE_A, 1), pool("A100-40", ZONE_B, 1))
    catalog = default_catalog()
    profiles = complete_profiles(
        model, ["A100-40"], [1], [2], measured=ProfileSet(), catalog=catalog
    )
    return PlanningContext(model=model, cluster=snapshot, profiles=profiles, catalog=catalog)


def test_a_cut_inside_the_t5_decoder_sends_the_encoder_output_as_well() -> None:
    model = default_catalog().model("T5-Base")
    context = _context(model)
    s, t, h, b = 512, 114, 768, 2
    # cut where the decoder starts: only the encoder output crosses; inside the decoder:
    # the decoder's hidden state and the encoder output, both every micro-batch, both ways
    at_encoder_end = simulate(_two_zone_plan(model, model.first_decoder_layer), context)
    in_decoder = simulate(_two_zone_plan(model, model.first_decoder_layer + 4), context)
    moved = 2 * 4  # forward and backward, 4 micro-batches, fp16
    # and the trainer's sums of the shared parameters both stages use (simulator/ties.py):
    # a ring of two carries each fp16 gradient once each way across the zones
    tokens = 2 * 2 * model.vocab_size * h
    decoder_bias = 2 * 2 * model.relative_attention_buckets * model.num_heads
    assert at_encoder_end.egress_bytes_per_iteration == moved * 2 * b * s * h + tokens
    assert (
        in_decoder.egress_bytes_per_iteration == moved * 2 * b * (t + s) * h + tokens + decoder_bias
    )
    # a decoder-only model of the same hidden size and sequence sends one hidden state
    gpt = ModelSpec(
        name="gpt-768",
        family="gpt3",
        hidden_size=h,
        num_blocks=24,
        num_heads=12,
        vocab_size=32128,
        sequence_length=s,
        tied_embeddings=True,
    )
    decoder_only = simulate(_two_zone_plan(gpt, 13), _context(gpt))
    assert in_decoder.egress_bytes_per_iteration > decoder_only.egress_bytes_per_iteration
    assert context.costs.boundary_bytes(b, 20) > _context(gpt).costs.boundary_bytes(b, 20)


def test_sailplan_plan_accepts_the_zoo_models_by_name() -> None:
    runner = CliRunner()
    for name in ("t5-base", "wide_resnet50_2"):
        result = runner.invoke(
            app,
            ["plan", "--model", name, "--global-batch", "64", "--pool", "A100:us-central1-a:8"],
        )
        assert result.exit_code == 0, result.stdout
        assert "Best plan" in result.stdout
