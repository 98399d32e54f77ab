"""Turn what a person types (`--pool` flags, a cluster YAML, a model YAML) into planner inputs.

The CLI (planner/cli.py) calls these; they are separate so the parsing rules can be tested
without a terminal. Every user mistake becomes an `InputError` whose message is one line
naming what was wrong and what would be accepted; the CLI prints it and exits 2.

Cluster YAML format (the same fields as `ClusterSnapshot`; GPU types may be catalog aliases,
`region` and `usd_per_gpu_hour` are optional)::

    pools:
      - name: a100-central
        gpu_type: A100-40
        zone: us-central1-a
        gpus_per_node: 8
        nodes: 4
        spot: false
    egress_usd_per_gb:          # optional: zone -> zone -> USD/GB, else catalog prices
      us-central1-a: {us-central1-b: 0.01}

See benchmarks/clusters/two-zones-a100-v100.yaml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sailplan.planner.catalog import Catalog, CatalogError
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.modelspec import ModelSpec

# The VM shape most clouds sell for training GPUs; used when the count allows it.
_PREFERRED_GPUS_PER_NODE = 8


class InputError(ValueError):
    """A user mistake in flags or files; the message is the one line the user sees."""


def _one_line(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "document"
    return f"{where}: {first['msg']}"


def default_gpus_per_node(catalog: Catalog, gpu_type: str, count: int) -> int:
    """GPUs per node for `count` GPUs of a type when the user did not say.

    The catalog lists the node shapes a type is sold in; take the largest shape up to 8 that
    divides the count (8-GPU VMs are the usual training shape), else the largest that
    divides it, else 1.
    """
    shapes = sorted(catalog.gpu(gpu_type).gpus_per_node)
    dividing = [s for s in shapes if count % s == 0]
    preferred = [s for s in dividing if s <= _PREFERRED_GPUS_PER_NODE]
    if preferred:
        return preferred[-1]
    return dividing[-1] if dividing else 1


def parse_pool_flag(text: str, catalog: Catalog, gpus_per_node: int | None) -> Pool:
    """`GPU:ZONE:COUNT[:spot]` -> Pool; COUNT is GPUs (a whole number of nodes)."""
    parts = text.split(":")
    if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3].lower() != "spot"):
        raise InputError(f"--pool {text!r}: expected GPU:ZONE:COUNT or GPU:ZONE:COUNT:spot")
    gpu_name, zone, count_text = parts[0], parts[1], parts[2]
    spot = len(parts) == 4
    if not zone:
        raise InputError(f"--pool {text!r}: the zone is empty")
    try:
        count = int(count_text)
    except ValueError:
        raise InputError(f"--pool {text!r}: COUNT {count_text!r} is not a whole number") from None
    if count <= 0:
        raise InputError(f"--pool {text!r}: COUNT must be at least 1")
    try:
        gpu_type = catalog.resolve_gpu(gpu_name)
    except CatalogError as error:
        raise InputError(str(error)) from None
    per_node = gpus_per_node or default_gpus_per_node(catalog, gpu_type, count)
    if count % per_node:
        raise InputError(
            f"--pool {text!r}: {count} GPUs is not a whole number of {per_node}-GPU nodes"
        )
    name = f"{gpu_type.lower()}-{zone}" + ("-spot" if spot else "")
    return Pool(
        name=name,
        gpu_type=gpu_type,
        zone=zone,
        gpus_per_node=per_node,
        nodes=count // per_node,
        spot=spot,
    )


def cluster_from_flags(
    pools: list[str], catalog: Catalog, gpus_per_node: int | None = None
) -> ClusterSnapshot:
    parsed = [parse_pool_flag(p, catalog, gpus_per_node) for p in pools]
    merged: dict[str, Pool] = {}
    for pool in parsed:
        # Repeating GPU:ZONE adds capacity rather than failing on a duplicate name.
        if pool.name in merged:
            old = merged[pool.name]
            if old.gpus_per_node != pool.gpus_per_node:
                raise InputError(
                    f"--pool {pool.gpu_type}:{pool.zone} is given twice with different node sizes"
                )
            pool = old.model_copy(update={"nodes": old.nodes + pool.nodes})
        merged[pool.name] = pool
    return ClusterSnapshot(pools=tuple(merged.values()))


def _read_yaml(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as error:
        raise InputError(f"cannot read {what} {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise InputError(f"{what} {path} is not valid YAML: {str(error).splitlines()[0]}") from None


def cluster_from_file(path: Path, catalog: Catalog) -> ClusterSnapshot:
    raw = _read_yaml(path, "cluster file")
    if not isinstance(raw, dict) or not isinstance(raw.get("pools"), list):
        raise InputError(f"cluster file {path}: expected a mapping with a `pools` list")
    pools = []
    for entry in raw["pools"]:
        if isinstance(entry, dict) and "gpu_type" in entry:
            try:
                entry = {**entry, "gpu_type": catalog.resolve_gpu(str(entry["gpu_type"]))}
            except CatalogError as error:
                raise InputError(f"cluster file {path}: {error}") from None
        pools.append(entry)
    try:
        return ClusterSnapshot.model_validate({**raw, "pools": pools})
    except ValidationError as error:
        raise InputError(f"cluster file {path}: {_one_line(error)}") from None


def model_from_file(path: Path) -> ModelSpec:
    raw = _read_yaml(path, "model file")
    if not isinstance(raw, dict):
        raise InputError(f"model file {path}: expected a mapping of ModelSpec fields")
    try:
        return ModelSpec.model_validate(raw)
    except ValidationError as error:
        raise InputError(f"model file {path}: {_one_line(error)}") from None
