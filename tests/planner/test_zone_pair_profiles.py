"""Zone-pair network profiles: the versioned format, files round trip, the Sailor import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from sailplan.planner.catalog import default_catalog
from sailplan.planner.profiles.sailor import import_network
from sailplan.planner.profiles.store import dumps, load_profile_dir, loads, write_profiles
from sailplan.planner.profiles.types import (
    PROFILE_API_VERSION,
    ZONE_PAIR_API_VERSION,
    BandwidthCurve,
    NetworkProfile,
    ProfileSet,
    Provenance,
)

ARTIFACT = Path("/work/shared/reference/sailor-artifact")
MEASURED = Provenance(source="measured", tool="test", date="2026-11-25")
CURVE = BandwidthCurve(coefficients=(0.0, 0.1, 1.0), max_bytes_per_s=2e9)


def pair(zone: str, gpu: str, peer_zone: str, peer: str, rate: float = 1.0) -> NetworkProfile:
    return NetworkProfile(
        link="inter-zone",
        gpu_type=gpu,
        peer_gpu_type=peer,
        zone=zone,
        peer_zone=peer_zone,
        gpus_per_node=4,
        curve=BandwidthCurve(coefficients=(0.0, 0.0, rate), max_bytes_per_s=rate * 1e9),
        provenance=MEASURED,
    )


def test_a_zone_pair_is_a_v1alpha2_document_and_a_class_curve_stays_v1alpha1() -> None:
    zoned = pair("r1-a", "A100-40", "r1-b", "V100-16")
    assert zoned.api_version == ZONE_PAIR_API_VERSION
    assert zoned.key == "network/inter-zone/r1-a/A100-40/r1-b/V100-16"
    whole = NetworkProfile(link="inter-zone", curve=CURVE, provenance=MEASURED)
    assert whole.api_version == PROFILE_API_VERSION
    # a document written before zone pairs existed still reads, as a class curve
    old = whole.model_dump(mode="json")
    del old["zone"], old["peer_zone"]
    assert NetworkProfile.model_validate(old) == whole


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"api_version": PROFILE_API_VERSION}, "v1alpha2"),
        ({"peer_zone": ""}, "both zone and peer_zone"),
        ({"peer_gpu_type": ""}, "names both GPU types"),
        ({"link": "intra-node"}, "between nodes"),
    ],
)
def test_malformed_zone_pairs_are_refused(change: dict[str, str], message: str) -> None:
    document = pair("r1-a", "A100-40", "r1-b", "V100-16").model_dump(mode="json") | change
    with pytest.raises(ValidationError, match=message):
        NetworkProfile.model_validate(document)


def test_zone_pairs_round_trip_through_files_and_documents(tmp_path: Path) -> None:
    profiles = ProfileSet(
        network=(
            pair("r1-a", "A100-40", "r1-b", "A100-40", 1.0),
            pair("r1-b", "A100-40", "r1-a", "A100-40", 3.0),  # the other direction
            NetworkProfile(link="inter-zone", curve=CURVE, provenance=MEASURED),
        )
    )
    write_profiles(tmp_path, profiles)
    for found in (load_profile_dir(tmp_path), loads(dumps(profiles))):
        assert set(found.network) == set(profiles.network)
        forward = found.zone_pair_profile("r1-a", "A100-40", "r1-b", "A100-40", 4)
        backward = found.zone_pair_profile("r1-b", "A100-40", "r1-a", "A100-40", 4)
        assert forward is not None and backward is not None
        assert (forward.curve.max_bytes_per_s, backward.curve.max_bytes_per_s) == (1e9, 3e9)
        # the class lookup sees only the class curve, never one pair's
        whole = found.network_profile("inter-zone", "A100-40", "A100-40")
        assert whole is not None and not whole.zone_pair


def _het_pairs() -> dict[tuple[str, str, str, str, int], list[float]]:
    """(sender zone, GPU, receiver zone, GPU, GPUs per VM) -> coefficients, read directly."""
    aliases = default_catalog()
    data = json.loads((ARTIFACT / "network" / "multizone_bandwidths_het.json").read_text())
    found = {}
    for zone_a, by_gpu in data.items():
        for gpu_a, by_count in by_gpu.items():
            for count, by_zone in by_count.items():
                for zone_b, by_gpu_b in by_zone.items():
                    for gpu_b, by_count_b in by_gpu_b.items():
                        if zone_a != zone_b and count in by_count_b:
                            key = (
                                zone_a,
                                aliases.resolve_gpu(gpu_a),
                                zone_b,
                                aliases.resolve_gpu(gpu_b),
                                int(count),
                            )
                            found[key] = by_count_b[count][0]
    return found


@pytest.mark.skipif(not ARTIFACT.exists(), reason="the Sailor artifact is not here")
def test_the_sailor_importer_fills_every_measured_zone_pair_per_direction() -> None:
    network, _ = import_network(ARTIFACT, default_catalog())
    imported = {
        (p.zone, p.gpu_type, p.peer_zone, p.peer_gpu_type, p.gpus_per_node): list(
            p.curve.coefficients
        )
        for p in network
        if p.zone_pair
    }
    expected = _het_pairs()
    assert imported == expected
    # the artifact's two directions of a pair differ somewhere, and both are kept
    assert any(
        imported[(zb, gb, za, ga, n)] != coefficients
        for (za, ga, zb, gb, n), coefficients in imported.items()
    )
    # the class medians stay, for zone pairs the artifact did not measure
    assert {p.link for p in network if not p.zone_pair} >= {"inter-zone", "inter-region"}
