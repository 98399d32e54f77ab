"""The operator's pods run as the user the trainer image is built for.

reconcile/children.py gives every worker and profiling pod a uid, gid and fsGroup; the
trainer image (trainer_image/Dockerfile) creates its directories (/checkpoints, the home)
for its USER. If the two drift apart, the trainer cannot write where the image expects,
which only a real cluster would show: this reads the Dockerfile (the pod runner's parser,
which the e2e runner uses to lay out the image's directories) and compares.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.children import (
    RUN_AS_USER,
    container_security_context,
    desired_children,
    pod_security_context,
)
from sailplan.planner.plan import Plan
from sailplan_dev.localcluster.podrunner_image import read_image, resolve_user

DOCKERFILE = Path(__file__).resolve().parents[2] / "trainer_image" / "Dockerfile"


def test_pods_run_as_the_trainer_images_user_and_group() -> None:
    image = read_image(DOCKERFILE)
    uid, gid = resolve_user(image, image.user or "")
    context = pod_security_context()
    assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid) == (RUN_AS_USER, gid)
    assert context["runAsNonRoot"] is True and uid != 0
    # fsGroup: volumes (emptyDir, the checkpoint claim) writable through the user's group.
    assert context["fsGroup"] == gid


def test_the_images_checkpoint_directory_belongs_to_the_pods_user() -> None:
    image = read_image(DOCKERFILE)
    owners = {d.path: d.uid for d in image.dirs}
    assert owners["/checkpoints"] == RUN_AS_USER
    assert container_security_context()["readOnlyRootFilesystem"] is True
    assert container_security_context(read_only_root=False)["readOnlyRootFilesystem"] is False


@pytest.mark.parametrize(
    ("storage", "read_only"),
    [
        ({"uri": "gs://bucket/ckpt"}, True),
        ({"persistentVolumeClaim": {"claimName": "ckpt"}}, True),
        # A path with no volume behind it is the image's own /checkpoints: written into.
        ({"uri": "/checkpoints"}, False),
        ({"uri": "file:///checkpoints/run"}, False),
    ],
)
def test_the_root_filesystem_is_read_only_unless_checkpoints_are_written_into_it(
    make_job: Callable[..., TrainingJob],
    plan: Plan,
    pools: tuple[GPUPool, ...],
    storage: dict[str, Any],
    read_only: bool,
) -> None:
    from operator_builders import JOB_SPEC

    job = make_job(JOB_SPEC | {"checkpoint": {"storage": storage}})
    pod = desired_children(job, plan, 1, 0, {p.name: p for p in pools}).pods[0]
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is read_only
    # Temporary files still have a writable place: an emptyDir at /tmp.
    tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    assert {"name": tmp["name"], "emptyDir": {}} in pod["spec"]["volumes"]
