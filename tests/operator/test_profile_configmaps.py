"""The profile store: profile documents in labelled ConfigMaps, bad ones reported not fatal."""

from __future__ import annotations

from sailplan.operator.profilestore import ProfileStore, parse_profile_configmaps
from sailplan.planner.profiles.types import (
    BandwidthCurve,
    ComputeProfile,
    NetworkProfile,
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
