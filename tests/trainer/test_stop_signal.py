"""The operator's checkpoint request, as the downward API writes it into the annotations file."""

from __future__ import annotations

from pathlib import Path

from sailplan.planner.workerenv import CHECKPOINT_REQUEST_ANNOTATION
from sailplan.trainer.stopping import StopSignal, read_annotations


def test_annotations_file_is_parsed_with_escaped_values(tmp_path: Path) -> None:
    path = tmp_path / "annotations"
    path.write_text(
        'kubernetes.io/config.seen="2026-01-01T00:00:00Z"\n'
        'sailplan.dev/progress="{\\"step\\": 3}"\n'
        f'{CHECKPOINT_REQUEST_ANNOTATION}="4"\n'
    )
    annotations = read_annotations(path)
    assert annotations["sailplan.dev/progress"] == '{"step": 3}'
    assert annotations[CHECKPOINT_REQUEST_ANNOTATION] == "4"


def test_a_request_for_this_generation_stops_and_an_older_one_does_not(tmp_path: Path) -> None:
    (tmp_path / "annotations").write_text(f'{CHECKPOINT_REQUEST_ANNOTATION}="3"\n')
    assert not StopSignal(str(tmp_path), generation=4).requested()
    stop = StopSignal(str(tmp_path), generation=3)
    assert stop.requested()
    assert stop.reason == "checkpoint-request"
    assert not StopSignal(str(tmp_path / "missing"), generation=0).requested()
