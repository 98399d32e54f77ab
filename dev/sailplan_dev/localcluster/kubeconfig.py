"""Kubeconfig helpers: the shell line users eval, and API clients bound to one kubeconfig file.

Each client gets its own Configuration (never the kubernetes package's global default), so
tests can talk to two clusters in one process. Used by LocalCluster, the pytest fixtures and
`sailplan cluster env`.
"""

from __future__ import annotations

import shlex
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from kubernetes import client, config
from urllib3.exceptions import HTTPError as Urllib3Error


def export_line(path: Path) -> str:
    """`export KUBECONFIG=...`, quoted for the shell, for `eval "$(sailplan cluster env)"`."""
    return f"export KUBECONFIG={shlex.quote(str(path))}"


def api_client(path: Path) -> Any:
    """A kubernetes.client.ApiClient for the kubeconfig's current context."""
    # The kubernetes package ships partial annotations; this function has none.
    return config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]


def server(path: Path) -> str:
    """The API server URL of the kubeconfig's current context."""
    doc = yaml.safe_load(Path(path).read_text())
    context_name = doc.get("current-context")
    context = next(c["context"] for c in doc["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
    return str(cluster["server"])


def is_ready(api: Any, timeout_s: float = 5.0) -> bool:
    """The API server answers /readyz with ok (etcd reachable, post-start hooks done)."""
    method, url, headers, _body, _post = api.param_serialize(
        "GET", "/readyz", auth_settings=["BearerToken"]
    )
    try:
        response = api.call_api(method, url, header_params=headers, _request_timeout=timeout_s)
        body = response.read()
    except (client.ApiException, Urllib3Error, OSError):
        return False
    if response.status != 200:
        return False
    return bytes(body).strip() == b"ok"


def accepts_connections(path: Path, timeout_s: float = 1.0) -> bool:
    """Something listens on the API server's port (a refused connection means it is dead,
    not merely slow)."""
    url = urlsplit(server(path))
    try:
        with socket.create_connection((url.hostname or "127.0.0.1", url.port or 443), timeout_s):
            return True
    except OSError:
        return False
