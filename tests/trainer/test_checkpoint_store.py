"""Completeness and pruning rules of the checkpoint directory, on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from sailplan.trainer.checkpoint import CheckpointStore, step_dirname


def _write(root: Path, step: int, complete: bool, store: CheckpointStore) -> None:
    directory = root / step_dirname(step)
    directory.mkdir(parents=True)
    (directory / "__0_0.distcp").write_bytes(b"data")
    if complete:
        store.mark_complete(step, {"step": step})


def test_latest_ignores_directories_without_the_marker(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    assert store.latest() is None
    _write(tmp_path, 10, True, store)
    _write(tmp_path, 20, False, store)  # a save cut short
    latest = store.latest()
    assert latest is not None and latest.step == 10 and latest.marker == {"step": 10}


def test_prune_keeps_the_newest_complete_and_a_newer_save_in_progress(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    for step, complete in [(1, True), (2, False), (3, True), (4, True), (5, False)]:
        _write(tmp_path, step, complete, store)
    assert store.prune(keep=2) == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [step_dirname(s) for s in (3, 4, 5)]
    assert [info.step for info in store.complete()] == [3, 4]


def test_an_fsspec_url_root_follows_the_same_rules() -> None:
    # object storage is reached through fsspec; its in-memory filesystem stands in for a bucket
    store = CheckpointStore("memory://sailplan-test/ckpt")
    for step, complete in [(1, True), (2, True), (3, False)]:
        with store.fs.open(f"{store.fs_root}/{step_dirname(step)}/__0_0.distcp", "wb") as f:
            f.write(b"data")
        if complete:
            store.mark_complete(step, {"step": step})
    latest = store.latest()
    assert latest is not None and latest.step == 2
    assert latest.path == "memory://sailplan-test/ckpt/step-000000002"
    assert store.prune(keep=1) == [1]
    assert type(store.writer(2)).__name__ == "FsspecWriter"


def test_a_prune_killed_partway_leaves_no_complete_checkpoint_without_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer killed while pruning: a recursive removal that got as far as the data but
    not the marker must not leave a checkpoint still marked complete (a restart could pick
    it up with its files gone, as a SIGKILL during pruning once left step 1)."""
    store = CheckpointStore(str(tmp_path))
    for step in (1, 2, 3):
        _write(tmp_path, step, True, store)

    class KilledError(Exception):
        pass

    real_rm = store.fs.rm

    def killed_after_the_data(path: str, recursive: bool = False) -> None:
        if not recursive:
            real_rm(path)
            return
        for data in Path(path).glob("*.distcp"):
            data.unlink()
        raise KilledError

    monkeypatch.setattr(store.fs, "rm", killed_after_the_data)
    with pytest.raises(KilledError):
        store.prune(keep=2)
    for info in store.complete():
        assert (Path(info.path) / "__0_0.distcp").exists(), info.step
    assert [info.step for info in store.complete()] == [2, 3]
