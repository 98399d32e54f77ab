"""GPUPool status from nodes: readiness, cordons, zones, GPU type and spot resolution."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sailplan.operator.api.common import find_condition
from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.reconcile.gpupool import pool_status, selects
from sailplan.operator.reconcile.nodes import NodeInfo, node_info, pod_gpu_request
from sailplan.planner.catalog import Catalog

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def gke_node(
    name: str,
    pool: str,
    zone: str,
    *,
    accelerator: str = "nvidia-tesla-a100",
    gpus: int = 4,
    ready: bool = True,
    cordoned: bool = False,
    spot: bool = False,
) -> NodeInfo:
    return node_info(
        {
            "metadata": {
                "name": name,
                "labels": {
                    "cloud.google.com/gke-nodepool": pool,
                    "cloud.google.com/gke-accelerator": accelerator,
                    "cloud.google.com/gke-spot": "true" if spot else "false",
                    "topology.kubernetes.io/zone": zone,
                },
            },
            "spec": {"unschedulable": cordoned} if cordoned else {},
            "status": {
                "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "48"},
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
    )


def gpupool(**spec: object) -> GPUPool:
    return GPUPool.model_validate({"name": "a100", "generation": 3, "spec": spec})


def test_counts_per_zone_exclude_not_ready_and_cordoned(catalog: Catalog) -> None:
    nodes = [
        gke_node("a-1", "a100", "us-central1-a"),
        gke_node("a-2", "a100", "us-central1-a", ready=False),
        gke_node("a-3", "a100", "us-central1-a", cordoned=True),
        gke_node("b-1", "a100", "us-central1-b"),
        gke_node("b-2", "a100", "us-central1-b"),
        gke_node("other", "v100", "us-central1-a", accelerator="nvidia-tesla-v100"),
    ]
    # b-2 has 2 of its 4 GPUs requested: it is in use, not free.
    status = pool_status(gpupool(nodePool="a100"), nodes, {"b-2": 2}, catalog, NOW)
    zones = {z.zone: z for z in status.zones}
    assert set(zones) == {"us-central1-a", "us-central1-b"}
    a, b = zones["us-central1-a"], zones["us-central1-b"]
    assert (a.nodes_total, a.nodes_ready, a.nodes_free, a.gpus_allocatable) == (3, 1, 1, 4)
    assert (b.nodes_total, b.nodes_ready, b.nodes_free, b.gpus_in_use) == (2, 2, 1, 2)
    assert (status.nodes_total, status.nodes_ready, status.gpus_allocatable) == (5, 3, 12)
    assert status.gpus_in_use == 2
    assert status.observed_generation == 3
    ready = find_condition(status.conditions, "Ready")
    assert ready is not None and ready.status == "True"


def test_gpu_type_from_the_gke_accelerator_label(catalog: Catalog) -> None:
    # GKE labels A100 40GB nodes `nvidia-tesla-a100`; the catalog names that type A100-40.
    status = pool_status(
        gpupool(nodePool="a100"), [gke_node("n", "a100", "us-central1-a")], {}, catalog, NOW
    )
    assert status.gpu_type == "A100-40"
    condition = find_condition(status.conditions, "GPUTypeResolved")
    assert condition is not None and condition.reason == "Resolved"


def test_unknown_gpu_type_names_the_known_ones(catalog: Catalog) -> None:
    status = pool_status(
        gpupool(nodePool="a100", gpuType="H9000"),
        [gke_node("n", "a100", "us-central1-a")],
        {},
        catalog,
        NOW,
    )
    assert status.gpu_type is None
    condition = find_condition(status.conditions, "GPUTypeResolved")
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", "UnknownGPUType")
    assert "H9000" in condition.message and "A100-40" in condition.message


def test_mixed_gpu_types_are_refused(catalog: Catalog) -> None:
    nodes = [
        gke_node("x", "mixed", "us-central1-a"),
        gke_node("y", "mixed", "us-central1-a", accelerator="nvidia-tesla-v100"),
    ]
    status = pool_status(gpupool(nodePool="mixed"), nodes, {}, catalog, NOW)
    condition = find_condition(status.conditions, "GPUTypeResolved")
    assert status.gpu_type is None
    assert condition is not None and condition.reason == "MixedGPUTypes"


def test_spot_from_label_unless_the_spec_says(catalog: Catalog) -> None:
    nodes = [gke_node("s", "spot", "us-central1-a", spot=True)]
    assert pool_status(gpupool(nodePool="spot"), nodes, {}, catalog, NOW).spot is True
    overridden = pool_status(gpupool(nodePool="spot", spot=False), nodes, {}, catalog, NOW)
    assert overridden.spot is False


def test_empty_pool_is_not_ready_and_transition_time_is_kept(catalog: Catalog) -> None:
    first = pool_status(gpupool(nodePool="none"), [], {}, catalog, NOW)
    ready = find_condition(first.conditions, "Ready")
    assert ready is not None and (ready.status, ready.reason) == ("False", "NoReadyNodes")
    # Same status an hour later: lastTransitionTime stays, so the status patch is a no-op.
    pool = GPUPool.model_validate(
        {"name": "a100", "generation": 3, "spec": {"nodePool": "none"}, "status": first.to_kube()}
    )
    later = pool_status(pool, [], {}, catalog, NOW + timedelta(hours=1))
    assert later == first


def test_selector_pools_match_all_labels() -> None:
    node = gke_node("n", "v100-spot", "us-west1-b", spot=True)
    by_labels = gpupool(selector={"matchLabels": {"cloud.google.com/gke-nodepool": "v100-spot"}})
    assert selects(by_labels, node)
    stricter = gpupool(
        selector={
            "matchLabels": {
                "cloud.google.com/gke-nodepool": "v100-spot",
                "cloud.google.com/gke-spot": "false",
            }
        }
    )
    assert not selects(stricter, node)


def test_finished_pods_release_their_gpus() -> None:
    pod = {
        "spec": {
            "nodeName": "n1",
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
        "status": {"phase": "Running"},
    }
    assert pod_gpu_request(pod) == ("n1", 2)
    assert pod_gpu_request(pod | {"status": {"phase": "Succeeded"}}) is None
    assert pod_gpu_request(pod | {"spec": {"containers": []}}) is None


def test_an_init_container_holds_its_gpus_like_the_scheduler_counts_them() -> None:
    # The scheduler reserves max(sum of app containers, largest init container): a profiling
    # pod's GPU belongs to its profiler init container, its report container asks for none.
    def gpu(count: int) -> dict[str, object]:
        return {"resources": {"limits": {"nvidia.com/gpu": str(count)}}}

    pod = {
        "spec": {
            "nodeName": "n1",
            "initContainers": [gpu(4), gpu(1)],
            "containers": [{"resources": {}}],
        },
        "status": {"phase": "Pending"},
    }
    assert pod_gpu_request(pod) == ("n1", 4)
    more = pod | {"spec": pod["spec"] | {"containers": [gpu(3), gpu(3)]}}  # type: ignore[operator]
    assert pod_gpu_request(more) == ("n1", 6)
