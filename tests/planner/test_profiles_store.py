"""Profile directories: write, read back, and one-line errors for bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from sailplan.planner.profiles.store import (
    ProfileStoreError,
    dumps,
    load_profile_dir,
    loads,
    write_profile,
    write_profiles,
)
from sailplan.planner.profiles.types import (
    BandwidthCurve,
    ComputeProfile,
    NetworkProfile,
    ProfileSet,
    Provenance,
)

COMPUTE = ComputeProfile(
    model="OPT-350M",
    gpu_type="A100-40",
    tensor_parallel=2,
    micro_batch_size=4,
    forward_s=(0.1, 0.2),
    backward_s=(0.2, 0.4),
    update_s=(0.01, 0.01),
    provenance=Provenance(source="measured", tool="sailplan-profile", date="2026-01-01"),
)
NETWORK = NetworkProfile(
    link="inter-zone",
    gpu_type="A100-40",
    peer_gpu_type="V100-16",
    gpus_per_node=4,
    curve=BandwidthCurve(coefficients=(0.0, 0.1, 1.0), max_bytes_per_s=2e9),
    provenance=Provenance(source="measured", tool="sailplan-profile"),
)


def test_written_profiles_read_back_equal(tmp_path: Path) -> None:
    paths = write_profiles(tmp_path, ProfileSet(compute=(COMPUTE,), network=(NETWORK,)))
    assert tmp_path / "compute/OPT-350M/A100-40/tp2/mbs4.json" in paths
    assert tmp_path / "network/inter-zone/A100-40/V100-16-n4.json" in paths
    loaded = load_profile_dir(tmp_path)
    assert loaded.compute == (COMPUTE,)
    assert loaded.network == (NETWORK,)


def test_yaml_lists_and_whole_sets_are_read(tmp_path: Path) -> None:
    (tmp_path / "all.yaml").write_text(dumps(ProfileSet(compute=(COMPUTE,), network=(NETWORK,))))
    assert load_profile_dir(tmp_path).compute == (COMPUTE,)
    assert loads(f"[{COMPUTE.model_dump_json()}]").compute == (COMPUTE,)


def test_rewriting_a_key_replaces_the_file(tmp_path: Path) -> None:
    write_profile(tmp_path, COMPUTE)
    faster = COMPUTE.model_copy(update={"forward_s": (0.05, 0.1)})
    write_profile(tmp_path, faster)
    assert load_profile_dir(tmp_path).compute == (faster,)


def test_a_bad_file_is_one_line_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"kind": "ComputeProfile", "model": "m"}')
    with pytest.raises(ProfileStoreError) as error:
        load_profile_dir(tmp_path)
    message = str(error.value)
    assert str(bad) in message and "\n" not in message
    (tmp_path / "broken.json").write_text('{"kind": "Bogus"}')
    with pytest.raises(ProfileStoreError, match="unknown profile kind 'Bogus'"):
        load_profile_dir(tmp_path)


def test_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileStoreError, match="does not exist"):
        load_profile_dir(tmp_path / "nope")
