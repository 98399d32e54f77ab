"""The planner's ClusterSnapshot built from GPUPool statuses, and pool selection."""

from __future__ import annotations

import pytest
from operator_builders import pool

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import PoolSelection
from sailplan.operator.reconcile.snapshot import (
    PoolSelectionError,
    build_snapshot,
    select_pools,
)


def test_one_snapshot_pool_per_gpupool_and_zone(pools: tuple[GPUPool, ...]) -> None:
    snapshot = build_snapshot(pools)
    assert [(p.name, p.gpu_type, p.zone, p.nodes, p.gpus_per_node) for p in snapshot.pools] == [
        ("a100/us-central1-a", "A100-40", "us-central1-a", 2, 4),
        ("a100/us-central1-b", "A100-40", "us-central1-b", 2, 4),
        ("v100/us-west1-b", "V100-16", "us-west1-b", 3, 4),
    ]
    assert snapshot.pool("v100/us-west1-b").region == "us-west1"
    # No price override: the catalog decides (None).
    assert all(p.usd_per_gpu_hour is None for p in snapshot.pools)


def test_price_override_follows_spot() -> None:
    pricing = {"onDemandUsdPerGpuHour": 3.0, "spotUsdPerGpuHour": 1.0}
    spot = pool("s", "s", {"us-central1-a": 1}, spot=True, pricing=pricing)
    ondemand = pool("o", "o", {"us-central1-a": 1}, pricing=pricing)
    prices = {p.name: (p.spot, p.usd_per_gpu_hour) for p in build_snapshot([spot, ondemand]).pools}
    assert prices == {"o/us-central1-a": (False, 3.0), "s/us-central1-a": (True, 1.0)}


def test_zones_without_free_nodes_and_unresolved_pools_are_left_out() -> None:
    busy = pool("busy", "busy", {"us-central1-a": 0, "us-central1-b": 1})
    unresolved = GPUPool.model_validate(
        {
            "name": "x",
            "spec": {"nodePool": "x"},
            "status": {"zones": [{"zone": "z", "nodesFree": 2, "gpusPerNode": 1}]},
        }
    )
    names = [p.name for p in build_snapshot([busy, unresolved]).pools]
    assert names == ["busy/us-central1-b"]


def test_selection_by_name_label_or_all(pools: tuple[GPUPool, ...]) -> None:
    assert [p.name for p in select_pools(PoolSelection(), pools)] == ["a100", "v100"]
    assert [p.name for p in select_pools(PoolSelection(names=("v100",)), pools)] == ["v100"]
    labelled = (pools[0].model_copy(update={"labels": {"tier": "spot"}}), pools[1])
    chosen = select_pools(
        PoolSelection.model_validate({"selector": {"matchLabels": {"tier": "spot"}}}), labelled
    )
    assert [p.name for p in chosen] == ["a100"]


def test_unknown_pool_names_list_the_existing_ones(pools: tuple[GPUPool, ...]) -> None:
    with pytest.raises(PoolSelectionError, match=r"h100.*existing: a100, v100"):
        select_pools(PoolSelection(names=("h100",)), pools)


def test_an_energy_price_reaches_every_zone_of_its_pool_and_none_is_unpriced() -> None:
    priced = pool(
        "p", "p", {"us-central1-a": 1, "us-central1-b": 1}, pricing={"energyUsdPerKwh": 0.2}
    )
    plain = pool("q", "q", {"us-central1-a": 1})
    kwh = {p.name: p.usd_per_kwh for p in build_snapshot([priced, plain]).pools}
    assert kwh == {"p/us-central1-a": 0.2, "p/us-central1-b": 0.2, "q/us-central1-a": None}


def test_a_negative_energy_price_is_refused_by_the_model() -> None:
    with pytest.raises(ValueError, match=r"energyUsdPerKwh|energy_usd_per_kwh"):
        pool("p", "p", {"us-central1-a": 1}, pricing={"energyUsdPerKwh": -0.1})
