"""Pod addresses for the pod runner: a loopback IP per pod, forwarded to its process's ports.

Every pod's processes share this machine's network, so two pods cannot both listen on the
trainer's metrics port (9400): the runner gives each process a free port instead (PodRunner's
port_env). So that a client that knows only the Pod object (the operator reading rank 0's
progress at status.podIP and the container's port) reaches the process as it would through
a real pod network, each pod gets its own loopback address (all of 127.0.0.0/8 reaches `lo`
on Linux), reported as its status.podIP, and a `PortForward` listens on
podIP:<the port the pod asked for> and relays each connection to the free port.

Used by podrunner.PodRunner.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading

log = logging.getLogger(__name__)

_CHUNK = 65536


class PodAddresses:
    """Hands out 127.<a>.<b>.<c> addresses, one per pod. The second octet comes from the
    process id so that runners of concurrent test sessions on one machine rarely overlap;
    127.0.0.0/16 (127.0.0.1: the node, the Services) is never handed out."""

    def __init__(self) -> None:
        self._second = 16 + os.getpid() % 224
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            number = next(self._counter) % (254 * 256)
        return f"127.{self._second}.{number // 254}.{number % 254 + 1}"


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class PortForward:
    """Listens on (host, port); each connection is relayed to 127.0.0.1:`target` (which a
    restarted container changes). A refused target closes the client's connection, as a
    pod whose process does not listen (yet) would."""

    def __init__(self, host: str, port: int, target: int) -> None:
        self.address = (host, port)
        self.target = target
        self._server = socket.create_server(self.address)
        self._thread = threading.Thread(
            target=self._accept, name=f"forward {host}:{port}", daemon=True
        )
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._relay, args=(connection,), daemon=True).start()

    def _relay(self, connection: socket.socket) -> None:
        with connection:
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5.0)
            except OSError:
                return
            with upstream:
                upstream.settimeout(None)
                back = threading.Thread(target=_pump, args=(upstream, connection), daemon=True)
                back.start()
                _pump(connection, upstream)
                back.join()

    def close(self) -> None:
        # shutdown wakes the accept() blocked in the thread; close alone may not.
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._thread.join(timeout=5.0)
