"""The catalog: published model sizes, aliases, typed lookup errors, prices and egress tiers."""

from __future__ import annotations

from pathlib import Path

import pytest

from sailplan.planner.catalog import (
    CatalogError,
    UnknownGPUError,
    UnknownModelError,
    default_catalog,
    load_catalog,
)


@pytest.mark.parametrize(
    ("name", "published"),
    [
        # Brown et al. 2020 (GPT-3), Table 2.1
        ("GPT3-Small", 125e6),
        ("GPT3-Medium", 350e6),
        ("GPT3-Large", 760e6),
        ("GPT3-XL", 1.3e9),
        ("GPT3-2.7B", 2.7e9),
        ("GPT3-6.7B", 6.7e9),
        ("GPT3-13B", 13e9),
        ("GPT3-175B", 175e9),
        # Zhang et al. 2022 (OPT), Table 1
        ("OPT-350M", 350e6),
        ("OPT-30B", 30e9),
        # EleutherAI model card, Meta's model card (8.03B), Devlin et al. 2019 (BERT)
        ("GPT-Neo-2.7B", 2.7e9),
        ("LLaMA-3-8B", 8.03e9),
        ("BERT-Base", 110e6),
        ("BERT-Large", 340e6),
    ],
)
def test_named_shapes_reproduce_published_parameter_counts(name: str, published: float) -> None:
    entry = default_catalog().model_entry(name)
    model = entry.spec
    count = model.total_parameters()
    if not entry.published_counts_head and not model.tied_embeddings:
        # the published figure counts the shared embedding/head matrix once
        count -= model.vocab_size * model.hidden_size
    # 3%: rounding in the papers' names and details the shape does not model
    # (BERT's token-type embeddings and pooler, GPT-3 13B's 5140 vs 5120 hidden size)
    assert count == pytest.approx(published, rel=0.03)


def test_opt_350m_layer_parameters_match_the_sailor_artifact_llm_info() -> None:
    # models/llm_info.json of the Sailor artifact: OPT-350 at TP=1 has 12,596,224 parameters
    # per block (12h^2 + 13h with h = 1024) and 26 layers.
    model = default_catalog().model("OPT-350")
    assert model.num_layers == 26
    assert model.block_parameters(1) == 12 * 1024**2 + 13 * 1024 == 12_596_224


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("GH-96", "GH200-96"),
        ("nvidia-tesla-a100", "A100-40"),
        ("nvidia-a100-80gb", "A100-80"),
        ("nvidia-h100-80gb", "H100-80"),
        ("nvidia-tesla-v100", "V100-16"),
        ("nvidia-l4", "L4"),
        ("nvidia-tesla-t4", "T4"),
        ("nvidia-h200-141gb", "H200-141"),
        ("a100-40", "A100-40"),
    ],
)
def test_gpu_aliases_resolve(alias: str, canonical: str) -> None:
    assert default_catalog().resolve_gpu(alias) == canonical


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("OPT-350", "OPT-350M"),
        ("GPT-Neo-2.7", "GPT-Neo-2.7B"),
        ("LLAMA-3-8", "LLaMA-3-8B"),
        ("OPT-30", "OPT-30B"),
    ],
)
def test_sailor_model_names_resolve(alias: str, canonical: str) -> None:
    assert default_catalog().model(alias).name == canonical


def test_unknown_names_raise_typed_errors_listing_valid_names() -> None:
    catalog = default_catalog()
    with pytest.raises(UnknownGPUError) as gpu_error:
        catalog.gpu("B300")
    assert "'B300'" in str(gpu_error.value)
    assert "A100-40" in str(gpu_error.value) and "V100-16" in str(gpu_error.value)
    with pytest.raises(UnknownModelError) as model_error:
        catalog.model("GPT-5")
    assert "OPT-350M" in str(model_error.value)
    assert isinstance(gpu_error.value, CatalogError)


def test_every_required_gpu_has_specs_and_prices() -> None:
    catalog = default_catalog()
    required = {
        "V100-16", "A100-40", "A100-80", "H100-80", "H200-141", "GH200-96",
        "L4", "T4", "RTX-2080", "RTX-3090", "Titan-RTX",
    }  # fmt: skip
    assert required <= set(catalog.gpu_names())
    # memory from the datasheets, in GiB
    assert catalog.gpu("A100-80").memory_bytes == 80 * 1024**3
    assert catalog.gpu("GH200-96").memory_bytes == 96 * 1024**3


def test_prices_use_the_artifact_figures_region_and_spot() -> None:
    catalog = default_catalog()
    # the Sailor artifact README's prices
    assert catalog.price_per_gpu_hour("A100-40", "us-central1") == 3.67
    assert catalog.price_per_gpu_hour("V100-16", "us-central1") == 2.86
    assert catalog.price_per_gpu_hour("GH-96", "us-central1") == 11.06
    # a listed region overrides the default; spot is cheaper than on-demand
    assert catalog.price_per_gpu_hour("A100-40", "europe-west4") == 3.93
    assert catalog.price_per_gpu_hour("A100-40", spot=True) < 3.67


def test_egress_tiers_follow_gcp_pricing() -> None:
    catalog = default_catalog()
    assert catalog.egress_usd_per_gb("us-central1-a", "us-central1-a") == 0.0
    assert catalog.egress_usd_per_gb("us-central1-a", "us-central1-b") == 0.01
    assert catalog.egress_usd_per_gb("us-central1-a", "us-west1-b") == 0.02
    assert catalog.egress_usd_per_gb("us-central1-a", "europe-west4-a") == 0.08
    assert catalog.egress_usd_per_gb("europe-west4-a", "australia-southeast1-a") == 0.15
    # symmetric
    assert catalog.egress_usd_per_gb("europe-west4-a", "us-central1-a") == 0.08


def test_user_yaml_overrides_fields_and_adds_entries(tmp_path: Path) -> None:
    extra = tmp_path / "catalog.yaml"
    extra.write_text(
        "gpus:\n"
        "  A100-40:\n"
        "    prices: {default: {on_demand: 2.5, spot: 1.0}}\n"
        "models:\n"
        "  Tiny:\n"
        "    hidden_size: 64\n    num_blocks: 2\n    num_heads: 4\n"
        "    vocab_size: 128\n    sequence_length: 32\n"
    )
    catalog = load_catalog(extra)
    assert catalog.price_per_gpu_hour("A100-40") == 2.5
    assert catalog.gpu("A100-40").memory_gib == 40  # untouched fields survive
    assert catalog.model("tiny").num_layers == 4
    assert default_catalog().price_per_gpu_hour("A100-40") == 3.67  # the cache is untouched


def test_broken_user_yaml_is_one_clear_error(tmp_path: Path) -> None:
    extra = tmp_path / "catalog.yaml"
    extra.write_text("gpus:\n  X1:\n    memory_gib: 10\n")
    with pytest.raises(CatalogError) as error:
        load_catalog(extra)
    # one line naming the entry and the first problem
    assert str(error.value) == "invalid catalog GPUSpec 'X1': peak_flops: Field required"
