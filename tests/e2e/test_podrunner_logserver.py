"""The pod runner's /containerLogs endpoint on its own: request parsing and a real HTTPS server.

No cluster: the resolver is a dict of files. What kube-apiserver does with the endpoint is
tested in test_podrunner_logs.py; here, the kubelet API's semantics the endpoint promises
(tailLines then limitBytes, 404 for an unknown path, 400 for what it cannot honour) and
that close() releases the port.
"""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sailplan_dev.localcluster import podrunner_logs as logs


@pytest.mark.parametrize(
    ("data", "lines", "expected"),
    [
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc\n", 5, b"a\nb\nc\n"),
        (b"a\nb\nc", 1, b"c"),  # an unfinished last line counts as a line
        (b"a\nb\n", 0, b""),
        (b"", 3, b""),
        (b"a\nb\n", None, b"a\nb\n"),
    ],
)
def test_tail_counts_lines_from_the_end(data: bytes, lines: int | None, expected: bytes) -> None:
    assert logs.tail(data, lines) == expected


def test_parse_options_accepts_what_the_api_server_sends() -> None:
    # kube-apiserver (PodLogsQuerySplitStreams) always adds stream=All.
    options = logs.parse_options("tailLines=3&limitBytes=10&follow=true&stream=All")
    assert options == logs.LogOptions(tail_lines=3, limit_bytes=10, follow=True)
    assert logs.parse_options("previous=true&timestamps=false").previous


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("timestamps=true", "timestamps is not supported"),
        ("sinceSeconds=10", "sinceSeconds is not supported"),
        ("sinceTime=2026-01-01T00:00:00Z", "sinceTime is not supported"),
        ("stream=Stderr", "stream=Stderr is not supported"),
        ("tailLines=x", "tailLines: expected an integer"),
        ("limitBytes=0", "limitBytes: must be >= 1"),
        ("follow=maybe", "follow: expected true or false"),
    ],
)
def test_parse_options_refuses_what_it_cannot_honour(query: str, says: str) -> None:
    with pytest.raises(logs.LogRequestError) as error:
        logs.parse_options(query)
    assert error.value.status == 400
    assert says in error.value.message


def test_parse_path_names_namespace_pod_and_container() -> None:
    assert logs.parse_path("/containerLogs/ns/pod-0/main?tailLines=1") == ("ns", "pod-0", "main")
    for wrong in ("/containerLogs/ns/pod", "/logs/ns/pod/c", "/containerLogs/ns//c"):
        with pytest.raises(logs.LogRequestError) as error:
            logs.parse_path(wrong)
        assert error.value.status == 404


def _get(port: int, path: str) -> tuple[int, bytes]:
    # What kube-apiserver does without --kubelet-certificate-authority: no verification.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}{path}", context=context, timeout=10
        ) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_server_answers_over_tls_and_releases_its_port_on_close(tmp_path: Path) -> None:
    log_file = tmp_path / "main.log"
    log_file.write_bytes(b"one\ntwo\nthree\n")

    def resolve(namespace: str, pod: str, container: str, previous: bool) -> logs.LogSource:
        if (namespace, pod, container) != ("ns", "p", "main"):
            raise logs.LogRequestError(404, f'container "{container}" not found in pod "{pod}"')
        return logs.LogSource(log_file, lambda: False)

    server = logs.LogServer(resolve, tmp_path / "pki")
    port = server.port
    try:
        assert _get(port, "/containerLogs/ns/p/main?tailLines=2&limitBytes=5") == (200, b"two\nt")
        assert _get(port, "/containerLogs/ns/p/other") == (
            404,
            b'container "other" not found in pod "p"',
        )
        assert _get(port, "/healthz") == (200, b"ok")
        assert _get(port, "/metrics")[0] == 404
    finally:
        server.close()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # nobody listens any more
