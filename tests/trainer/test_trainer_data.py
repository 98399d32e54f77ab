"""Samples are addressed by global index, so every plan reads the same samples per step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from trainer_harness import TINY, make_plan, run_plan

from sailplan.planner.workerenv import DataConfig, TrainerConfig
from sailplan.trainer.data import SyntheticTokens, make_source, micro_batch
from sailplan.trainer.tokenfile import FsspecTokens


def _step_samples(
    source: SyntheticTokens, step: int, data_parallel: int, mbs: int, gbs: int
) -> set[bytes]:
    micro = gbs // (mbs * data_parallel)
    rows: set[bytes] = set()
    for replica in range(data_parallel):
        for m in range(micro):
            inputs, targets = micro_batch(
                source,
                step=step,
                replica=replica,
                micro=m,
                micro_batch_size=mbs,
                num_micro_batches=micro,
                global_batch_size=gbs,
            )
            for row_in, row_target in zip(inputs, targets, strict=True):
                assert torch.equal(row_in[1:], row_target[:-1])  # targets are shifted inputs
                rows.add(torch.cat([row_in, row_target[-1:]]).numpy().tobytes())
    return rows


def test_synthetic_samples_are_a_pure_function_of_seed_and_index() -> None:
    a, b = SyntheticTokens(64, 16, seed=3), SyntheticTokens(64, 16, seed=3)
    assert np.array_equal(a.sample(12345), b.sample(12345))
    assert not np.array_equal(a.sample(1), a.sample(2))
    assert not np.array_equal(a.sample(1), SyntheticTokens(64, 16, seed=4).sample(1))
    assert a.sample(0).shape == (17,) and a.sample(0).max() < 64


def test_a_step_covers_the_same_samples_under_any_data_parallel_split() -> None:
    source = SyntheticTokens(64, 16, seed=0)
    one = _step_samples(source, step=5, data_parallel=1, mbs=8, gbs=8)
    assert len(one) == 8
    assert _step_samples(source, step=5, data_parallel=2, mbs=2, gbs=8) == one
    assert _step_samples(source, step=5, data_parallel=4, mbs=1, gbs=8) == one
    assert _step_samples(source, step=6, data_parallel=1, mbs=8, gbs=8).isdisjoint(one)


def test_token_file_samples_are_windows_of_a_local_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(100, dtype=np.uint16).tofile(path)  # no sidecar: uint16 as the vocabulary fits
    source = make_source(
        DataConfig(kind="token-file", path=str(path)), vocab_size=1000, sequence_length=10
    )
    assert isinstance(source, FsspecTokens)
    # (100 - 11) // 10 + 1 = 9 windows; window w holds the 11 tokens from w * 10; an epoch
    # (9 samples) visits every window once, in a seeded order
    rows = [source.sample(i).tolist() for i in range(9)]
    assert sorted(r[0] for r in rows) == list(range(0, 90, 10))
    assert all(r == list(range(r[0], r[0] + 11)) for r in rows)
    assert (
        make_source(DataConfig(kind="token-file", path=f"file://{path}"), 1000, 10)
        .sample(3)
        .tolist()
        == rows[3]
    )


@pytest.mark.trainer
def test_training_reads_the_token_file(tmp_path: Path) -> None:
    """The same plan on a token file and on the synthetic stream sees different samples, and
    the token file's samples are the same under a two-stage plan (losses match)."""
    tokens = tmp_path / "tokens.bin"
    rng = np.random.Generator(np.random.PCG64(5))
    rng.integers(TINY.vocab_size, size=4000, dtype=np.uint16).tofile(tokens)

    def losses(
        splits: list[tuple[int, int, int]], data: DataConfig, name: str, dp: int = 1
    ) -> list[float]:
        plan = make_plan(TINY, splits, data_parallel=dp, micro_batch_size=2, global_batch_size=8)
        config = TrainerConfig(
            steps=2, learning_rate=1e-3, checkpoint_dir=str(tmp_path / name / "ckpt"), data=data
        )
        run = run_plan(plan, config, tmp_path / name)
        return [run.losses[1], run.losses[2]]

    # the reference reads on the training thread; the others through the prefetch thread
    single = losses(
        [(0, 6, 1)], DataConfig(kind="token-file", path=str(tokens), prefetch_steps=0), "file-1"
    )
    from_file = DataConfig(kind="token-file", path=f"file://{tokens}")
    assert losses([(0, 3, 1), (3, 6, 1)], from_file, "file-2") == pytest.approx(single, rel=1e-5)
    # two replicas, each reading only its half of every step
    assert losses([(0, 6, 1)], from_file, "file-dp2", dp=2) == pytest.approx(single, rel=1e-5)
    # uniformly random tokens: the loss starts near ln(64) = 4.16 and cannot be learnt
    assert single[0] == pytest.approx(np.log(TINY.vocab_size), abs=0.1)
    assert losses([(0, 6, 1)], DataConfig(), "synthetic") != pytest.approx(single, rel=1e-3)
