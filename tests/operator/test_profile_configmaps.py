"""The profile store: profile documents in labelled ConfigMaps (compute, network and power),
bad ones reported not fatal."""

from __future__ import annotations

import json

from sailplan.operator.profilestore import ProfileStore, parse_profile_configmaps
from sailplan.operator.profiling import results
from sailplan.operator.profiling.importing import import_configmaps
from sailplan.planner.profiles.types import (
    BandwidthCurve,
    ComputeProfile,
    NetworkProfile,
    PowerPoint,
    PowerProfile,
    ProfileSet,
    Provenance,
)

MEASURED = Provenance(source="measured", tool="sailplan-profile", gpu_name="A100-SXM4-40GB")


def _compute(tp: int) -> ComputeProfile:
    return ComputeProfile(
        model="OPT-350M",
        gpu_type="A100-40",
        tensor_parallel=tp,
        micro_batch_size=2,
        forward_s=(0.001,) * 26,
        backward_s=(0.002,) * 26,
        update_s=(0.0001,) * 26,
        provenance=MEASURED,
    )


def test_single_documents_and_sets_are_collected() -> None:
    network = NetworkProfile(
        link="inter-zone",
        curve=BandwidthCurve(coefficients=(0.0, 0.1, 1.0), max_bytes_per_s=2e9),
        provenance=MEASURED,
    )
    bundle = ProfileSet(compute=(_compute(2),), network=(network,))
    configmaps = [
        {"metadata": {"name": "b"}, "data": {"set.json": bundle.model_dump_json()}},
        {
            "metadata": {"name": "a"},
            "data": {"tp1.json": _compute(1).model_dump_json(), "README": "not a profile"},
        },
    ]
    profiles, problems = parse_profile_configmaps(configmaps)
    assert problems == []
    assert profiles.compute_grid("OPT-350M", "A100-40") == [(1, 2), (2, 2)]
    assert profiles.network_profile("inter-zone") == network


def test_broken_documents_are_reported_and_skipped() -> None:
    configmaps = [
        {
            "metadata": {"name": "bad"},
            "data": {"x.json": "{not json", "y.json": '{"kind": "ComputeProfile"}'},
        },
        {"metadata": {"name": "good"}, "data": {"tp1.json": _compute(1).model_dump_json()}},
    ]
    profiles, problems = parse_profile_configmaps(configmaps)
    assert len(profiles.compute) == 1
    assert len(problems) == 2
    assert all(p.startswith("ConfigMap bad key ") for p in problems)


def _configmap(name: str, version: str, tp: int) -> dict[str, object]:
    return {
        "metadata": {"name": name, "resourceVersion": version},
        "data": {"p.json": _compute(tp).model_dump_json()},
    }


def test_the_index_store_parses_a_configmap_once_per_resource_version() -> None:
    store = ProfileStore()
    first, parsed = store.parsed(_configmap("a", "10", 1))
    again, reparsed = store.parsed(_configmap("a", "10", 1))
    changed, parsed_change = store.parsed(_configmap("a", "11", 2))
    assert (parsed, reparsed, parsed_change) == (True, False, True)
    assert again is first
    assert [c.tensor_parallel for c in changed.compute] == [2]


def test_the_combined_profile_set_follows_the_index_and_skips_bad_documents() -> None:
    store = ProfileStore()
    good, _ = store.parsed(_configmap("b", "1", 2))
    bad, _ = store.parsed(
        {"metadata": {"name": "a", "resourceVersion": "2"}, "data": {"x.json": "{"}}
    )
    assert len(bad.problems) == 1 and "ConfigMap a key x.json" in bad.problems[0]
    profiles = store.profiles([bad, good])
    assert [c.tensor_parallel for c in profiles.compute] == [2]
    assert store.profiles([good, bad]) is profiles  # unchanged index: the same set
    newer, _ = store.parsed(_configmap("b", "3", 4))
    assert [c.tensor_parallel for c in store.profiles([bad, newer]).compute] == [4]
    assert store.profiles([bad]).compute == ()  # a deleted ConfigMap's profiles go


def test_power_profiles_are_read_from_the_store_and_imported_into_it() -> None:
    power = PowerProfile(
        gpu_type="A100-40",
        idle_watts=55.0,
        points=(PowerPoint(sm_mhz=1410, watts=390.0), PowerPoint(sm_mhz=1200, watts=330.0)),
        provenance=MEASURED,
    )
    estimated = power.model_copy(
        update={"gpu_type": "V100-16", "provenance": Provenance(source="estimated", tool="x")}
    )
    # `sailplan profiles import`: one ConfigMap per GPU type's measured curve
    batch = import_configmaps(ProfileSet(power=(power, estimated)), "store", "lab")
    assert (batch.imported, batch.skipped_estimated) == (1, 1)
    (configmap,) = batch.configmaps
    assert configmap["metadata"]["annotations"][results.KEY_ANNOTATION] == "power/A100-40"
    # the operator's store reads it back, beside a single document and a bad one
    single = {"metadata": {"name": "b"}, "data": {"p.json": power.model_dump_json()}}
    broken = power.model_dump(mode="json") | {"idle_watts": 500.0}
    bad = {"metadata": {"name": "c"}, "data": {"p.json": json.dumps(broken)}}
    profiles, problems = parse_profile_configmaps([configmap, single, bad])
    assert profiles.power == (power, power)
    assert profiles.power_profiles() == (power,)
    assert len(problems) == 1 and problems[0].startswith("ConfigMap c key p.json")
    assert "below the blocking power" in problems[0]
