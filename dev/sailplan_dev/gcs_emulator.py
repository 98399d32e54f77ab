"""A local Google Cloud Storage emulator (fake-gcs-server), so `gs://` runs without a cloud.

Why: the trainer reads token files at any fsspec URL, `gs://` through gcsfs, and this machine
and CI reach no cloud. fake-gcs-server serves the GCS JSON API (bucket and object metadata,
ranged media downloads, uploads) over plain HTTP on 127.0.0.1; it is built from its Go
module like the local cluster's binaries (sailplan_dev.localcluster.build, group
"fake-gcs-server"). Called by tests/trainer/test_trainer_data_gcs.py and
benchmarks/trainer_data.py.

A process reaches it through three environment variables (GcsEmulator.env), the same way a
pod would be pointed at another endpoint: STORAGE_EMULATOR_HOST (gcsfs's endpoint),
FSSPEC_GCS_TOKEN=anon (fsspec's per-protocol default: no credentials are looked for, so no
metadata server is asked), and GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false (gcsfs's default
class first asks the gRPC storage-control API for each bucket's layout, which the emulator
does not serve; it retries for a minute, then falls back to the JSON API anyway).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sailplan_dev.localcluster import build

GROUP = "fake-gcs-server"
# The JSON API's bucket list: answers 200 once the server is serving.
_READY_PATH = "/storage/v1/b"


class EmulatorUnavailableError(RuntimeError):
    """The emulator cannot be built or started here; the message is one line saying why."""


@dataclass
class GcsEmulator:
    endpoint: str  # http://127.0.0.1:<port>
    process: subprocess.Popen[bytes]

    def env(self) -> dict[str, str]:
        """What a process's environment needs for fsspec's `gs://` to reach the emulator."""
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            "FSSPEC_GCS_TOKEN": "anon",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }

    def storage_options(self) -> dict[str, Any]:
        """The same as gcsfs keyword arguments (for a filesystem made in this process)."""
        return {"endpoint_url": self.endpoint, "token": "anon"}

    def filesystem(self) -> Any:
        """A gcsfs filesystem on the emulator (the JSON-API class; needs gcsfs installed)."""
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(project="sailplan-dev", **self.storage_options())


def binary() -> Path:
    """The emulator's binary, built from its Go module first if it is missing."""
    (target,) = (b for g in build.GROUPS if g.name == GROUP for b in g.binaries)
    path = build.binary_path(target.name)
    # The pinned release; without Go to check or rebuild it, whatever binary is there.
    if os.access(path, os.X_OK) and (
        not build.go_available() or build.verify(target, build.cache_root())
    ):
        return path
    try:
        build.build(groups=(GROUP,), log=lambda _: None)
    except (build.GoToolchainMissingError, build.BuildError) as error:
        reason = " ".join(str(error).split())[:300]
        raise EmulatorUnavailableError(f"fake-gcs-server cannot be built: {reason}") from None
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def running(log: Path, timeout_s: float = 60) -> Iterator[GcsEmulator]:
    """An emulator holding its objects in memory on a free loopback port; its log goes to
    `log`. Stopped (SIGTERM, then SIGKILL) on exit."""
    path = binary()
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    args = [
        str(path),
        "-scheme=http",
        "-host=127.0.0.1",
        f"-port={port}",
        "-backend=memory",
        f"-public-host=127.0.0.1:{port}",
        f"-external-url={endpoint}",
        "-log-level=warn",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not _serving(endpoint + _READY_PATH):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = " ".join(log.read_text(errors="replace").split()[-40:])
                state = (
                    f"exited {process.returncode}"
                    if process.poll() is not None
                    else f"not serving after {timeout_s:.0f} s"
                )
                raise EmulatorUnavailableError(f"fake-gcs-server {state}: {tail}")
            time.sleep(0.1)
        yield GcsEmulator(endpoint, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
