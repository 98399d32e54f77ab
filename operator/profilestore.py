"""The profile store: measured profiles kept in labelled ConfigMaps.

Profiles measured by `sailplan-profile` (or imported from a Sailor artifact) are stored as
JSON documents (sailplan.planner.profiles.types) in ConfigMaps labelled
`sailplan.dev/profile` in the operator's namespace; every data key ending in `.json` holds
one ComputeProfile, one NetworkProfile or a ProfileSet. This module parses them (pure);
the handler lists the ConfigMaps. Broken documents are reported, never fatal: one bad
ConfigMap must not stop every job from planning.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from sailplan.planner.profiles.types import ComputeProfile, NetworkProfile, ProfileSet


def parse_profile_configmaps(
    configmaps: Iterable[Mapping[str, Any]],
) -> tuple[ProfileSet, list[str]]:
    """All profiles in the ConfigMaps, plus one message per document that did not parse."""
    compute: list[ComputeProfile] = []
    network: list[NetworkProfile] = []
    problems: list[str] = []
    ordered = sorted(configmaps, key=lambda cm: str((cm.get("metadata") or {}).get("name", "")))
    for configmap in ordered:
        name = (configmap.get("metadata") or {}).get("name", "?")
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
                else:
                    found = ProfileSet.model_validate(document)
                    compute.extend(found.compute)
                    network.extend(found.network)
            except (ValueError, ValidationError) as error:
                first = str(error).splitlines()[0]
                problems.append(f"ConfigMap {name} key {key}: {first}")
    return ProfileSet(compute=tuple(compute), network=tuple(network)), problems
