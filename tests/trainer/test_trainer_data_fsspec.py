"""Token files over fsspec: each replica reads only its samples' bytes, in a seeded order.

The file's token at position p is p itself (uint32), so a sample's first token names the
byte offset it was read from, independently of the code under test.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.trainer.data import StepBatches, replica_samples
from sailplan.trainer.prefetch import Prefetcher
from sailplan.trainer.tokenfile import DataError, FsspecTokens, WindowOrder

SEQ = 8
TOKENS = 4001  # 500 windows of 9 tokens with stride 8
VOCAB = 1 << 20  # uint32 tokens, and every position value is a valid token


class CountingMemory(MemoryFileSystem):
    """memory:// that records every byte range read."""

    protocol = "countmem"

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(super()._strip_protocol(path.replace("countmem://", "memory://", 1)))

    reads: list[tuple[str, int | None, int | None]] = []  # noqa: RUF012 (shared on purpose)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> bytes:
        CountingMemory.reads.append((path, start, end))
        data: bytes = super().cat_file(path, start, end, **kw)
        return data


fsspec.register_implementation("countmem", CountingMemory, clobber=True)


@pytest.fixture
def url() -> Iterator[str]:
    fs = fsspec.filesystem("countmem")
    fs.pipe("/corpus/tokens.bin", np.arange(TOKENS, dtype="<u4").tobytes())
    fs.pipe("/corpus/tokens.bin.json", b'{"dtype": "uint32", "tokens": %d}' % TOKENS)
    CountingMemory.reads.clear()
    yield "countmem:///corpus/tokens.bin"
    fs.rm("/corpus", recursive=True)


def _plan(dp: int, mbs: int, counts: tuple[int, ...] | None, stages: int = 2) -> Plan:
    spec = ModelSpec(
        name="t",
        family="opt",
        hidden_size=32,
        num_blocks=2,
        num_heads=4,
        vocab_size=VOCAB,
        sequence_length=SEQ,
    )
    replicas = tuple(Replica(pool=f"p{r}", gpu_type="CPU", zone="z") for r in range(dp))
    micro = max(counts) if counts else 12 // (mbs * dp)
    return Plan(
        model=spec,
        global_batch_size=12,
        micro_batch_size=mbs,
        num_micro_batches=micro,
        pipeline_micro_batches=counts,
        stages=tuple(
            Stage(
                layer_start=i * 4 // stages,
                layer_end=(i + 1) * 4 // stages,
                tensor_parallel=1,
                replicas=replicas,
            )
            for i in range(stages)
        ),
    )


def _step_rows(source: FsspecTokens, plan: Plan, step: int) -> list[list[int]]:
    rows: list[list[int]] = []
    for replica in range(plan.data_parallel):
        batches = StepBatches(source, plan, replica, first=step, last=step + 1, depth=1)
        for inputs, targets in batches.step(step):
            assert inputs.shape == (plan.micro_batch_size, SEQ)
            assert (inputs[:, 1:] == targets[:, :-1]).all()
            rows += [[*r.tolist(), int(t[-1])] for r, t in zip(inputs, targets, strict=True)]
        batches.close()
    return rows


def test_window_order_is_a_seeded_permutation() -> None:
    for windows in (1, 2, 5, 500, 1023, 1024, 1025):
        order = WindowOrder(windows, seed=3)
        got = order(np.arange(windows, dtype=np.int64), epoch=0)
        assert sorted(got.tolist()) == list(range(windows))
    order = WindowOrder(500, seed=3)
    first = order(np.arange(500, dtype=np.int64), 0)
    assert first.tolist() != list(range(500))
    assert order(np.arange(500, dtype=np.int64), 1).tolist() != first.tolist()
    assert WindowOrder(500, seed=4)(np.arange(500, dtype=np.int64), 0).tolist() != first.tolist()


@pytest.mark.parametrize(
    ("dp", "mbs", "counts"),
    [(1, 4, None), (2, 2, None), (3, 2, None), (2, 2, (1, 5)), (3, 1, (2, 4, 6))],
)
def test_replicas_read_disjoint_samples_covering_the_global_batch(
    url: str, dp: int, mbs: int, counts: tuple[int, ...] | None
) -> None:
    source = FsspecTokens(url, VOCAB, SEQ, seed=7)
    reference = _step_rows(source, _plan(1, 4, None), step=3)
    rows = _step_rows(source, _plan(dp, mbs, counts), step=3)
    assert rows == reference  # the same global sample order, whatever the split
    starts = [r[0] for r in rows]
    assert len(set(starts)) == 12
    for row in rows:  # each row is a window: SEQ+1 consecutive tokens at a multiple of SEQ
        assert row == list(range(row[0], row[0] + SEQ + 1)) and row[0] % SEQ == 0


def test_a_replica_reads_only_its_samples_byte_ranges(url: str) -> None:
    source = FsspecTokens(url, VOCAB, SEQ, seed=7)
    CountingMemory.reads.clear()
    plan = _plan(2, 2, (1, 5))
    StepBatches(source, plan, 1, first=4, last=5, depth=0).step(4)
    samples = replica_samples(plan, 4, 1)
    assert len(samples) == 10
    windows = source.windows_of(list(samples))
    expected = sorted((w * SEQ * 4, (w * SEQ + SEQ + 1) * 4) for w in windows.tolist())
    assert sorted((s, e) for _, s, e in CountingMemory.reads) == expected  # type: ignore[misc]


def test_resume_sees_the_same_sequence(url: str) -> None:
    source = FsspecTokens(url, VOCAB, SEQ, seed=7)
    plan = _plan(2, 2, None)
    whole = [_step_rows(source, plan, s) for s in range(6)]
    reopened = FsspecTokens(url, VOCAB, SEQ, seed=7)
    assert [_step_rows(reopened, _plan(3, 1, (1, 2, 9)), s) for s in range(3, 6)] == whole[3:]
    # 500 windows, 12 samples a step: step 41 holds samples 492..503, across epochs 0 and 1,
    # each epoch a full permutation of the windows
    epoch0 = [r[0] // SEQ for s in range(41) for r in _step_rows(source, plan, s)]
    epoch0 += [r[0] // SEQ for r in _step_rows(source, plan, 41)[:8]]
    assert sorted(epoch0) == list(range(500))


def test_prefetch_thread_stops_on_close() -> None:
    started = threading.Event()

    def fetch(step: int) -> int:
        started.set()
        return step

    prefetch = Prefetcher(fetch, 0, 1000, depth=2)
    assert prefetch.get(0) == 0
    started.wait(5)
    assert prefetch.running  # blocked on a full queue, ahead of the consumer
    prefetch.close()
    assert not prefetch.running


def test_missing_file_is_one_line() -> None:
    with pytest.raises(DataError, match=r"^token file memory:///nope.bin: not found$"):
        FsspecTokens("memory:///nope.bin", VOCAB, SEQ, seed=0)


def test_truncated_file_is_one_line(url: str) -> None:
    fs = fsspec.filesystem("countmem")
    fs.pipe("/corpus/tokens.bin", np.arange(100, dtype="<u4").tobytes())
    with pytest.raises(DataError, match="truncated, 400 bytes where its sidecar says 4001"):
        FsspecTokens(url, VOCAB, SEQ, seed=0)


def test_file_shrunk_while_training_names_url_and_offset(url: str) -> None:
    source = FsspecTokens(url, VOCAB, SEQ, seed=0)
    fsspec.filesystem("countmem").pipe("/corpus/tokens.bin", b"\0" * 40)
    batches = StepBatches(source, _plan(1, 4, None), 0, first=0, last=5, depth=2)
    with pytest.raises(DataError) as error:
        batches.step(0)
    batches.close()
    message = str(error.value)
    assert "\n" not in message and url in message
    assert "short read at byte" in message or "read failed" in message


def test_token_outside_vocabulary_is_refused(url: str) -> None:
    source = FsspecTokens(url, vocab_size=64, sequence_length=SEQ, seed=0)
    with pytest.raises(DataError, match="outside the vocabulary"):
        source.read([0])
