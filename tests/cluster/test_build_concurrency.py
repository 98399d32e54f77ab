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
    assert set(recorder.started[:2]) == set(names[:2])


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


def test_a_build_of_other_groups_does_not_wait_for_a_group_being_built(
    recorder: _Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster tests wait for the control plane's groups while `.ci/run`'s build goes on
    to Kueue: each group has its own lock, so waiting for some is not waiting for all."""
    last = build.GROUPS[-1].name
    assert last not in build.CLUSTER_GROUPS
    last_building, release_last = threading.Event(), threading.Event()

    def build_group(group: build.Group, root: Path, env: dict[str, str], jobs: int) -> None:
        if group.name == last:
            last_building.set()
            release_last.wait(10)
        recorder(group, root, env, jobs)

    monkeypatch.setattr(build, "_build_group", build_group)
    other = threading.Thread(
        target=lambda: build.build(root=tmp_path, log=lambda _: None, groups=(last,))
    )
    other.start()
    try:
        assert last_building.wait(10)
        results: list[build.GroupResult] = []
        waiting = threading.Thread(
            target=lambda: results.extend(
                build.build(root=tmp_path, log=lambda _: None, groups=build.CLUSTER_GROUPS)
            )
        )
        waiting.start()
        waiting.join(5)
        # done while the other build still holds its group
        assert not waiting.is_alive()
        assert other.is_alive()
        assert [r.group for r in results] == [
            g.name for g in build.GROUPS if g.name in build.CLUSTER_GROUPS
        ]
    finally:
        release_last.set()
        other.join()


def test_a_build_of_a_group_being_built_elsewhere_waits_for_it(
    recorder: _Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiting build takes the group's lock once the other build releases it, and then
    finds the binaries up to date instead of building them again."""
    group = build.CLUSTER_GROUPS[0]
    built = threading.Event()
    monkeypatch.setattr(build, "_up_to_date", lambda g, root: built.is_set())
    holding = threading.Event()

    def build_elsewhere() -> None:
        with build.file_lock(build.group_lock(group, tmp_path)):
            holding.set()
            time.sleep(0.3)
            built.set()

    holder = threading.Thread(target=build_elsewhere)
    holder.start()
    assert holding.wait(10)
    start = time.monotonic()
    (result,) = build.build(root=tmp_path, log=lambda _: None, groups=(group,))
    holder.join()
    assert time.monotonic() - start >= 0.2
    assert not result.built
    assert recorder.started == []


@pytest.mark.parametrize(
    ("group", "niced"),
    [("kubernetes", False), ("fake-gcs-server", False), ("karpenter", True), ("kueue", True)],
)
def test_only_the_groups_the_last_tests_wait_for_build_at_a_lower_priority(
    group: str, niced: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kubernetes is the cluster tests' critical path: what builds beside it yields."""
    commands: list[list[str]] = []

    class StopBuildError(Exception):
        pass

    def run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
        commands.append(args)
        raise StopBuildError

    monkeypatch.setattr(build, "_run", run)
    monkeypatch.setattr(
        build, "_module_info", lambda *args: {"GoMod": str(tmp_path / "go.mod"), "Dir": "."}
    )
    monkeypatch.setattr(build, "render_wrapper", lambda *args: "module wrapper\n")
    (tmp_path / "go.mod").write_text("module m\n")
    (chosen,) = (g for g in build.GROUPS if g.name == group)
    with pytest.raises(StopBuildError):
        build._build_group(chosen, tmp_path, {}, 2)
    (first,) = commands
    prefix = ["nice", "-n", str(build.LATE_GROUP_NICENESS), "go"]
    assert first[: len(prefix)] == prefix if niced else first[0] == "go"
