"""T5 (encoder-decoder) and wide-ResNet (convnet) shapes: published sizes, layer lists,
what crosses a stage boundary, and the shapes the spec refuses.

The expected parameter counts are the published ones (Hugging Face's t5-base card and
num_parameters(): 222.9M; torchvision's wide_resnet50_2 weights table: 68,883,240), and the
ResNet count is also rebuilt here by hand from the architecture table of He et al. 2016
(Table 1) with Zagoruyko & Komodakis' widening, independently of ModelSpec's code.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sailplan.planner.catalog import default_catalog
from sailplan.planner.modelspec import ModelSpec


def test_t5_base_has_the_published_222_9m_parameters_counting_the_shared_matrix_once() -> None:
    model = default_catalog().model("t5-base")
    # Hugging Face's num_parameters() counts `shared` (encoder embedding, decoder embedding
    # and, tied, the LM head) once: 222.9M. An untied head would be another 32128 x 768.
    assert model.tied_embeddings
    assert model.total_parameters() == pytest.approx(222.9e6, abs=0.05e6)
    untied = model.model_copy(update={"tied_embeddings": False})
    assert untied.total_parameters() - model.total_parameters() == 32128 * 768
    assert untied.total_parameters() == pytest.approx(247.6e6, abs=0.05e6)


@pytest.mark.parametrize(
    ("name", "published"),
    # Hugging Face num_parameters() of t5-small and t5-large (tied, as for t5-base)
    [("T5-Small", 60.5e6), ("T5-Large", 737.7e6)],
)
def test_other_t5_sizes_match_their_published_counts(name: str, published: float) -> None:
    assert default_catalog().model(name).total_parameters() == pytest.approx(published, abs=0.05e6)


def _wide_resnet50_2_by_hand() -> int:
    # stem: 7x7 conv 3 -> 64 (no bias) + batch norm (scale, shift)
    total = 7 * 7 * 3 * 64 + 2 * 64
    channels = 64
    # conv2_x .. conv5_x: 3, 4, 6, 3 bottlenecks of planes 64, 128, 256, 512; the 1x1
    # and 3x3 convolutions are 2 x planes wide, the last 1x1 gives 4 x planes; the first
    # block of each stage projects its input with a 1x1 convolution + batch norm
    for planes, count in ((64, 3), (128, 4), (256, 6), (512, 3)):
        width, out = 2 * planes, 4 * planes
        for block in range(count):
            total += channels * width + 2 * width  # 1x1 + bn
            total += 3 * 3 * width * width + 2 * width  # 3x3 + bn
            total += width * out + 2 * out  # 1x1 + bn
            if block == 0:
                total += channels * out + 2 * out  # projection + bn
            channels = out
    return total + 2048 * 1000 + 1000  # fc with bias


def test_wide_resnet50_2_has_torchvision_s_68_88m_parameters() -> None:
    model = default_catalog().model("wide_resnet50_2")
    assert _wide_resnet50_2_by_hand() == 68_883_240  # torchvision's published num_params
    assert model.total_parameters() == 68_883_240
    assert model.total_parameters() == pytest.approx(68.88e6, abs=0.005e6)


def test_t5_layer_list_is_embedding_encoder_decoder_head() -> None:
    model = default_catalog().model("T5-Base")
    kinds = [model.layer_kind(i) for i in range(model.num_layers)]
    assert kinds == ["embedding"] + ["block"] * 12 + ["decoder-block"] * 12 + ["head"]
    assert model.first_decoder_layer == 13
    # the position bias table is in the first block of each stack, the encoder's final
    # norm in its last block; otherwise the blocks of a stack are alike
    encoder = [model.layer_parameters(i) for i in range(1, 13)]
    decoder = [model.layer_parameters(i) for i in range(13, 25)]
    assert encoder[0] - encoder[1] == decoder[0] - decoder[1] == 32 * 12
    assert encoder[-1] - encoder[1] == 768
    # a decoder block has a second attention (4 x 768^2, no biases) and a third norm
    assert decoder[1] - encoder[1] == 4 * 768 * 768 + 768


def test_wide_resnet_layer_list_is_stem_sixteen_bottlenecks_and_the_classifier() -> None:
    model = default_catalog().model("WideResNet-50-2")
    assert model.num_layers == 18
    assert [model.layer_kind(i) for i in (0, 1, 16, 17)] == [
        "stem",
        "conv-block",
        "conv-block",
        "head",
    ]
    sides = [b.out_side for b in model.conv_blocks()]
    assert sides == [56] * 3 + [28] * 4 + [14] * 6 + [7] * 3  # 224 / 4, then halved per stage
    assert model.boundary_shapes(2, 1) == ((2, 64, 56, 56),)
    assert model.boundary_shapes(2, 17) == ((2, 2048, 7, 7),)


def test_a_decoder_side_boundary_carries_the_encoder_output_too() -> None:
    model = default_catalog().model("T5-Base")
    b, s, t, h = 4, 512, 114, 768
    for layer in range(1, model.first_decoder_layer + 1):
        assert model.boundary_shapes(b, layer) == ((b, s, h),)
    for layer in range(model.first_decoder_layer + 1, model.num_layers):
        assert model.boundary_shapes(b, layer) == ((b, t, h), (b, s, h))
        assert model.boundary_activation_elements(b, layer) == b * (t + s) * h


def test_tensor_parallelism_splits_t5_heads_and_never_a_convnet() -> None:
    catalog = default_catalog()
    t5 = catalog.model("T5-Base")
    # 12 heads: the degrees that divide them (and the 3072-wide MLP)
    assert [tp for tp in (1, 2, 3, 4, 5, 8) if t5.supports_tensor_parallel(tp)] == [1, 2, 3, 4]
    resnet = catalog.model("WideResNet-50-2")
    assert resnet.max_tensor_parallel() == 1
    assert [tp for tp in (1, 2, 4, 8) if resnet.supports_tensor_parallel(tp)] == [1]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {
                "architecture": "convnet",
                "stage_blocks": (1, 1),
                "image_size": 8,
                "num_classes": 4,
                "hidden_size": 32,
            },
            "a convnet has no hidden_size",
        ),
        (
            {
                "architecture": "convnet",
                "stage_blocks": (1, 1),
                "num_blocks": 3,
                "image_size": 8,
                "num_classes": 4,
            },
            "not the sum of stage_blocks",
        ),
        (
            {
                "architecture": "encoder-decoder",
                "position_embedding": "relative",
                "hidden_size": 32,
                "num_heads": 4,
                "vocab_size": 64,
                "sequence_length": 8,
                "num_blocks": 4,
            },
            "0 < decoder_blocks < num_blocks",
        ),
        (
            {
                "architecture": "decoder",
                "position_embedding": "relative",
                "hidden_size": 32,
                "num_heads": 4,
                "vocab_size": 64,
                "sequence_length": 8,
                "num_blocks": 4,
            },
            "relative position embeddings go with the encoder-decoder",
        ),
        ({"hidden_size": 32, "num_heads": 4, "num_blocks": 2}, "a transformer needs vocab_size"),
    ],
)
def test_inconsistent_shapes_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ModelSpec.model_validate({"name": "bad", **fields})
