"""`sailplan profiles import`: a profile directory as profile-store ConfigMaps (pure).

Users who measured profiles elsewhere (a Sailor artifact, an earlier `sailplan-profile` run)
load them into the store so no TrainingJob profiles them again. The profiles are grouped by
the same keys the profiling Jobs use (compute/<model>/<gpu>, network/<link>/<gpu>/<peer>
[/n<G>], network/<link>/<zone>/<gpu>/<zone>/<gpu>/n<G> for a zone pair, both directions
in one; power/<gpu> for a PowerProfile, which no Job measures) and written with
results.keyed_configmap, so an import and a profiling Job of the same key replace one
another instead of piling up; every group stays far below the 1 MiB ConfigMap limit. Only measured profiles are imported: the store is where measured profiles
live, and estimates are computed by the planner on demand. Called by the CLI command in
operator/cli/operator_commands.py, which does the I/O.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sailplan.operator.profiling.results import keyed_configmap
from sailplan.planner.profiles.types import (
    ComputeProfile,
    NetworkProfile,
    PowerProfile,
    ProfileSet,
    zone_pair_key,
)


@dataclass(frozen=True)
class ImportBatch:
    configmaps: tuple[dict[str, Any], ...]
    imported: int  # measured profiles written
    skipped_estimated: int


def store_key(profile: ComputeProfile | NetworkProfile | PowerProfile) -> str:
    """The profile-store key of a profile (the key of the Need that would measure it)."""
    if isinstance(profile, ComputeProfile):
        return f"compute/{profile.model}/{profile.gpu_type}"
    if isinstance(profile, PowerProfile):
        return profile.key
    if profile.zone_pair:  # both directions of a zone pair in one entry, as its Job stores them
        return zone_pair_key(
            profile.link,
            profile.zone,
            profile.gpu_type,
            profile.peer_zone,
            profile.peer_gpu_type,
            profile.gpus_per_node,
        )
    size = f"/n{profile.gpus_per_node}" if profile.gpus_per_node else ""
    return profile.key + size


def import_configmaps(profiles: ProfileSet, namespace: str, source: str) -> ImportBatch:
    """One ConfigMap per store key, in key order (deterministic output for --dry-run diffs)."""
    compute: dict[str, list[ComputeProfile]] = defaultdict(list)
    network: dict[str, list[NetworkProfile]] = defaultdict(list)
    for found_compute in profiles.compute:
        if found_compute.provenance.source == "measured":
            compute[store_key(found_compute)].append(found_compute)
    for found_network in profiles.network:
        if found_network.provenance.source == "measured":
            network[store_key(found_network)].append(found_network)
    power: dict[str, list[PowerProfile]] = defaultdict(list)
    for found_power in profiles.power:
        if found_power.provenance.source == "measured":
            power[store_key(found_power)].append(found_power)
    configmaps = (
        [
            keyed_configmap(
                ProfileSet(compute=tuple(found)), "compute", key, namespace, f"import:{source}"
            )
            for key, found in sorted(compute.items())
        ]
        + [
            keyed_configmap(
                ProfileSet(network=tuple(found)), "network", key, namespace, f"import:{source}"
            )
            for key, found in sorted(network.items())
        ]
        + [
            keyed_configmap(
                ProfileSet(power=tuple(found)), "power", key, namespace, f"import:{source}"
            )
            for key, found in sorted(power.items())
        ]
    )
    imported = (
        sum(len(v) for v in compute.values())
        + sum(len(v) for v in network.values())
        + sum(len(v) for v in power.values())
    )
    total = len(profiles.compute) + len(profiles.network) + len(profiles.power)
    return ImportBatch(tuple(configmaps), imported, total - imported)
