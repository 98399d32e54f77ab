"""The directories a container's process sees, made with the owners and modes a kubelet and
an image would give them, so that the kernel grants or refuses its writes.

The pod runner (podrunner.py) calls this when it starts a container: volume directories
(emptyDir, persistentVolumeClaim, the rendered configMap/secret/downwardAPI/projected
files) owned as podrunner_security.volume_root says, fsGroup applied to a claim's contents
on every mount as the kubelet's default fsGroupChangePolicy (Always) does, and a
per-container root directory holding the directories the image creates
(podrunner_image.Image.dirs) with the image's owners, without write bits under
readOnlyRootFilesystem. Ownership changes need root: a runner that is not root passes
chown=False and gets the modes only.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from . import podrunner_security as security
from .podrunner_image import Image
from .podrunner_pod import VolumeFile


def write_atomic(path: Path, content: bytes, mode: int, gid: int | None = None) -> None:
    # Readers (the trainer polling its annotations file) never see a half-written file.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(content)
    if gid is not None:
        os.chown(tmp, -1, gid)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _own(path: Path, ownership: security.Ownership, chown: bool) -> None:
    if chown:
        os.chown(path, ownership.uid, ownership.gid)
    path.chmod(ownership.mode)


def prepare_volume(directory: Path, kind: str, group: int | None, chown: bool) -> None:
    """Create a volume's directory (if new) and give it the kubelet's owner and mode; for a
    claim, apply fsGroup to everything already in it."""
    existed = directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    ownership = security.volume_root(kind, group)
    if ownership is None:
        return
    if kind == "persistentVolumeClaim" and existed:
        if group is not None:
            _apply_fs_group(directory, group, chown)
        return
    _own(directory, ownership, chown)


def _apply_fs_group(directory: Path, group: int, chown: bool) -> None:
    for root, dirs, files in os.walk(directory):
        for name in (".", *dirs, *files):
            path = Path(root) / name if name != "." else Path(root)
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                continue
            if chown:
                os.lchown(path, -1, group)
            path.chmod(security.fs_group_mode(info.st_mode, stat.S_ISDIR(info.st_mode), False))


def write_volume_files(
    directory: Path, files: Iterable[VolumeFile], group: int | None, chown: bool
) -> None:
    for item in files:
        mode = security.rendered_file_mode(item.mode, group)
        write_atomic(directory / item.path, item.content, mode, group if chown else None)


def make_sub_path(volume_dir: Path, sub_path: str, chown: bool) -> Path:
    """A volumeMount's subPath, created like the kubelet does: with the owner and mode of
    the volume's directory, so that fsGroup's rights carry over to it."""
    local = volume_dir / sub_path
    info = volume_dir.stat()
    owner = security.Ownership(info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode))
    missing = [p for p in (local, *local.parents) if p.is_relative_to(volume_dir)]
    missing = [p for p in missing if p != volume_dir and not p.exists()]
    local.mkdir(parents=True, exist_ok=True)
    for path in missing:
        _own(path, owner, chown)
    return local


def make_root_filesystem(root: Path, image: Image, read_only: bool, chown: bool) -> dict[str, str]:
    """The container's view of the image's filesystem under `root` (made afresh: a new
    container gets a new writable layer). Returns each image directory's local path, for
    the runner's path rewriting; "/" itself is `root`."""
    if root.exists():
        _make_writable(root)
        shutil.rmtree(root)
    root.mkdir(parents=True)
    local: dict[str, str] = {}
    for directory in sorted(image.dirs, key=lambda d: d.path.count("/")):
        path = root / directory.path.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        local[directory.path] = str(path)
    # Owners and modes last, deepest first: a read-only parent must not stop its children.
    for directory in sorted(image.dirs, key=lambda d: -d.path.count("/")):
        mode = security.root_filesystem_mode(directory.mode, read_only)
        owner = security.Ownership(directory.uid, directory.gid, mode)
        _own(root / directory.path.lstrip("/"), owner, chown)
    for made in root.rglob("*"):
        # Parents the image does not list (e.g. /var of /var/tmp): root's, 0755.
        if made.is_dir() and str("/" / made.relative_to(root)) not in local:
            made.chmod(security.root_filesystem_mode(0o755, read_only))
    root.chmod(security.root_filesystem_mode(0o755, read_only))
    return local


def _make_writable(root: Path) -> None:
    # A read-only root filesystem of an earlier run: its modes would stop the removal.
    for path in (root, *root.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            path.chmod(stat.S_IMODE(path.stat().st_mode) | stat.S_IWUSR | stat.S_IXUSR)
