"""The pod runner's security decisions, pure: which uid/gid/groups a container runs as, when
runAsNonRoot refuses it, how volumes and the image's directories are owned, and how the
process gets its identity; and the trainer image's filesystem as read from its Dockerfile.

No cluster and no processes. Expected values follow the Kubernetes documentation of the
kubelet (securityContext, fsGroup, runAsNonRoot) and the kubelet's own messages
(pkg/kubelet/kuberuntime/security_context_others.go: verifyRunAsNonRoot).
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from sailplan_dev.localcluster import podrunner_security as security
from sailplan_dev.localcluster.podrunner_image import (
    UNKNOWN_IMAGE,
    DockerfileError,
    Image,
    ImageDir,
    image_from_dockerfile,
    read_image,
    resolve_user,
)
from sailplan_dev.localcluster.podrunner_pod import PodConfigError

TRAINER_DOCKERFILE = Path(__file__).resolve().parents[2] / "trainer_image" / "Dockerfile"

DOCKERFILE = """\
FROM ubuntu:24.04
WORKDIR /opt/app
RUN useradd --create-home --uid 2000 app \\
    && useradd -u 2001 --gid 3000 -d /srv/other other \\
    && mkdir -p /data /cache \\
    && chown app /data \\
    && chown app: /cache \\
    && chmod 0700 /cache
# a comment line between instructions
USER 2000
WORKDIR /work
"""


def _dir(image: Image, path: str) -> ImageDir:
    return next(d for d in image.dirs if d.path == path)


def test_dockerfile_users_dirs_and_owners() -> None:
    image = image_from_dockerfile(DOCKERFILE)
    assert image.user == "2000"
    assert image.workdir == "/work"
    assert {(u.name, u.uid, u.gid, u.home) for u in image.users} == {
        ("root", 0, 0, "/root"),
        ("app", 2000, 2000, "/home/app"),
        ("other", 2001, 3000, "/srv/other"),
    }
    # `chown app` keeps the group; `chown app:` takes app's; chmod applies.
    assert _dir(image, "/data") == ImageDir("/data", 2000, 0, 0o755)
    assert _dir(image, "/cache") == ImageDir("/cache", 2000, 2000, 0o700)
    assert _dir(image, "/home/app").uid == 2000
    # A WORKDIR made before USER is root's, after it the user's (BuildKit).
    assert _dir(image, "/opt/app").uid == 0
    assert _dir(image, "/work").uid == 2000
    assert _dir(image, "/tmp").mode == 0o1777
    assert not any(d.path == "/srv/other" for d in image.dirs)  # no --create-home


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("FROM a AS build\nFROM b\n", "multi-stage"),
        ("FROM a\nRUN useradd app\n", "give the uid"),
        ("FROM a\nRUN mkdir /x && chown nobody /x\n", "unknown user"),
    ],
)
def test_dockerfile_constructs_the_runner_cannot_model_are_refused(text: str, problem: str) -> None:
    with pytest.raises(DockerfileError, match=problem):
        image_from_dockerfile(text)


def test_trainer_image_runs_as_the_owner_of_its_directories() -> None:
    image = read_image(TRAINER_DOCKERFILE)
    uid, gid = resolve_user(image, image.user or "")
    assert (uid, gid) == (10001, 10001)
    assert _dir(image, "/checkpoints").uid == uid
    assert _dir(image, "/home/sailplan").uid == uid
    assert image.workdir == "/home/sailplan"


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("", (0, 0)),
        ("2000", (2000, 2000)),
        ("app", (2000, 2000)),
        ("2000:50", (2000, 50)),
        ("4242", (4242, 0)),  # no passwd entry: group 0, as containerd does
        ("ghost", (None, None)),
    ],
)
def test_resolve_user(user: str, expected: tuple[int | None, int | None]) -> None:
    assert resolve_user(image_from_dockerfile(DOCKERFILE), user) == expected


# ---- identity and runAsNonRoot ---------------------------------------------------------------

APP_IMAGE = image_from_dockerfile(DOCKERFILE)


def _pod(
    pod_context: dict[str, Any] | None = None, container_context: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    container: dict[str, Any] = {"name": "main", "image": "app:1"}
    if container_context is not None:
        container["securityContext"] = container_context
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
        "spec": {"securityContext": pod_context or {}, "containers": [container]},
    }
    return pod, container


def test_identity_container_overrides_pod_overrides_image() -> None:
    pod, container = _pod({"runAsUser": 3000, "runAsGroup": 3001}, {"runAsUser": 3100})
    assert security.container_identity(pod, container, APP_IMAGE) == security.Identity(
        uid=3100, gid=3001, groups=(), home="/"
    )
    pod, container = _pod()
    assert security.container_identity(pod, container, APP_IMAGE) == security.Identity(
        uid=2000, gid=2000, groups=(), home="/home/app"
    )


def test_identity_gid_of_a_run_as_user_comes_from_the_image_passwd_or_is_0() -> None:
    pod, container = _pod({"runAsUser": 2001})
    assert security.container_identity(pod, container, APP_IMAGE).gid == 3000
    pod, container = _pod({"runAsUser": 4242})
    assert security.container_identity(pod, container, APP_IMAGE).gid == 0


def test_identity_groups_are_fs_group_and_supplemental_groups() -> None:
    pod, container = _pod({"runAsUser": 2000, "fsGroup": 5000, "supplementalGroups": [5001, 2000]})
    identity = security.container_identity(pod, container, APP_IMAGE)
    assert identity.groups == (5000, 5001)  # the primary gid is not repeated


def test_an_image_the_runner_does_not_know_runs_as_root() -> None:
    pod, container = _pod()
    assert security.container_identity(pod, container, UNKNOWN_IMAGE).uid == 0


def test_an_image_user_missing_from_its_passwd_fails_the_container() -> None:
    pod, container = _pod()
    with pytest.raises(PodConfigError, match="unable to find user ghost") as refused:
        security.container_identity(pod, container, Image(user="ghost"))
    assert refused.value.reason == "CreateContainerError"


@pytest.mark.parametrize(
    ("pod_context", "container_context", "image", "message"),
    [
        (
            {"runAsNonRoot": True, "runAsUser": 0},
            None,
            APP_IMAGE,
            "container's runAsUser breaks non-root policy",
        ),
        (
            {"runAsNonRoot": True},
            None,
            Image(user=""),
            "container has runAsNonRoot and image will run as root",
        ),
        (
            None,
            {"runAsNonRoot": True},
            Image(user="app", users=APP_IMAGE.users),
            "container has runAsNonRoot and image has non-numeric user (app), "
            "cannot verify user is non-root",
        ),
        (
            {"runAsNonRoot": True},
            None,
            UNKNOWN_IMAGE,
            "does not know the user of image 'app:1', cannot verify user is non-root",
        ),
    ],
)
def test_run_as_non_root_refusals_name_pod_and_container(
    pod_context: dict[str, Any] | None,
    container_context: dict[str, Any] | None,
    image: Image,
    message: str,
) -> None:
    pod, container = _pod(pod_context, container_context)
    with pytest.raises(PodConfigError) as refused:
        security.container_identity(pod, container, image)
    assert refused.value.reason == "CreateContainerConfigError"
    assert message in refused.value.message
    assert refused.value.message.endswith('(pod: "p_ns(u-1)", container: main)')


@pytest.mark.parametrize(
    ("pod_context", "container_context"),
    [
        ({"runAsNonRoot": True}, None),  # the image's numeric USER 2000
        ({"runAsNonRoot": True, "runAsUser": 0}, {"runAsUser": 1234}),
        ({"runAsNonRoot": True}, {"runAsNonRoot": False, "runAsUser": 0}),
    ],
)
def test_run_as_non_root_admits_non_root_uids(
    pod_context: dict[str, Any], container_context: dict[str, Any] | None
) -> None:
    pod, container = _pod(pod_context, container_context)
    security.container_identity(pod, container, APP_IMAGE)


# ---- volumes and the root filesystem ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "group", "expected"),
    [
        ("emptyDir", None, security.Ownership(0, 0, 0o777)),
        ("emptyDir", 5000, security.Ownership(0, 5000, 0o777 | stat.S_ISGID)),
        ("persistentVolumeClaim", None, security.Ownership(0, 0, 0o755)),
        ("persistentVolumeClaim", 5000, security.Ownership(0, 5000, 0o775 | stat.S_ISGID)),
        ("configMap", 5000, security.Ownership(0, 5000, 0o755)),
        ("hostPath", 5000, None),
    ],
)
def test_volume_root_ownership(
    kind: str, group: int | None, expected: security.Ownership | None
) -> None:
    assert security.volume_root(kind, group) == expected


def test_fs_group_makes_contents_group_writable_and_dirs_setgid() -> None:
    assert security.fs_group_mode(0o644, is_dir=False, read_only=False) == 0o664
    assert security.fs_group_mode(0o700, is_dir=True, read_only=False) == 0o770 | stat.S_ISGID
    assert security.rendered_file_mode(0o600, 5000) == 0o640
    assert security.rendered_file_mode(0o600, None) == 0o600


def test_read_only_root_filesystem_drops_write_bits() -> None:
    assert security.root_filesystem_mode(0o1777, read_only=True) == 0o1555
    assert security.root_filesystem_mode(0o755, read_only=False) == 0o755
    assert security.read_only_root({"securityContext": {"readOnlyRootFilesystem": True}})
    assert not security.read_only_root({})


# ---- how the process gets its identity -----------------------------------------------------------

APP = security.Identity(uid=2000, gid=2000, groups=(5000,))
DIRECTORY = stat.S_IFDIR


def _stats(table: dict[str, tuple[int, int, int]]) -> Any:
    return lambda path: table.get(path, (0, 0, DIRECTORY | 0o755))


def test_blocked_directory_finds_the_first_unsearchable_ancestor() -> None:
    table = {
        "/root": (0, 0, DIRECTORY | 0o700),
        "/srv/team": (0, 5000, DIRECTORY | 0o750),  # searchable through fsGroup 5000
        "/srv/own": (2000, 0, DIRECTORY | 0o700),  # the owner's
    }
    assert security.blocked_directory(["/srv/team/x", "/srv/own/y"], APP, _stats(table)) is None
    blocked = security.blocked_directory(["/srv/team", "/root/.pyenv/bin"], APP, _stats(table))
    assert blocked == "/root"
    root = security.Identity(uid=0, gid=0)
    assert security.blocked_directory(["/root/.pyenv"], root, _stats(table)) is None


@pytest.mark.parametrize(
    ("runner_uid", "identity", "blocked", "setpriv", "mode"),
    [
        (0, APP, None, "/usr/bin/setpriv", security.LaunchMode.SET_IDS),
        (0, APP, "/root", "/usr/bin/setpriv", security.LaunchMode.SET_IDS_READ_ALL),
        (0, APP, "/root", None, security.LaunchMode.AS_RUNNER),
        (0, security.Identity(0, 0), None, None, security.LaunchMode.AS_RUNNER),
        (1000, APP, None, "/usr/bin/setpriv", security.LaunchMode.AS_RUNNER),
    ],
)
def test_launch_mode(
    runner_uid: int,
    identity: security.Identity,
    blocked: str | None,
    setpriv: str | None,
    mode: security.LaunchMode,
) -> None:
    assert security.launch_mode(runner_uid, identity, blocked, setpriv) is mode


def test_setpriv_keeps_only_the_read_search_capability() -> None:
    argv = security.setpriv_argv("setpriv", APP, ["python", "-c", "1"])
    assert argv[:4] == ["setpriv", "--reuid=2000", "--regid=2000", "--groups=5000"]
    assert "--bounding-set=-all,+dac_read_search" in argv
    assert argv[-4:] == ["--", "python", "-c", "1"]
