"""Reading and writing profiles as files: the edge between profile data and the pure planner.

A profile directory holds one JSON or YAML document per profile (ComputeProfile,
NetworkProfile or PowerProfile, told apart by `kind`), or documents with a list of them, or
a whole ProfileSet (`{"compute": [...], "network": [...], "power": [...]}`), in any
sub-folder layout. write_profile() lays them out by key (compute/<model>/<gpu>/tp<T>/
mbs<M>.json, network/<link>/<gpu>/<peer>[-n<G>].json, power/<gpu>.json) so a directory is
easy to browse and diff.
A directory that is a Sailor artifact (profiles/<MODEL>/<GPU>/profile.json) is imported
through profiles.sailor instead.

Used by the CLI's `--profiles DIR`, the profilers in the trainer image (which write what
they measured) and the operator's profile store (ConfigMap data via dumps/loads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sailplan.planner.catalog import Catalog, default_catalog
from sailplan.planner.profiles.sailor import SailorFormatError, import_artifact, is_sailor_artifact
from sailplan.planner.profiles.types import (
    ComputeProfile,
    NetworkProfile,
    PowerProfile,
    ProfileSet,
)

Profile = ComputeProfile | NetworkProfile | PowerProfile

SUFFIXES = (".json", ".yaml", ".yml")


class ProfileStoreError(ValueError):
    """A profile file or directory that cannot be read; the message names the file."""


def _parse_documents(data: Any, source: str) -> ProfileSet:
    items: list[Any]
    if (
        isinstance(data, dict)
        and "kind" not in data
        and ("compute" in data or "network" in data or "power" in data)
    ):
        items = [*(data.get("compute") or []), *(data.get("network") or [])]
        items += list(data.get("power") or [])
    elif isinstance(data, list):
        items = data
    else:
        items = [data]
    compute: list[ComputeProfile] = []
    network: list[NetworkProfile] = []
    power: list[PowerProfile] = []
    for item in items:
        if not isinstance(item, dict):
            raise ProfileStoreError(
                f"{source}: expected a profile object, got {type(item).__name__}"
            )
        kind = item.get("kind")
        try:
            if kind == "ComputeProfile":
                compute.append(ComputeProfile.model_validate(item))
            elif kind == "NetworkProfile":
                network.append(NetworkProfile.model_validate(item))
            elif kind == "PowerProfile":
                power.append(PowerProfile.model_validate(item))
            else:
                raise ProfileStoreError(
                    f"{source}: unknown profile kind {kind!r} (ComputeProfile, NetworkProfile "
                    "or PowerProfile)"
                )
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            at = f" at {where}" if where else ""
            raise ProfileStoreError(f"{source}: invalid {kind}{at}: {first['msg']}") from error
    return ProfileSet(compute=tuple(compute), network=tuple(network), power=tuple(power))


def loads(text: str, source: str = "<text>") -> ProfileSet:
    """Profiles from one JSON or YAML document (a ConfigMap value, a file's content)."""
    try:
        data = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as error:
        raise ProfileStoreError(f"{source}: not JSON or YAML: {error}") from error
    if data is None:
        return ProfileSet()
    return _parse_documents(data, source)


def dumps(profiles: ProfileSet) -> str:
    """A whole ProfileSet as one JSON document (what loads() reads back)."""
    return profiles.model_dump_json(indent=2)


def load_profile_dir(path: Path, catalog: Catalog | None = None) -> ProfileSet:
    """Every profile under `path` (a profile directory or a Sailor artifact)."""
    if not path.exists():
        raise ProfileStoreError(f"profile directory {path} does not exist")
    if path.is_file():
        return loads(path.read_text(), str(path))
    if is_sailor_artifact(path):
        try:
            return import_artifact(path, catalog or default_catalog()).profiles
        except SailorFormatError as error:
            raise ProfileStoreError(str(error)) from error
    compute: list[ComputeProfile] = []
    network: list[NetworkProfile] = []
    power: list[PowerProfile] = []
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES):
        try:
            text = file.read_text()
        except OSError as error:
            raise ProfileStoreError(f"cannot read {file}: {error}") from error
        part = loads(text, str(file))
        compute.extend(part.compute)
        network.extend(part.network)
        power.extend(part.power)
    return ProfileSet(compute=tuple(compute), network=tuple(network), power=tuple(power))


def profile_path(directory: Path, profile: Profile) -> Path:
    """Where write_profile puts a profile: its key as a path."""
    parts = profile.key.split("/")
    name = parts[-1]
    if isinstance(profile, NetworkProfile) and profile.gpus_per_node:
        name += f"-n{profile.gpus_per_node}"
    if isinstance(profile, NetworkProfile) and profile.measure != "p2p":
        name += f"-{profile.measure}"  # a collective or concurrent curve beside the p2p one
    return directory.joinpath(*parts[:-1], f"{name}.json")


def write_profile(directory: Path, profile: Profile) -> Path:
    """Write one profile as JSON under `directory` (replacing a profile with the same key)."""
    target = profile_path(directory, profile)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(profile.model_dump_json(indent=2) + "\n")
    return target


def write_profiles(directory: Path, profiles: ProfileSet) -> list[Path]:
    written = [write_profile(directory, p) for p in profiles.compute]
    written += [write_profile(directory, p) for p in profiles.network]
    written += [write_profile(directory, p) for p in profiles.power]
    return written
