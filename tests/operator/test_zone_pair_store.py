"""Zone-pair profiles in the operator's profile store: the ConfigMap round trip, one
ConfigMap per zone pair whichever direction, the key a profiling Job of that pair would use,
and an older v1alpha1-only reader's view. Pure: no cluster."""

from __future__ import annotations

from operator_builders import pool

from sailplan.operator.profilestore import parse_profile_configmap, parse_profile_configmaps
from sailplan.operator.profiling.importing import import_configmaps
from sailplan.operator.profiling.needs import NetworkNeed, missing_profiles
from sailplan.operator.profiling.results import DATA_KEY, KEY_ANNOTATION
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.planner.catalog import default_catalog
from sailplan.planner.profiles.types import (
    BandwidthCurve,
    NetworkProfile,
    ProfileSet,
    Provenance,
)

A, B = "us-central1-a", "us-central1-b"
MEASURED = Provenance(source="measured", tool="sailplan-profile", date="2026-11-25")


def direction(zone: str, peer_zone: str, rate: float) -> NetworkProfile:
    return NetworkProfile(
        link="inter-zone",
        gpu_type="A100-40",
        peer_gpu_type="A100-40",
        zone=zone,
        peer_zone=peer_zone,
        gpus_per_node=4,
        curve=BandwidthCurve(coefficients=(0.0, 0.0, rate), max_bytes_per_s=rate * 1e9),
        provenance=MEASURED,
    )


def test_an_imported_zone_pair_is_one_configmap_under_its_needs_key() -> None:
    profiles = ProfileSet(network=(direction(B, A, 2.0), direction(A, B, 1.0)))
    batch = import_configmaps(profiles, "sailplan-system", "test")
    (configmap,) = batch.configmaps  # both directions together, as the Job stores them
    pools = (pool("a100", "a100-ondemand", {A: 1, B: 1}),)
    model = default_catalog().model("OPT-350M")
    (need,) = [
        n
        for n in missing_profiles(model, 8, build_snapshot(pools), ProfileSet())
        if isinstance(n, NetworkNeed) and n.zone_pair
    ]
    assert configmap["metadata"]["annotations"][KEY_ANNOTATION] == need.key
    # the store reads both directions back, and with them the need is met
    configmap["metadata"]["resourceVersion"] = "7"
    parsed = parse_profile_configmap(configmap)
    assert parsed.problems == ()
    store = ProfileSet(network=parsed.network)
    forward = store.zone_pair_profile(A, "A100-40", B, "A100-40", 4)
    assert forward is not None and forward.curve.max_bytes_per_s == 1e9
    assert need.key not in [n.key for n in missing_profiles(model, 8, build_snapshot(pools), store)]


def test_a_v1alpha1_store_entry_is_still_read_beside_zone_pairs() -> None:
    whole = NetworkProfile(
        link="inter-zone",
        gpu_type="A100-40",
        peer_gpu_type="A100-40",
        curve=BandwidthCurve(coefficients=(0.0, 0.0, 1.0), max_bytes_per_s=1e9),
        provenance=MEASURED,
    )
    old = {
        "metadata": {"name": "old"},
        "data": {DATA_KEY: whole.model_dump_json(exclude={"zone", "peer_zone"})},
    }
    new = import_configmaps(
        ProfileSet(network=(direction(A, B, 1.0),)), "sailplan-system", "test"
    ).configmaps[0]
    found, problems = parse_profile_configmaps([old, new])
    assert problems == []
    assert {p.api_version for p in found.network} == {
        "sailplan.dev/v1alpha1",
        "sailplan.dev/v1alpha2",
    }
    assert found.network_profile("inter-zone", "A100-40", "A100-40") == whole
