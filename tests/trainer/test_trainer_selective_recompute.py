"""Selective recomputation (Stage.recompute = "selective") in the trainer: the attention
cores run through torch.utils.checkpoint, nothing else.

Arithmetic: recomputing the core runs the same operations on the same inputs again, so the
loss and the gradients equal the plain run's within test_parallel_equivalence's 1e-5
relative (one process here: in fact bit for bit; the bound is the tests' common one), and
plans with selective stages train to the single-process losses like the other memory
options (test_memory_options_losses.py). That the core really is recomputed, and only it:
the backward calls scaled_dot_product_attention once more per attention sub-layer.

Memory: after one forward of the whole model, the storages still alive (the autograd
graph's saved tensors, checkpoint's inputs) as in test_memory_options_accounting.py: less
than without recomputation by at least what the attention kernel keeps beyond the core's
inputs (its log-sum-exp; with grouped-query attention the K and V repeated per query head),
and more than with full recomputation. The trainer's attention is torch's
scaled_dot_product_attention, whose kernels (flash on GPU, its CPU counterpart here) do not
store the s x s scores that Korthikanti's 5as^2b term counts (Megatron-DeepSpeed's unfused
attention, which the simulator assumes unless SimulatorConstants.flash_attention), so the
trainer frees far less than the simulator's selective saving: the simulator's peak for
such a stage is an overestimate, and docs/guide/memory-options.md says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from kept_storage import kept_after
from trainer_harness import TINY, TINY_LLAMA, TINY_T5, make_plan, step_losses, trainer_config

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan
from sailplan.trainer.model import StageModel

pytestmark = pytest.mark.trainer

RELATIVE = 1e-5
BATCH = 2
STEPS = 4


def _batch(spec: ModelSpec) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    batch = {
        "inputs": torch.randint(
            spec.vocab_size, (BATCH, spec.sequence_length), generator=generator
        ),
        "targets": torch.randint(spec.vocab_size, (BATCH, spec.target_length), generator=generator),
    }
    if spec.architecture == "encoder-decoder":
        batch["decoder_inputs"] = torch.randint(
            spec.vocab_size, (BATCH, spec.target_length), generator=generator
        )
    return batch


def _attention_sublayers(spec: ModelSpec) -> int:
    if spec.architecture == "encoder-decoder":
        return spec.encoder_blocks + 2 * spec.decoder_blocks
    return spec.num_blocks


def _loss_and_grads(
    spec: ModelSpec, mode: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    model = StageModel(spec, 0, spec.num_layers)
    model.initialise(seed=3)
    model.set_recompute(mode)
    calls = 0
    original = torch.nn.functional.scaled_dot_product_attention

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
        loss = model(None, _batch(spec))
        assert isinstance(loss, torch.Tensor)
        loss.backward()  # type: ignore[no-untyped-call]
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, calls


@pytest.mark.parametrize("spec", [TINY, TINY_LLAMA, TINY_T5], ids=lambda s: s.name)
def test_selective_gives_the_same_loss_and_gradients(
    spec: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    loss, grads, plain_calls = _loss_and_grads(spec, "none", monkeypatch)
    selective_loss, selective_grads, calls = _loss_and_grads(spec, "selective", monkeypatch)
    attention = _attention_sublayers(spec)
    assert plain_calls == attention
    # the backward ran every attention core once more
    assert calls == 2 * attention
    torch.testing.assert_close(selective_loss, loss, rtol=RELATIVE, atol=0.0)
    assert grads.keys() == selective_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(selective_grads[name], grad, rtol=RELATIVE, atol=1e-9)


def _kept_bytes(spec: ModelSpec, mode: str) -> int:
    """Bytes of the storages one forward created that are still alive (parameters excluded)."""
    model = StageModel(spec, 0, spec.num_layers)
    model.initialise(seed=3)
    model.set_recompute(mode)
    batch = _batch(spec)
    loss, kept = kept_after(lambda: model(None, batch), [*model.parameters(), *model.buffers()])
    del loss
    return kept


@pytest.mark.parametrize("spec", [TINY, TINY_LLAMA], ids=lambda s: s.name)
def test_selective_keeps_less_than_none_and_more_than_full(spec: ModelSpec) -> None:
    none, selective, full = (_kept_bytes(spec, mode) for mode in ("none", "selective", "full"))
    b, s, heads = BATCH, spec.sequence_length, spec.num_heads
    # per block the checkpointed core no longer keeps the kernel's fp32 log-sum-exp
    # (b x heads x s) and, under grouped-query attention, the K and V it repeated to every
    # query head (2 x b x s x heads x head_dim); the attention output stays (o_proj's input)
    freed = b * heads * s * 4
    if spec.kv_heads != heads:
        freed += 2 * b * s * heads * spec.head_dim * 4
    assert none - selective >= spec.num_blocks * freed
    assert full < selective


def _selective(plan: Plan, stages: tuple[int, ...]) -> Plan:
    updated = tuple(
        stage.model_copy(update={"recompute": "selective"}) if i in stages else stage
        for i, stage in enumerate(plan.stages)
    )
    return plan.model_copy(update={"stages": updated})


@pytest.fixture(scope="module")
def single_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    """The reference: each model trained by one process, no options."""
    out = {}
    for spec in (TINY, TINY_LLAMA):
        tmp = tmp_path_factory.mktemp(spec.name)
        plan = make_plan(spec, [(0, spec.num_layers, 1)], 1, 2, 8)
        out[spec.name] = step_losses(plan, trainer_config(tmp, STEPS, zero_stage=1), tmp)
    return out


@pytest.mark.parametrize(
    ("spec", "splits", "dp", "stages"),
    [
        pytest.param(TINY, [(0, 3, 1), (3, 6, 1)], 2, (0, 1), id="pp2-dp2"),
        pytest.param(TINY_LLAMA, [(0, 2, 2), (2, 4, 1)], 1, (0,), id="llama-pp2-tp2-tp1"),
    ],
)
def test_selective_plans_keep_the_single_process_losses(
    *,
    single_process: dict[str, list[float]],
    spec: ModelSpec,
    splits: list[tuple[int, int, int]],
    dp: int,
    stages: tuple[int, ...],
    tmp_path: Path,
) -> None:
    plan = _selective(make_plan(spec, splits, dp, 2, 8), stages)
    assert sum(s.recompute == "selective" for s in plan.stages) == len(stages)
    losses = step_losses(plan, trainer_config(tmp_path, STEPS, zero_stage=1), tmp_path)
    reference = single_process[spec.name]
    assert losses == pytest.approx(reference, rel=RELATIVE)
    assert reference[-1] < reference[0] * (1 - 100 * RELATIVE)
