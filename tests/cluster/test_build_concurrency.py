"""The local cluster build runs CONCURRENT_GROUPS Go builds at once, in GROUPS order.

Why: on a machine without the binaries the build is on CI's critical path (the cluster tests
wait for it), and one group alone leaves cores idle (downloads, `go mod tidy`, a serial link).
The Go toolchain is replaced by a recorder here; the real build runs in `.ci/run`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sailplan_dev.localcluster import build


class _Recorder:
    """Stands in for _build_group: notes which groups run at once."""

    def __init__(self, fail: str | None = None) -> None:
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.most_at_once = 0
        self.started: list[str] = []
        self.fail = fail

    def __call__(self, group: build.Group, root: Path, env: dict[str, str], jobs: int) -> None:
        with self.lock:
            self.running.add(group.name)
            self.started.append(group.name)
            self.most_at_once = max(self.most_at_once, len(self.running))
        try:
            time.sleep(0.05)
            if group.name == self.fail:
                raise build.BuildError(f"{group.name} failed")
        finally:
            with self.lock:
                self.running.discard(group.name)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    record = _Recorder()
    monkeypatch.setattr(build, "go_available", lambda: True)
    monkeypatch.setattr(build, "go_env", lambda root: {})
    monkeypatch.setattr(build, "_up_to_date", lambda group, root: False)
    monkeypatch.setattr(build, "verify", lambda binary, root: True)
    monkeypatch.setattr(build, "_build_group", record)
    return record


def test_groups_build_two_at_a_time_and_report_in_groups_order(
    recorder: _Recorder, tmp_path: Path
) -> None:
    results = build.build(root=tmp_path, log=lambda _: None)
    names = [group.name for group in build.GROUPS]
    assert [result.group for result in results] == names
    assert all(result.built for result in results)
    assert recorder.most_at_once == build.CONCURRENT_GROUPS == 2
    # Taken in order: the trainer's gs:// tests wait for the first group only.
    assert recorder.started[:2] == names[:2]


def test_a_failed_group_stops_the_groups_not_yet_started(
    recorder: _Recorder, tmp_path: Path
) -> None:
    names = [group.name for group in build.GROUPS]
    recorder.fail = names[1]
    with pytest.raises(build.BuildError, match=f"{names[1]} failed"):
        build.build(root=tmp_path, log=lambda _: None)
    # Each lane may take one more group before the failure is seen; none after that.
    assert len(recorder.started) <= 2 * build.CONCURRENT_GROUPS < len(names)
    assert names[-1] not in recorder.started
