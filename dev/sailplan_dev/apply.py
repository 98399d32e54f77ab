"""Server-side apply of YAML documents, the way `kubectl apply --server-side` does it.

Used by `sailplan demo` (CRDs and examples) and the tests, so neither depends on a kubectl
binary. The dynamic client discovers each kind's endpoint; the field manager name lets a
later `kubectl apply` take over cleanly.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, dynamic

FIELD_MANAGER = "sailplan"


def load_documents(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every non-empty YAML document of the files, in file-name order."""
    documents: list[dict[str, Any]] = []
    for path in sorted(paths):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document:
                documents.append(document)
    return documents


def apply(api_client: client.ApiClient, documents: Iterable[dict[str, Any]]) -> list[str]:
    """Apply each document; returns `kind/name` of each, in order."""
    dyn = dynamic.DynamicClient(api_client)  # type: ignore[no-untyped-call]
    applied = []
    for document in documents:
        resource = dyn.resources.get(api_version=document["apiVersion"], kind=document["kind"])
        metadata = document["metadata"]
        kwargs: dict[str, Any] = {}
        if resource.namespaced:
            kwargs["namespace"] = metadata.get("namespace", "default")
        resource.server_side_apply(
            body=document,
            name=metadata["name"],
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
            **kwargs,
        )
        applied.append(f"{document['kind']}/{metadata['name']}")
    return applied
