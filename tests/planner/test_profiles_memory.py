"""Per-layer memory from the shape: Korthikanti's activation formula and the artifact's llm_info."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sailplan.planner.catalog import default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.memory import (
    block_activation_bytes,
    boundary_activation_bytes,
    head_activation_bytes,
)

ARTIFACT = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "sailor-artifact"
GPT = ModelSpec(
    name="gpt", hidden_size=1024, num_blocks=4, num_heads=16, vocab_size=1000, sequence_length=2048
)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("mbs", [1, 4])
def test_block_activations_are_korthikanti_equation(tp: int, mbs: int) -> None:
    # Korthikanti et al. 2022, Sec. 4.1, tensor parallel without sequence parallelism:
    # s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes per layer
    s, h, a = 2048, 1024, 16
    expected = s * mbs * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    assert block_activation_bytes(GPT, tp, mbs) == pytest.approx(expected)


def test_flash_attention_drops_the_score_term() -> None:
    s, h = 2048, 1024
    assert block_activation_bytes(GPT, 1, 1, flash_attention=True) == pytest.approx(s * h * 34)


def test_boundary_is_one_fp16_hidden_state() -> None:
    assert boundary_activation_bytes(GPT, 8, 1) == 2 * 8 * 2048 * 1024
    assert boundary_activation_bytes(GPT, 8, GPT.num_layers - 1) == 2 * 8 * 2048 * 1024


def test_head_keeps_fp16_logits_and_their_fp32_softmax() -> None:
    s, h, v = 2048, 1024, 1000
    assert head_activation_bytes(GPT, 2, 1) == pytest.approx(4 * s * h + 6 * s * v / 2)


@pytest.fixture(scope="module")
def llm_info() -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    path = ARTIFACT / "models" / "llm_info.json"
    if not path.exists():
        pytest.skip(f"the Sailor artifact is not at {ARTIFACT}")
    data: dict[str, dict[str, dict[str, dict[str, float]]]] = json.loads(path.read_text())
    return data


@pytest.mark.parametrize("tp", ["1", "2", "4", "8"])
def test_opt_350m_matches_the_artifact_llm_info(
    llm_info: dict[str, dict[str, dict[str, dict[str, float]]]], tp: str
) -> None:
    model = default_catalog().model("OPT-350M")
    layers = llm_info["OPT-350"][tp]
    t = int(tp)
    # The artifact's Megatron build pads the vocabulary to a multiple of 128 x TP; with the
    # same padding every layer's parameter count matches exactly.
    padded = -(-model.vocab_size // (128 * t)) * 128 * t
    padded_model = model.model_copy(update={"vocab_size": padded})
    for index in range(model.num_layers):
        info = layers[str(index)]
        assert padded_model.layer_parameters(index, t) == info["params_floats"]
        # the boundary activation is one hidden state per sample
        if 0 < index < model.num_layers - 1:
            assert info["act_output_floats"] == model.sequence_length * model.hidden_size
    # activation memory per block: the artifact measured what PyTorch held (act_mem_bytes);
    # the formula is within 15% of it at every TP degree
    block = layers["1"]["act_mem_bytes"]
    assert block_activation_bytes(model, t, 1) == pytest.approx(block, rel=0.15)
