"""Token files (and checkpoints) at gs:// URLs, through gcsfs, on a GCS emulator on loopback.

Why: the memory:// and local-file tests (test_trainer_data_fsspec.py) never run gcsfs, the
library a pod reads a bucket with: its ranged HTTP downloads, its metadata calls, its
configuration from the environment. fake-gcs-server (sailplan_dev.gcs_emulator, built from
its Go module) serves the GCS JSON API; the tests skip, saying why, only when it can be
neither built nor started.

The corpus's token at position p is p itself (uint32), so a row's first token names the
offset it came from independently of the code under test; every gs:// read is compared with
the same read of a local copy of the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import torch
from gcsfs.core import GCSFileSystem
from gcsfs.retry import HttpError
from trainer_harness import TINY, make_plan, run_plan

from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.workerenv import DataConfig, TrainerConfig
from sailplan.trainer.data import StepBatches, replica_samples
from sailplan.trainer.tokenfile import DataError, FsspecTokens
from sailplan_dev import gcs_emulator

SEQ = 8
TOKENS = 4001  # 500 windows of 9 tokens with stride 8
VOCAB = 1 << 20  # uint32 tokens, and every position value is a valid token
BUCKET = "sailplan-data"
CORPUS = f"{BUCKET}/corpus/tokens.bin"
GLOBAL_BATCH = 12

Reads = list[tuple[str, int | None, int | None]]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[gcs_emulator.GcsEmulator]:
    with ExitStack() as stack:
        log = tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log"
        try:
            emu = stack.enter_context(gcs_emulator.running(log))
        except gcs_emulator.EmulatorUnavailableError as error:
            pytest.skip(f"no GCS emulator: {error}")
        yield emu


@pytest.fixture(scope="module")
def local_corpus(
    emulator: gcs_emulator.GcsEmulator, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The corpus uploaded to the emulator's bucket (through gcsfs) and written locally."""
    tokens = np.arange(TOKENS, dtype="<u4").tobytes()
    sidecar = b'{"dtype": "uint32", "tokens": %d}' % TOKENS
    fs = emulator.filesystem()
    _create_bucket(fs, BUCKET)
    fs.pipe({CORPUS: tokens, f"{CORPUS}.json": sidecar})
    local = tmp_path_factory.mktemp("corpus") / "tokens.bin"
    local.write_bytes(tokens)
    local.with_name("tokens.bin.json").write_bytes(sidecar)
    return local


def _create_bucket(fs: GCSFileSystem, bucket: str) -> None:
    """The emulator is this module's own, so a 409 (bucket exists) answers a create sent
    twice: gcsfs resends a request that failed in transit (a reset connection, a 5xx), and
    one the emulator had carried out comes back 409. Seen once, on a 2-core CI machine under
    a load of 10; that bucket is ours."""
    try:
        fs.mkdir(bucket)
    except HttpError as error:
        if error.code != 409 or not fs.exists(bucket):
            raise


@pytest.fixture
def gcs_reads(
    emulator: gcs_emulator.GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Reads]:
    """gs:// in this process resolves to gcsfs's JSON-API class on the emulator (what
    GcsEmulator.env does for a new process), and every object read is recorded."""
    monkeypatch.setitem(fsspec.config.conf, "gcs", emulator.storage_options())
    previous = {p: fsspec.get_filesystem_class(p) for p in ("gs", "gcs")}
    for protocol in previous:
        fsspec.register_implementation(protocol, GCSFileSystem, clobber=True)
    reads: Reads = []
    original = GCSFileSystem._cat_file

    async def recording(
        self: GCSFileSystem, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> bytes:
        reads.append((path, start, end))
        data: bytes = await original(self, path, start=start, end=end, **kw)
        return data

    monkeypatch.setattr(GCSFileSystem, "_cat_file", recording)
    yield reads
    for protocol, cls in previous.items():
        fsspec.register_implementation(protocol, cls, clobber=True)


def _plan(dp: int, mbs: int, counts: tuple[int, ...] | None) -> Plan:
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
    return Plan(
        model=spec,
        global_batch_size=GLOBAL_BATCH,
        micro_batch_size=mbs,
        num_micro_batches=max(counts) if counts else GLOBAL_BATCH // (mbs * dp),
        pipeline_micro_batches=counts,
        stages=(Stage(layer_start=0, layer_end=4, tensor_parallel=1, replicas=replicas),),
    )


def _rows(source: FsspecTokens, plan: Plan, replica: int, step: int) -> torch.Tensor:
    """The replica's step as rows of SEQ + 1 tokens, read through the prefetch thread."""
    batches = StepBatches(source, plan, replica, first=step, last=step + 1, depth=2)
    try:
        micro = batches.step(step)
    finally:
        batches.close()
    return torch.cat([torch.cat([inputs, targets[:, -1:]], dim=1) for inputs, targets in micro])


@pytest.mark.parametrize(
    ("dp", "mbs", "counts"), [(1, 4, None), (2, 2, None), (3, 2, None), (3, 1, (2, 4, 6))]
)
def test_each_replica_reads_exactly_its_samples_from_gs(
    local_corpus: Path, gcs_reads: Reads, dp: int, mbs: int, counts: tuple[int, ...] | None
) -> None:
    remote = FsspecTokens(f"gs://{CORPUS}", VOCAB, SEQ, seed=7)
    local = FsspecTokens(str(local_corpus), VOCAB, SEQ, seed=7)
    assert (remote.tokens, remote.dtype) == (TOKENS, np.dtype("<u4"))  # from the sidecar
    plan = _plan(dp, mbs, counts)
    step = 3
    starts: list[int] = []
    for replica in range(dp):
        gcs_reads.clear()
        rows = _rows(remote, plan, replica, step)
        assert torch.equal(rows, _rows(local, plan, replica, step))  # the same bytes
        samples = replica_samples(plan, step, replica)
        assert rows.shape == (len(samples), SEQ + 1)
        # one ranged download per sample of this replica, of exactly its window's bytes
        windows = remote.windows_of(list(samples)).tolist()
        expected = sorted((w * SEQ * 4, (w * SEQ + SEQ + 1) * 4) for w in windows)
        assert sorted((s, e) for p, s, e in gcs_reads if p == CORPUS) == expected  # type: ignore[misc]
        assert all(p == CORPUS for p, _, _ in gcs_reads)
        for row in rows.tolist():  # a window: SEQ + 1 consecutive tokens at a multiple of SEQ
            assert row == list(range(row[0], row[0] + SEQ + 1)) and row[0] % SEQ == 0
        starts += [row[0] for row in rows.tolist()]
    # the replicas together read the global batch, each sample once
    assert len(starts) == len(set(starts)) == GLOBAL_BATCH


def test_missing_object_is_one_line(gcs_reads: Reads) -> None:
    url = f"gs://{BUCKET}-none/nope.bin"
    with pytest.raises(DataError, match=rf"^token file {url}: not found$"):
        FsspecTokens(url, VOCAB, SEQ, seed=0)


@pytest.mark.trainer
def test_training_on_gs_matches_the_local_file(
    emulator: gcs_emulator.GcsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's processes find the bucket from their environment alone (as a pod would)
    and, two replicas on gs://, train to the same losses as one replica on a local copy."""
    tokens = np.random.Generator(np.random.PCG64(5)).integers(
        TINY.vocab_size, size=4000, dtype=np.uint16
    )
    local = tmp_path / "tokens.bin"
    tokens.tofile(local)
    fs = emulator.filesystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    fs.pipe(f"{BUCKET}/tiny/tokens.bin", tokens.tobytes())
    for name, value in emulator.env().items():
        monkeypatch.setenv(name, value)

    def losses(path: str, dp: int, name: str) -> list[float]:
        plan = make_plan(
            TINY, [(0, 6, 1)], data_parallel=dp, micro_batch_size=2, global_batch_size=8
        )
        config = TrainerConfig(
            steps=2,
            learning_rate=1e-3,
            checkpoint_dir=str(tmp_path / name / "ckpt"),
            data=DataConfig(kind="token-file", path=path),
        )
        run = run_plan(plan, config, tmp_path / name)
        return [run.losses[1], run.losses[2]]

    from_gs = losses(f"gs://{BUCKET}/tiny/tokens.bin", 2, "gs-dp2")
    assert from_gs == pytest.approx(losses(str(local), 1, "local-dp1"), rel=1e-5)
    # uniformly random tokens: the loss starts near ln(64), so the file was really read
    assert from_gs[0] == pytest.approx(np.log(TINY.vocab_size), abs=0.1)


@pytest.mark.trainer
def test_checkpoints_on_gs_resume_on_the_uninterrupted_curve(
    emulator: gcs_emulator.GcsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spec.checkpoint.storage.uri gs://...: DCP's fsspec writer saves each step's shards and
    the completeness marker to the bucket, and a restart resumes from the newest one there."""
    fs = emulator.filesystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    for name, value in emulator.env().items():
        monkeypatch.setenv(name, value)
    plan = make_plan(
        TINY, [(0, 3, 1), (3, 6, 1)], data_parallel=1, micro_batch_size=2, global_batch_size=8
    )

    def config(steps: int, checkpoint_dir: str) -> TrainerConfig:
        return TrainerConfig(
            steps=steps,
            learning_rate=1e-3,
            checkpoint_dir=checkpoint_dir,
            checkpoint_interval_steps=2,
        )

    whole = run_plan(plan, config(5, str(tmp_path / "local")), tmp_path / "whole").losses
    url = f"gs://{BUCKET}/ckpt/run"
    run_plan(plan, config(3, url), tmp_path / "first")
    written = sorted(p.rsplit("/", 1)[-1] for p in fs.find(f"{BUCKET}/ckpt/run/step-000000003"))
    assert "sailplan-complete.json" in written and ".metadata" in written
    # DCP's files are __<rank>_<writer thread>.distcp: every rank wrote its shards
    ranks = {int(n.split("_")[2]) for n in written if n.endswith(".distcp")}
    assert ranks == set(range(plan.world_size))
    resumed = run_plan(plan, config(5, url), tmp_path / "second", generation=1)
    assert resumed.event("restored")["path"] == f"{url}/step-000000003"
    assert [resumed.losses[4], resumed.losses[5]] == pytest.approx([whole[4], whole[5]], rel=1e-6)
