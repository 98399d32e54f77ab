"""T5 and wide-ResNet: pipeline, data and (T5) tensor parallel plans give the
single-process losses, as the decoders do (test_parallel_equivalence.py, whose docstring
justifies the 1e-5 relative tolerance: only float32 summation order may differ).

T5's plans cut inside the encoder, exactly where the decoder starts (that stage reads the
decoder's input tokens) and inside the decoder (the boundary carries the decoder's hidden
state and the encoder output, and the encoder output's gradient comes back summed over
every decoder block after the cut); the token matrix and both position bias tables are
used on several stages, whose copies' gradients are summed. Wide-ResNet's batch norms use
micro-batch statistics, so its plans keep the reference's micro-batch size (4): each
micro-batch then holds the same samples as the reference's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from trainer_harness import TINY_T5, TINY_WRN, plan_losses

from sailplan.planner.modelspec import ModelSpec
from sailplan.trainer.model import build_layer
from sailplan.trainer.tp import TPGroup

pytestmark = pytest.mark.trainer

STEPS = 4
RELATIVE = 1e-5
# wide-ResNet: 4 samples per batch norm; with DP 2 one micro-batch per replica
MICRO = {TINY_T5.name: 2, TINY_WRN.name: 4}


def _losses(
    spec: ModelSpec,
    splits: list[tuple[int, int, int]],
    *,
    dp: int,
    tmp: Path,
    zero_stage: Literal[0, 1, 2] = 1,
) -> list[float]:
    mbs = MICRO[spec.name]
    return plan_losses(spec, splits, dp=dp, mbs=mbs, tmp=tmp, steps=STEPS, zero_stage=zero_stage)


@pytest.fixture(scope="module")
def single_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    return {
        spec.name: _losses(
            spec, [(0, spec.num_layers, 1)], dp=1, tmp=tmp_path_factory.mktemp(spec.name)
        )
        for spec in (TINY_T5, TINY_WRN)
    }


# TINY_T5's layers: 0 embedding, 1-2 encoder blocks, 3-4 decoder blocks, 5 head.
# TINY_WRN's: 0 stem, 1-5 bottlenecks (stages of 2, 1, 1, 1), 6 classifier.
@pytest.mark.parametrize(
    ("spec", "splits", "dp", "zero_stage"),
    [
        # cut inside the decoder: (decoder hidden, encoder output) cross; the last stage
        # keeps copies of the token matrix (tied head) and the decoder's bias table
        pytest.param(TINY_T5, [(0, 4, 1), (4, 6, 1)], 1, 1, id="t5-pp2-decoder-cut"),
        # three stages, the middle one at TP 2 (heads and bias tables split): it holds the
        # last encoder block (a copy of the encoder's table) and the first decoder block
        # (owner of the decoder's table, embeds with a copy of the token matrix)
        pytest.param(TINY_T5, [(0, 2, 1), (2, 4, 2), (4, 6, 1)], 1, 1, id="t5-pp3-tp2-middle"),
        # cut where the decoder starts, two replicas with ZeRO-2: the second stage reads
        # the decoder's input tokens itself
        pytest.param(TINY_T5, [(0, 3, 1), (3, 6, 1)], 2, 2, id="t5-pp2-dp2-zero2"),
        # a stage boundary inside the first stage of bottlenecks and one after a
        # downsampling block, two replicas
        pytest.param(TINY_WRN, [(0, 2, 1), (2, 7, 1)], 2, 1, id="wrn-pp2-dp2"),
        pytest.param(TINY_WRN, [(0, 1, 1), (1, 4, 1), (4, 7, 1)], 1, 1, id="wrn-pp3"),
    ],
)
def test_zoo_plan_matches_single_process(
    *,
    single_process: dict[str, list[float]],
    spec: ModelSpec,
    splits: list[tuple[int, int, int]],
    dp: int,
    zero_stage: Literal[0, 1, 2],
    tmp_path: Path,
) -> None:
    reference = single_process[spec.name]
    parallel = _losses(spec, splits, dp=dp, tmp=tmp_path, zero_stage=zero_stage)
    assert parallel == pytest.approx(reference, rel=RELATIVE)
    # it trains: the loss fell by more than 100 times the tolerance
    assert reference[-1] < reference[0] * (1 - 100 * RELATIVE)


def test_a_convnet_layer_refuses_tensor_parallelism() -> None:
    with pytest.raises(ValueError, match="tiny-wrn is a convnet: the trainer does not split"):
        build_layer(TINY_WRN, 1, TPGroup(rank=0, size=2))
