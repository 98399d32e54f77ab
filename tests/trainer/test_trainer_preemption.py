"""Preemption and planned stops leave only complete checkpoints that resume.

SIGTERM reaches one rank mid-step (a spot VM's preemption notice); the all-reduced stop
flag makes every rank stop after the same step, save, and exit 0. A SIGKILL of every rank
at an arbitrary moment (a VM gone without notice) may leave a half-written directory, which
must never be taken for a checkpoint. An operator request through the downward-API
annotations file stops the job the same way as SIGTERM.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from trainer_harness import TINY, finish, make_plan, start_workers, wait_for_step

from sailplan.planner.workerenv import CHECKPOINT_REQUEST_ANNOTATION, TrainerConfig
from sailplan.trainer.checkpoint import MARKER, CheckpointStore
from sailplan.trainer.model import StageModel

pytestmark = [
    pytest.mark.trainer,
    # reading a checkpoint back in the test process, without a process group, is intended
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

PLAN = make_plan(
    TINY, [(0, 3, 1), (3, 6, 1)], data_parallel=1, micro_batch_size=2, global_batch_size=8
)


def _config(directory: Path) -> TrainerConfig:
    return TrainerConfig(
        steps=100_000,
        learning_rate=1e-3,
        checkpoint_dir=str(directory),
        checkpoint_interval_steps=3,
        checkpoints_to_keep=2,
    )


def _assert_loadable(path: Path) -> None:
    """Every logical parameter and Adam moment of the model reads back in full."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    whole = StageModel(TINY, 0, TINY.num_layers)
    expected = {
        f"layers.{i}.{n}" for i, layer in whole.named_layers() for n, _ in layer.named_parameters()
    }
    moments = {f"optim.{m}.{k}" for k in expected for m in ("exp_avg", "exp_avg_sq")}
    assert set(metadata) == expected | moments
    state = {key: torch.full(tuple(meta.size), float("nan")) for key, meta in metadata.items()}  # type: ignore[union-attr]
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), no_dist=True)
    assert all(not tensor.isnan().any() for tensor in state.values())


def test_sigterm_to_one_worker_stops_every_rank_with_a_complete_checkpoint(
    tmp_path: Path,
) -> None:
    # the second stage is a TP-2 worker: its pod's main process is the launcher, which must
    # forward SIGTERM to both of its ranks
    plan = make_plan(
        TINY, [(0, 3, 1), (3, 6, 2)], data_parallel=1, micro_batch_size=2, global_batch_size=8
    )
    processes = start_workers(plan, _config(tmp_path / "ckpt"), tmp_path)
    wait_for_step(processes[0], 4)
    processes[1].terminate()  # SIGTERM to the last stage's pod only, while the job is mid-step
    run = finish(processes, timeout_s=120)
    assert run.returncodes == [0, 0]
    stopped = run.event("stopped")
    assert stopped["reason"] == "peer-requested"  # rank 0 stopped because its peer was told to
    last_step = max(run.losses) if run.losses else 4
    assert stopped["last_checkpoint_step"] >= last_step
    latest = CheckpointStore(str(tmp_path / "ckpt")).latest()
    assert latest is not None and latest.step == stopped["last_checkpoint_step"]
    _assert_loadable(Path(latest.path))


def test_sigkill_never_leaves_a_checkpoint_that_is_picked_up_half_written(tmp_path: Path) -> None:
    config = _config(tmp_path / "ckpt").model_copy(update={"checkpoint_interval_steps": 1})
    processes = start_workers(PLAN, config, tmp_path)
    wait_for_step(processes[0], 3)
    time.sleep(0.05)
    for process in processes:
        process.kill()
    finish(processes)
    store = CheckpointStore(str(tmp_path / "ckpt"))
    complete = store.complete()
    assert complete, "a checkpoint every step: at least step 1 or 2 completed before step 3 ended"
    for info in complete:
        _assert_loadable(Path(info.path))
    latest = store.latest()
    assert latest is not None and (Path(latest.path) / MARKER).exists()


def test_operator_checkpoint_request_stops_the_job(tmp_path: Path) -> None:
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    processes = start_workers(
        PLAN, _config(tmp_path / "ckpt"), tmp_path, generation=5, podinfo_dir=podinfo
    )
    wait_for_step(processes[0], 2)
    (podinfo / "annotations").write_text(f'{CHECKPOINT_REQUEST_ANNOTATION}="5"\n')
    run = finish(processes, timeout_s=120)
    assert run.returncodes == [0, 0]
    stopped = run.event("stopped")
    assert stopped["reason"] == "checkpoint-request"
    latest = CheckpointStore(str(tmp_path / "ckpt")).latest()
    assert latest is not None
    assert latest.step == stopped["last_checkpoint_step"]
    assert latest.marker["plan_generation"] == 5
