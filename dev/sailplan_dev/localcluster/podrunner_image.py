"""What the pod runner knows of a container image: its USER, its users and the directories it
creates with their owners, read from the image's Dockerfile.

The runner cannot pull or unpack images: a container's process runs this machine's Python
and repository. What matters for the permissions a kubelet enforces is the image's
filesystem as the container sees it (who owns /checkpoints, /home/sailplan, /tmp) and the
user it runs as when the pod does not say. `image_from_dockerfile` derives that from the
Dockerfile itself (USER, WORKDIR, and in RUN: useradd, mkdir, chown, chmod), so the runner's
view of the trainer image cannot drift from trainer_image/Dockerfile. Callers: the e2e
harness (tests/e2e/runner_harness.py) builds the trainer image's description and passes it
to PodRunner(images=...); podrunner_security resolves users against it.

Only what these Dockerfiles use is understood; anything else in a RUN line is ignored (it
creates no directory the runner must know), and an unparseable USER or chown raises.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

ROOT_HOME = "/root"


class DockerfileError(ValueError):
    """A Dockerfile construct the runner cannot turn into a filesystem description."""


@dataclass(frozen=True)
class ImageUser:
    """One /etc/passwd entry of the image."""

    name: str
    uid: int
    gid: int
    home: str


@dataclass(frozen=True)
class ImageDir:
    """A directory of the image's filesystem with the owner and mode the image gives it."""

    path: str
    uid: int
    gid: int
    mode: int


# What every Linux base image has: root, and the world-writable temporary directories.
BASE_USERS = (ImageUser("root", 0, 0, ROOT_HOME),)
BASE_DIRS = (ImageDir("/tmp", 0, 0, 0o1777), ImageDir("/var/tmp", 0, 0, 0o1777))


@dataclass(frozen=True)
class Image:
    """An image as its containers see it. `user` is the USER instruction as written
    ("10001", "sailplan", "10001:10001"); "" means none (the image runs as root), None that
    the runner does not know the image."""

    user: str | None = None
    workdir: str = "/"
    users: tuple[ImageUser, ...] = BASE_USERS
    dirs: tuple[ImageDir, ...] = BASE_DIRS

    def user_named(self, name: str) -> ImageUser | None:
        return next((u for u in self.users if u.name == name), None)

    def user_with_uid(self, uid: int) -> ImageUser | None:
        return next((u for u in self.users if u.uid == uid), None)


UNKNOWN_IMAGE = Image()


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, `\\` continuations joined."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")),
    )
    pairs = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, arguments = line.strip().partition(" ")
            pairs.append((instruction.upper(), arguments.strip()))
    return pairs


def _shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a RUN line (split at &&, || and ;)."""
    commands: list[list[str]] = [[]]
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    for token in lexer:
        if token in ("&&", "||", ";"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _option_value(words: list[str], *names: str) -> str | None:
    for index, word in enumerate(words):
        for name in names:
            if word == name and index + 1 < len(words):
                return words[index + 1]
            if name.startswith("--") and word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def _operands(words: list[str], options_with_value: tuple[str, ...] = ()) -> list[str]:
    operands, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in options_with_value:
            skip = True
        elif not word.startswith("-"):
            operands.append(word)
    return operands


class _Build:
    """The filesystem a Dockerfile's instructions build, one instruction at a time."""

    def __init__(self) -> None:
        self.user = ""
        self.workdir = "/"
        self.users = list(BASE_USERS)
        self.dirs = {d.path: d for d in BASE_DIRS}

    def path(self, value: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, value))

    def current_ids(self) -> tuple[int, int]:
        uid, gid = resolve_user(self.image(), self.user)
        return (0 if uid is None else uid), (0 if gid is None else gid)

    def make_dir(self, path: str, uid: int = 0, gid: int = 0, mode: int = 0o755) -> None:
        if path != "/" and path not in self.dirs:
            self.dirs[path] = ImageDir(path, uid, gid, mode)

    def run(self, script: str) -> None:
        for words in _shell_commands(script):
            program, args = posixpath.basename(words[0]), words[1:]
            if program == "useradd":
                self._useradd(args)
            elif program == "mkdir":
                uid, gid = self.current_ids()
                for target in _operands(args, ("-m", "--mode")):
                    self.make_dir(self.path(target), uid, gid)
            elif program == "chown":
                self._chown(args)
            elif program == "chmod":
                operands = _operands(args)
                if operands and re.fullmatch(r"[0-7]{3,4}", operands[0]):
                    for target in operands[1:]:
                        path = self.path(target)
                        if path in self.dirs:
                            self.dirs[path] = replace(self.dirs[path], mode=int(operands[0], 8))

    def _useradd(self, args: list[str]) -> None:
        options = ("-u", "--uid", "-g", "--gid", "-d", "--home-dir", "-s", "--shell")
        operands = _operands(args, options)
        if len(operands) != 1:
            raise DockerfileError(f"useradd {' '.join(args)}: expected one user name")
        name = operands[0]
        uid_text = _option_value(args, "-u", "--uid")
        if uid_text is None:
            raise DockerfileError(f"useradd {name}: give the uid (--uid) so it is known")
        uid = int(uid_text)
        gid = int(_option_value(args, "-g", "--gid") or uid)  # USERGROUPS_ENAB: own group
        home = _option_value(args, "-d", "--home-dir") or f"/home/{name}"
        self.users.append(ImageUser(name, uid, gid, home))
        if "-m" in args or "--create-home" in args:
            self.make_dir("/home", 0, 0, 0o755)
            self.dirs[home] = ImageDir(home, uid, gid, 0o750)

    def _chown(self, args: list[str]) -> None:
        operands = _operands(args)
        if len(operands) < 2:
            raise DockerfileError(f"chown {' '.join(args)}: expected an owner and paths")
        owner, colon, group = operands[0].partition(":")
        uid, login_gid = resolve_user(self.image(), owner)
        # `chown user` keeps the group, `chown user:` takes the user's, `user:group` names it.
        gid = login_gid if colon and not group else None
        if group:
            gid = int(group) if group.isdigit() else resolve_user(self.image(), group)[1]
        if uid is None:
            raise DockerfileError(f"chown {operands[0]}: unknown user")
        for target in operands[1:]:
            path = self.path(target)
            old = self.dirs.get(path, ImageDir(path, 0, 0, 0o755))
            self.dirs[path] = replace(old, uid=uid, gid=old.gid if gid is None else gid)

    def image(self) -> Image:
        return Image(
            user=self.user,
            workdir=self.workdir,
            users=tuple(self.users),
            dirs=tuple(sorted(self.dirs.values(), key=lambda d: d.path)),
        )


def image_from_dockerfile(text: str) -> Image:
    """The final image's USER, WORKDIR, users and directories (a single-stage Dockerfile)."""
    instructions = _instructions(text)
    if sum(1 for instruction, _ in instructions if instruction == "FROM") > 1:
        raise DockerfileError("multi-stage Dockerfiles are not understood")
    build = _Build()
    for instruction, arguments in instructions:
        if instruction == "USER":
            build.user = arguments
        elif instruction == "WORKDIR":
            build.workdir = build.path(arguments)
            # BuildKit creates a missing WORKDIR owned by the current USER.
            uid, gid = build.current_ids()
            build.make_dir(build.workdir, uid, gid)
        elif instruction == "RUN":
            build.run(arguments)
    return build.image()


def read_image(dockerfile: Path) -> Image:
    return image_from_dockerfile(dockerfile.read_text())


def resolve_user(image: Image, user: str) -> tuple[int | None, int | None]:
    """(uid, gid) of a USER value against the image's passwd, None where it is unknown.
    No user means root; a numeric uid without a group takes its passwd entry's group, or 0
    (what containerd does)."""
    if image.user is None and not user:
        return None, None
    name, _, group = user.partition(":")
    if not name:
        return 0, 0
    entry = image.user_with_uid(int(name)) if name.isdigit() else image.user_named(name)
    uid = int(name) if name.isdigit() else (entry.uid if entry else None)
    if group:
        named_group = image.user_named(group)
        gid = int(group) if group.isdigit() else (named_group.gid if named_group else None)
    else:
        gid = entry.gid if entry else (0 if uid is not None else None)
    return uid, gid
