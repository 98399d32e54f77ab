"""Pure checks of what the local Karpenter is given: the instance-types file made from the GKE
machine catalog, and the NodePools a GPUPool's spec.autoscaling stands for. A wrong label,
limit or taint here would make Karpenter create nodes the GPUPool does not select (or none);
the cluster test (tests/operator/test_karpenter_cluster.py) shows the whole path once.
"""

from __future__ import annotations

from typing import Any

import pytest

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.machines import MACHINE_SHAPES
from sailplan_dev.localcluster import build
from sailplan_dev.localcluster.karpenter_shapes import (
    CAPACITY_TYPE_LABEL,
    KarpenterError,
    instance_types,
    node_pools,
    without_offerings,
)
from sailplan_dev.localcluster.nodes import MANAGER_KWOK, MANAGER_LABEL


def gpupool(**spec: Any) -> GPUPool:
    return GPUPool.model_validate({"name": "train", "spec": {"nodePool": "gpu-np", **spec}})


def labels_of(offering: dict[str, Any]) -> dict[str, str]:
    return {r["key"]: r["values"][0] for r in offering["Requirements"]}


def test_every_gke_machine_type_is_offered_with_its_gpus_in_every_zone() -> None:
    zones = ["us-central1-a", "europe-west4-a"]
    types = {t["name"]: t for t in instance_types(zones)}
    for machine, shape in MACHINE_SHAPES.items():
        assert types[machine]["resources"]["nvidia.com/gpu"] == str(shape.gpus_per_node)
    a3 = types["a3-highgpu-8g"]
    offered = {
        (o["zone"], o["spot"])
        for o in (
            {
                "zone": labels_of(x)["topology.kubernetes.io/zone"],
                "spot": labels_of(x)[CAPACITY_TYPE_LABEL],
            }
            for x in a3["offerings"]
        )
    }
    assert offered == {(z, c) for z in zones for c in ("on-demand", "spot")}
    europe_spot = next(
        labels_of(o)
        for o in a3["offerings"]
        if labels_of(o)["topology.kubernetes.io/zone"] == "europe-west4-a"
        and labels_of(o)[CAPACITY_TYPE_LABEL] == "spot"
    )
    # What the nodes get as labels: GKE's names for the accelerator, spot-ness and region.
    assert europe_spot["cloud.google.com/gke-accelerator"] == "nvidia-h100-80gb"
    assert europe_spot["cloud.google.com/gke-spot"] == "true"
    assert europe_spot["topology.kubernetes.io/region"] == "europe-west4"
    prices = {labels_of(o)[CAPACITY_TYPE_LABEL]: o["Price"] for o in a3["offerings"]}
    assert 0 < prices["spot"] < prices["on-demand"]


def test_max_nodes_per_zone_is_one_node_pool_per_zone_selecting_the_gke_pool() -> None:
    pool = gpupool(
        autoscaling={
            "zones": ["us-central1-a", "us-central1-b"],
            "machineType": "a2-highgpu-4g",
            "maxNodesPerZone": 3,
        }
    )
    made = node_pools(pool, consolidate_after_s=5)
    assert [p["metadata"]["name"] for p in made] == ["train-us-central1-a", "train-us-central1-b"]
    for manifest, zone in zip(made, ["us-central1-a", "us-central1-b"], strict=True):
        spec = manifest["spec"]
        assert spec["limits"] == {"nodes": "3", "nvidia.com/gpu": "12"}
        template = spec["template"]
        assert template["metadata"]["labels"] == {
            "cloud.google.com/gke-nodepool": "gpu-np",
            MANAGER_LABEL: MANAGER_KWOK,  # the local cluster's kwok plays their kubelet
        }
        requirements = {r["key"]: r["values"] for r in template["spec"]["requirements"]}
        assert requirements == {
            "node.kubernetes.io/instance-type": ["a2-highgpu-4g"],
            "topology.kubernetes.io/zone": [zone],
            CAPACITY_TYPE_LABEL: ["on-demand"],
        }
        assert template["spec"]["taints"] == [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
        ]
        assert spec["disruption"]["consolidateAfter"] == "5s"


def test_spot_n1_pool_with_a_total_limit_is_one_spot_node_pool() -> None:
    pool = gpupool(
        gpuType="V100",
        spot=True,
        autoscaling={"zones": ["us-west1-b", "us-east1-b"], "gpusPerNode": 2, "totalMaxNodes": 5},
    )
    (made,) = node_pools(pool)
    template = made["spec"]["template"]["spec"]
    requirements = {r["key"]: r["values"] for r in template["requirements"]}
    machine = requirements["node.kubernetes.io/instance-type"]
    # An instance type the file offers, with the pool's GPUs per node.
    offered = {t["name"]: t for t in instance_types(["us-west1-b"])}
    assert offered[machine[0]]["resources"]["nvidia.com/gpu"] == "2"
    assert requirements[CAPACITY_TYPE_LABEL] == ["spot"]
    assert requirements["topology.kubernetes.io/zone"] == ["us-west1-b", "us-east1-b"]
    assert made["spec"]["limits"] == {"nodes": "5", "nvidia.com/gpu": "10"}
    assert {t["key"] for t in template["taints"]} == {"nvidia.com/gpu", "cloud.google.com/gke-spot"}


def test_a_pool_that_never_grows_has_no_node_pool() -> None:
    with pytest.raises(KarpenterError, match=r"no spec\.autoscaling"):
        node_pools(gpupool())


def test_karpenter_is_built_with_its_crds_and_checked_by_its_module_version() -> None:
    (group,) = [g for g in build.GROUPS if g.name == "karpenter"]
    (binary,) = group.binaries
    # go install names the binary after its package (kwok), which is taken by kwok itself.
    assert (binary.name, binary.installed_as) == ("karpenter", "kwok")
    assert binary.from_build_info and build.KARPENTER_VERSION in binary.expect
    assert {p.rsplit("/", 1)[-1] for p in group.shared} >= {
        "karpenter.sh_nodepools.yaml",
        "karpenter.sh_nodeclaims.yaml",
        "karpenter.kwok.sh_kwoknodeclasses.yaml",
    }
    # `sailplan cluster up` does not need it: the control plane starts without Karpenter.
    assert "karpenter" not in build.CONTROL_PLANE_NAMES


def test_a_stockout_takes_only_that_machine_types_offerings_in_those_zones() -> None:
    zones = ["us-central1-a", "us-central1-b"]
    full = instance_types(zones)
    stocked_out = without_offerings(full, "a2-highgpu-4g", ["us-central1-b"])
    before, after = ({t["name"]: t for t in types} for types in (full, stocked_out))
    offered = {
        (labels_of(o)["topology.kubernetes.io/zone"], labels_of(o)[CAPACITY_TYPE_LABEL])
        for o in after["a2-highgpu-4g"]["offerings"]
    }
    # on demand and spot gone in zone b, both still offered in zone a
    assert offered == {("us-central1-a", "on-demand"), ("us-central1-a", "spot")}
    assert after["a2-highgpu-4g"]["resources"] == before["a2-highgpu-4g"]["resources"]
    # every other machine type as it was, and the input untouched (the restore reuses it)
    assert {k: v for k, v in after.items() if k != "a2-highgpu-4g"} == {
        k: v for k, v in before.items() if k != "a2-highgpu-4g"
    }
    assert len(before["a2-highgpu-4g"]["offerings"]) == 4
    with pytest.raises(KarpenterError, match="no instance type a9-nothing"):
        without_offerings(full, "a9-nothing", zones)
