"""The kubelet's security decisions for one container, as pure functions the pod runner applies.

A kubelet (with its container runtime) runs each container as a uid and gids taken from the
pod's securityContext or else the image's USER, refuses to start a container whose
`runAsNonRoot` it cannot honour, mounts the image's filesystem read-only under
`readOnlyRootFilesystem`, and gives volumes an owner and mode (emptyDir 0777; with
`fsGroup`, group-owned by it with setgid). The pod runner (podrunner.py) runs containers as
local processes; this module decides what each of those rules means for one container, and
the runner makes the directories and starts the process accordingly, so that a permission
error happens for real, from the kernel. No I/O here: the runner passes in what it stat()s.

How the process gets its identity (launch_mode): a runner running as root starts it as
that uid with subprocess's user/group/extra_groups. When the container's uid cannot reach
this machine's Python or the runner's directories (e.g. /root is 0700 and the venv's
interpreter lives under it), where an image would have them readable, the process also gets
the one capability CAP_DAC_READ_SEARCH (through setpriv): reads and path lookups are then
not checked, writes still are. A runner that is not root cannot change uids: it checks
(runAsNonRoot, read-only root by file modes) and runs the process as itself.
"""

from __future__ import annotations

import enum
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from .podrunner_image import Image, resolve_user
from .podrunner_pod import PodConfigError, meta

# Group and owner bits the kubelet adds to volume contents with fsGroup (SetVolumeOwnership:
# rwMask, roMask, and on directories execMask plus setgid).
FS_GROUP_RW = 0o660
FS_GROUP_RO = 0o440
FS_GROUP_DIR = 0o110 | stat.S_ISGID
WRITE_BITS = 0o222
# A fresh filesystem's root, as a block-backed PersistentVolume (a GCE PD) shows it.
FRESH_FILESYSTEM_MODE = 0o755
EMPTY_DIR_MODE = 0o777
NOBODY = 65534  # a uid and gid of no one: "can anyone reach this?"


@dataclass(frozen=True)
class Identity:
    """Who a container's process is: uid, primary gid, supplementary groups, and HOME."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    home: str = "/"

    def all_groups(self) -> tuple[int, ...]:
        return (self.gid, *self.groups)


@dataclass(frozen=True)
class Ownership:
    uid: int
    gid: int
    mode: int


class LaunchMode(enum.Enum):
    AS_RUNNER = "as-runner"  # the runner's own uid: root, or checks only
    SET_IDS = "set-ids"  # subprocess user/group/extra_groups
    SET_IDS_READ_ALL = "set-ids-read-all"  # setpriv, plus CAP_DAC_READ_SEARCH


def _contexts(
    pod: Mapping[str, Any], container: Mapping[str, Any]
) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    return pod_context, container.get("securityContext") or {}


def _setting(pod: Mapping[str, Any], container: Mapping[str, Any], name: str) -> Any:
    """A field the container's securityContext overrides over the pod's."""
    pod_context, container_context = _contexts(pod, container)
    value = container_context.get(name)
    return pod_context.get(name) if value is None else value


def fs_group(pod: Mapping[str, Any]) -> int | None:
    value = ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
    return None if value is None else int(value)


def read_only_root(container: Mapping[str, Any]) -> bool:
    return bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem"))


def _kubelet_pod_name(pod: Mapping[str, Any]) -> str:
    # format.Pod in the kubelet's messages: name_namespace(uid).
    metadata = meta(pod)
    return f"{metadata.get('name', '')}_{metadata.get('namespace', '')}({metadata.get('uid', '')})"


def _non_root_error(pod: Mapping[str, Any], container: Mapping[str, Any], problem: str) -> str:
    where = f'(pod: "{_kubelet_pod_name(pod)}", container: {container.get("name", "")})'
    return f"{problem} {where}"


def container_identity(
    pod: Mapping[str, Any], container: Mapping[str, Any], image: Image
) -> Identity:
    """The uid/gid/groups the container runs as, or PodConfigError (reason
    CreateContainerConfigError, the kubelet's message) when runAsNonRoot forbids it.

    runAsUser and runAsGroup: the container's, else the pod's, else the image's USER (its
    passwd entry's group, or 0). Supplementary groups: fsGroup and supplementalGroups.
    runAsNonRoot is verified as the kubelet does (verifyRunAsNonRoot): an explicit uid 0
    breaks it, and so does an image user that is root, non-numeric or unknown to the runner.
    """
    run_as_user = _setting(pod, container, "runAsUser")
    run_as_group = _setting(pod, container, "runAsGroup")
    non_root = bool(_setting(pod, container, "runAsNonRoot"))
    image_uid, image_gid = resolve_user(image, image.user or "")
    if non_root:
        problem = ""
        if run_as_user is not None:
            if int(run_as_user) == 0:
                problem = "container's runAsUser breaks non-root policy"
        elif image.user is None:
            problem = (
                f"container has runAsNonRoot and the pod runner does not know the user of image "
                f"{container.get('image', '')!r}, cannot verify user is non-root"
            )
        elif image.user and not image.user.partition(":")[0].isdigit():
            problem = (
                f"container has runAsNonRoot and image has non-numeric user ({image.user}), "
                "cannot verify user is non-root"
            )
        elif image_uid == 0:
            problem = "container has runAsNonRoot and image will run as root"
        if problem:
            raise PodConfigError(
                "CreateContainerConfigError", _non_root_error(pod, container, problem)
            )
    if run_as_user is None and image.user and image_uid is None:
        name = image.user.partition(":")[0]
        raise PodConfigError(  # the OCI runtime's words
            "CreateContainerError",
            f"unable to find user {name}: no matching entries in passwd file",
        )
    uid = int(run_as_user) if run_as_user is not None else (image_uid or 0)
    if run_as_group is not None:
        gid = int(run_as_group)
    elif run_as_user is None and image_gid is not None:
        gid = image_gid
    else:
        entry = image.user_with_uid(uid)
        gid = entry.gid if entry is not None else 0
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    extra = [int(g) for g in pod_context.get("supplementalGroups") or ()]
    group = fs_group(pod)
    if group is not None:
        extra.insert(0, group)
    entry = image.user_with_uid(uid)
    home = entry.home if entry is not None else "/"
    groups = tuple(dict.fromkeys(g for g in extra if g != gid))
    return Identity(uid=uid, gid=gid, groups=groups, home=home)


# ---- volumes -------------------------------------------------------------------------------------


def volume_root(kind: str, group: int | None) -> Ownership | None:
    """Owner and mode of a volume's directory as the kubelet leaves it; None: left as found.

    emptyDir: 0777 (root), fsGroup's group and setgid with fsGroup. persistentVolumeClaim:
    a fresh filesystem's root (root, 0755) that fsGroup makes group-writable with setgid
    (a block-backed volume such as a GCE PD; NFS-like volumes ignore fsGroup). hostPath:
    untouched. The rendered volumes (configMap, secret, downwardAPI, projected): a root-owned
    directory others can read.
    """
    if kind == "emptyDir":
        if group is None:
            return Ownership(0, 0, EMPTY_DIR_MODE)
        return Ownership(0, group, EMPTY_DIR_MODE | FS_GROUP_DIR)
    if kind == "persistentVolumeClaim":
        if group is None:
            return Ownership(0, 0, FRESH_FILESYSTEM_MODE)
        return Ownership(0, group, fs_group_mode(FRESH_FILESYSTEM_MODE, True, False))
    if kind == "hostPath":
        return None
    return Ownership(0, 0 if group is None else group, 0o755)


def fs_group_mode(mode: int, is_dir: bool, read_only: bool) -> int:
    """A file's mode after the kubelet applied fsGroup to it (volume.SetVolumeOwnership)."""
    added = FS_GROUP_RO if read_only else FS_GROUP_RW
    if is_dir:
        added |= FS_GROUP_DIR
    return stat.S_IMODE(mode) | added


def rendered_file_mode(mode: int, group: int | None) -> int:
    """A configMap/secret/downwardAPI/projected file's mode: as the pod says, group-readable
    with fsGroup."""
    return mode if group is None else fs_group_mode(mode, False, True)


def root_filesystem_mode(mode: int, read_only: bool) -> int:
    """An image directory's mode in the container's view; read-only root: no write bits."""
    return mode & ~WRITE_BITS if read_only else mode


# ---- launching -----------------------------------------------------------------------------------


def may_search(identity: Identity, owner_uid: int, owner_gid: int, mode: int) -> bool:
    """Whether the kernel lets `identity` look up names in a directory (its x bit)."""
    if identity.uid == 0:
        return True
    if identity.uid == owner_uid:
        return bool(mode & stat.S_IXUSR)
    if owner_gid in identity.all_groups():
        return bool(mode & stat.S_IXGRP)
    return bool(mode & stat.S_IXOTH)


def blocked_directory(
    paths: Iterable[str], identity: Identity, stat_of: Callable[[str], tuple[int, int, int]]
) -> str | None:
    """The first directory on the way to any of `paths` that `identity` cannot search, or
    None. `stat_of(dir)` gives (uid, gid, mode)."""
    for path in paths:
        parts = PurePosixPath(path)
        for directory in (*reversed(parts.parents), parts):
            uid, gid, mode = stat_of(str(directory))
            if stat.S_ISDIR(mode) and not may_search(identity, uid, gid, mode):
                return str(directory)
    return None


def launch_mode(
    runner_uid: int, identity: Identity, blocked: str | None, setpriv: str | None
) -> LaunchMode:
    """How the runner starts a container's process (see the module doc)."""
    if runner_uid != 0 or (identity.uid == 0 and identity.gid == 0):
        return LaunchMode.AS_RUNNER
    if blocked is None:
        return LaunchMode.SET_IDS
    return LaunchMode.SET_IDS_READ_ALL if setpriv else LaunchMode.AS_RUNNER


def setpriv_argv(setpriv: str, identity: Identity, argv: Iterable[str]) -> list[str]:
    """argv run as `identity` with CAP_DAC_READ_SEARCH as its only capability."""
    groups = identity.groups or (identity.gid,)
    capability = "-all,+dac_read_search"
    return [
        setpriv,
        f"--reuid={identity.uid}",
        f"--regid={identity.gid}",
        f"--groups={','.join(str(g) for g in groups)}",
        f"--inh-caps={capability}",
        f"--ambient-caps={capability}",
        f"--bounding-set={capability}",
        "--",
        *argv,
    ]
