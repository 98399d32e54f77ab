"""The profile store: measured profiles kept in labelled ConfigMaps.

Profiles measured by `sailplan-profile` (or imported from a Sailor artifact) are stored as
JSON documents (sailplan.planner.profiles.types) in ConfigMaps labelled
`sailplan.dev/profile` in the operator's namespace; every data key ending in `.json` holds
one ComputeProfile, one NetworkProfile, one PowerProfile (a GPU type's measured power
against SM clock, which the energy model then uses instead of the datasheet) or a
ProfileSet. This module parses them (pure).
The operator keeps the store in a Kopf index (sailplan.operator.controller.registration):
each ConfigMap is parsed once per change (`ProfileStore.parsed`, keyed by resourceVersion,
so the watch's periodic re-list does not parse them again) and a reconcile pass takes the
combined `ProfileSet`, rebuilt only when some ConfigMap changed. Broken documents are
reported, never fatal: one bad ConfigMap must not stop every job from planning.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sailplan.planner.profiles.types import (
    ComputeProfile,
    NetworkProfile,
    PowerProfile,
    ProfileSet,
)


@dataclass(frozen=True)
class ParsedConfigMap:
    """The profiles of one ConfigMap, and one message per document that did not parse."""

    name: str
    resource_version: str
    compute: tuple[ComputeProfile, ...]
    network: tuple[NetworkProfile, ...]
    problems: tuple[str, ...]
    power: tuple[PowerProfile, ...] = ()


def parse_profile_configmap(configmap: Mapping[str, Any]) -> ParsedConfigMap:
    metadata = configmap.get("metadata") or {}
    name = str(metadata.get("name", "?"))
    compute: list[ComputeProfile] = []
    network: list[NetworkProfile] = []
    power: list[PowerProfile] = []
    problems: list[str] = []
    for key, text in sorted((configmap.get("data") or {}).items()):
        if not key.endswith(".json"):
            continue
        try:
            document = json.loads(text)
            kind = document.get("kind") if isinstance(document, dict) else None
            if kind == "ComputeProfile":
                compute.append(ComputeProfile.model_validate(document))
            elif kind == "NetworkProfile":
                network.append(NetworkProfile.model_validate(document))
            elif kind == "PowerProfile":
                power.append(PowerProfile.model_validate(document))
            else:
                found = ProfileSet.model_validate(document)
                compute.extend(found.compute)
                network.extend(found.network)
                power.extend(found.power)
        except ValidationError as error:
            # the first problem itself, not pydantic's "1 validation error for ..." header
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            problems.append(
                f"ConfigMap {name} key {key}: invalid {error.title}"
                f"{f' at {where}' if where else ''}: {first['msg']}"
            )
        except ValueError as error:
            first_line = str(error).splitlines()[0]
            problems.append(f"ConfigMap {name} key {key}: {first_line}")
    return ParsedConfigMap(
        name=name,
        resource_version=str(metadata.get("resourceVersion", "")),
        compute=tuple(compute),
        network=tuple(network),
        problems=tuple(problems),
        power=tuple(power),
    )


def combine(parsed: Iterable[ParsedConfigMap]) -> ProfileSet:
    """One ProfileSet of several ConfigMaps' profiles, in ConfigMap name order."""
    ordered = sorted(parsed, key=lambda p: p.name)
    return ProfileSet(
        compute=tuple(c for p in ordered for c in p.compute),
        network=tuple(n for p in ordered for n in p.network),
        power=tuple(w for p in ordered for w in p.power),
    )


def parse_profile_configmaps(
    configmaps: Iterable[Mapping[str, Any]],
) -> tuple[ProfileSet, list[str]]:
    """All profiles in the ConfigMaps, plus one message per document that did not parse."""
    parsed = sorted(map(parse_profile_configmap, configmaps), key=lambda p: p.name)
    return combine(parsed), [problem for p in parsed for problem in p.problems]


class ProfileStore:
    """Parsed ConfigMaps by name and resourceVersion, and the last combined ProfileSet."""

    def __init__(self) -> None:
        self._parsed: dict[str, ParsedConfigMap] = {}
        self._combined: tuple[frozenset[tuple[str, str]], ProfileSet] | None = None

    def parsed(self, configmap: Mapping[str, Any]) -> tuple[ParsedConfigMap, bool]:
        """The ConfigMap parsed, and whether that took a parse (False: same version as
        the last one seen under its name)."""
        metadata = configmap.get("metadata") or {}
        name = str(metadata.get("name", "?"))
        version = str(metadata.get("resourceVersion", ""))
        known = self._parsed.get(name)
        if known is not None and version and known.resource_version == version:
            return known, False
        fresh = parse_profile_configmap(configmap)
        self._parsed[name] = fresh
        return fresh, True

    def forget(self, name: str) -> None:
        self._parsed.pop(name, None)

    def profiles(self, current: Iterable[ParsedConfigMap]) -> ProfileSet:
        """The ProfileSet of `current` (the index's values), rebuilt only if it changed."""
        entries = tuple(current)
        versions = frozenset((p.name, p.resource_version) for p in entries)
        if self._combined is None or self._combined[0] != versions:
            self._combined = (versions, combine(entries))
        return self._combined[1]
