"""The kubelet's container-log endpoint for the e2e pod runner, so `pods/log` works.

`kubectl logs` and `CoreV1Api.read_namespaced_pod_log` ask the API server, which proxies
`GET /api/v1/namespaces/NS/pods/POD/log?container=C` to the node's kubelet at
`https://<node address>:<status.daemonEndpoints.kubeletEndpoint.Port>/containerLogs/NS/POD/C`.
The operator reads profiling results that way, so the pod runner (podrunner.py, the only
caller) starts one LogServer and points each of its nodes at it.

Why the API server can dial it (checked against kwok v0.8.0 and kube-apiserver v1.36):
- kwokctl starts kube-apiserver without --kubelet-certificate-authority, so the kubelet
  transport skips server-certificate verification (pkg/kubelet/client: no CA -> Insecure):
  a self-signed certificate made at start is enough;
- nor with --kubelet-client-certificate: requests arrive unauthenticated, so the server
  listens on loopback only;
- the address is the first of --kubelet-preferred-address-types (default Hostname,
  InternalDNS, InternalIP, ...) that the node has: runner nodes carry only
  InternalIP 127.0.0.1, since their names do not resolve.

Served from the per-container log files the runner writes (stdout and stderr together,
one file per run, as the kubelet's /var/log/pods/<pod>/<container>/<restart>.log):
tailLines, limitBytes, previous, follow (streams until the container exits) and stream=All
(which the API server adds). timestamps, sinceSeconds, sinceTime and a single stream need
per-line timestamps and stream tags the raw files do not have: they get a 400 that says
so, rather than an answer that silently ignores them.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

log = logging.getLogger(__name__)

_FOLLOW_POLL_S = 0.1
_CHUNK = 64 * 1024
_UNSUPPORTED = ("timestamps", "sinceSeconds", "sinceTime")


class LogRequestError(Exception):
    """A request the endpoint answers with an HTTP error (status and a one-line message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class LogOptions:
    """The query of a /containerLogs request, validated."""

    tail_lines: int | None = None
    limit_bytes: int | None = None
    follow: bool = False
    previous: bool = False


@dataclass(frozen=True)
class LogSource:
    """Where one container run's output is, and whether more may still come."""

    path: Path
    running: Callable[[], bool]


# (namespace, pod, container, previous) -> the run's log, or a LogRequestError (404/400).
Resolver = Callable[[str, str, str, bool], LogSource]


def _flag(query: Mapping[str, list[str]], name: str) -> bool:
    value = (query.get(name) or ["false"])[-1].lower()
    if value not in ("true", "false", "1", "0", ""):
        raise LogRequestError(400, f"{name}: expected true or false, got {value!r}")
    return value in ("true", "1")


def _count(query: Mapping[str, list[str]], name: str) -> int | None:
    if name not in query:
        return None
    raw = query[name][-1]
    try:
        value = int(raw)
    except ValueError:
        raise LogRequestError(400, f"{name}: expected an integer, got {raw!r}") from None
    if value < 0 or (name == "limitBytes" and value == 0):
        raise LogRequestError(400, f"{name}: must be {'>= 1' if name == 'limitBytes' else '>= 0'}")
    return value


def parse_options(query: str) -> LogOptions:
    """The options of a /containerLogs query string; LogRequestError(400) when wrong."""
    values = parse_qs(query, keep_blank_values=True)
    for name in _UNSUPPORTED:
        if name in values and (name != "timestamps" or _flag(values, name)):
            raise LogRequestError(
                400,
                f"{name} is not supported by the sailplan pod runner (its logs carry no "
                "per-line timestamps)",
            )
    stream = (values.get("stream") or ["All"])[-1]
    if stream != "All":
        raise LogRequestError(
            400, f"stream={stream} is not supported: stdout and stderr share one log here"
        )
    return LogOptions(
        tail_lines=_count(values, "tailLines"),
        limit_bytes=_count(values, "limitBytes"),
        follow=_flag(values, "follow"),
        previous=_flag(values, "previous"),
    )


def tail(data: bytes, lines: int | None) -> bytes:
    """The last `lines` lines of `data` (a final line without newline counts as one)."""
    if lines is None:
        return data
    if lines == 0:
        return b""
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    start = end
    for _ in range(lines):
        start = data.rfind(b"\n", 0, start)
        if start < 0:
            return data
    return data[start + 1 :]


def parse_path(path: str) -> tuple[str, str, str]:
    """(namespace, pod, container) of `/containerLogs/NS/POD/C`; LogRequestError(404) else."""
    parts = [unquote(p) for p in urlsplit(path).path.split("/")]
    if len(parts) != 5 or parts[1] != "containerLogs" or not all(parts[2:]):
        raise LogRequestError(404, f"no such endpoint: {urlsplit(path).path}")
    return parts[2], parts[3], parts[4]


def self_signed_certificate(directory: Path, host: str) -> tuple[Path, Path]:
    """A fresh EC key and a one-year self-signed serving certificate for `host` (an IP)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sailplan-podrunner")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "kubelet.crt", directory / "kubelet.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.touch()
    key_path.chmod(0o600)  # before the key is in it
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        try:
            if urlsplit(self.path).path == "/healthz":
                self._reply(200, b"ok")
                return
            namespace, pod, container = parse_path(self.path)
            options = parse_options(urlsplit(self.path).query)
            source = self.server.resolve(namespace, pod, container, options.previous)
        except LogRequestError as error:
            self._reply(error.status, error.message.encode())
            return
        self._stream(source, options)

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, source: LogSource, options: LogOptions) -> None:
        # Whether the container still runs is read BEFORE the file: output written before it
        # exited is then always in what we read, and a follow never stops short of it.
        running = options.follow and source.running()
        data = source.path.read_bytes() if source.path.exists() else b""
        offset = len(data)
        body = tail(data, options.tail_lines)
        budget = options.limit_bytes
        if budget is not None:
            body = body[:budget]
            budget -= len(body)
        if not running:
            self._reply(200, body)
            return
        # Following: no length known; the body ends when the connection closes (HTTP/1.0).
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()
        try:
            self.wfile.write(body)
            self.wfile.flush()
            while budget is None or budget > 0:
                running = source.running()
                with source.path.open("rb") as file:
                    file.seek(offset)
                    more = file.read(_CHUNK if budget is None else min(_CHUNK, budget))
                offset += len(more)
                if more:
                    self.wfile.write(more)
                    self.wfile.flush()
                    budget = None if budget is None else budget - len(more)
                elif not running or self.server.stopping.is_set():
                    return
                else:
                    time.sleep(_FOLLOW_POLL_S)
        except OSError:  # broken pipe, reset, TLS error: the client went away
            return

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("containerLogs: " + format, *args)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, context: ssl.SSLContext, resolve: Resolver) -> None:
        super().__init__((host, 0), _Handler)
        self.context = context
        self.resolve = resolve
        self.stopping = threading.Event()

    def finish_request(self, request: Any, client_address: Any) -> None:
        # TLS in the per-request thread, not in accept(): a slow handshake blocks nobody else.
        request.settimeout(30.0)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as error:
            log.debug("containerLogs: TLS handshake from %s failed: %s", client_address, error)
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()


class LogServer:
    """HTTPS /containerLogs and /healthz on `host` (a free port), in a background thread."""

    def __init__(self, resolve: Resolver, pki_dir: Path, host: str = "127.0.0.1") -> None:
        cert, key = self_signed_certificate(pki_dir, host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server = _Server(host, context, resolve)
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"containerlogs-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, end the follows, release the port."""
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
