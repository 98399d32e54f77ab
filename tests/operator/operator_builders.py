"""Builders for the operator's unit tests: a two-stage plan over three zones, GPUPools as
the operator would see them, and a TrainingJob spec. Imported by the tests and conftest."""

from __future__ import annotations

from typing import Any

from sailplan.operator.api.gpupool import GPUPool
from sailplan.planner.api import PlanRequest, PlanResult
from sailplan.planner.catalog import Catalog
from sailplan.planner.plan import (
    Plan,
    PlanInputs,
    Predictions,
    ProfileRef,
    Replica,
    Stage,
    StagePrediction,
)
from sailplan.planner.profiles.types import ProfileSet


def make_plan(catalog: Catalog, estimated: bool = False) -> Plan:
    """OPT-350M (26 layers): stage 0 = layers [0, 13) at TP 2 on A100s in two zones,
    stage 1 = layers [13, 26) at TP 1 on V100s in us-west1-b; DP 2, 2 micro-batches of 2."""
    a100 = "a100/us-central1-a", "a100/us-central1-b"
    return Plan(
        model=catalog.model("OPT-350M"),
        global_batch_size=8,
        micro_batch_size=2,
        num_micro_batches=2,
        stages=(
            Stage(
                layer_start=0,
                layer_end=13,
                tensor_parallel=2,
                replicas=(
                    Replica(pool=a100[0], gpu_type="A100-40", zone="us-central1-a"),
                    Replica(pool=a100[1], gpu_type="A100-40", zone="us-central1-b"),
                ),
            ),
            Stage(
                layer_start=13,
                layer_end=26,
                tensor_parallel=1,
                replicas=(
                    Replica(pool="v100/us-west1-b", gpu_type="V100-16", zone="us-west1-b"),
                    Replica(pool="v100/us-west1-b", gpu_type="V100-16", zone="us-west1-b"),
                ),
            ),
        ),
        predictions=Predictions(
            iteration_seconds=0.5,
            samples_per_second=16.0,
            stages=(
                StagePrediction(forward_backward_seconds=0.1, peak_memory_bytes=10**9),
                StagePrediction(forward_backward_seconds=0.1, peak_memory_bytes=10**9),
            ),
            usd_per_iteration=0.01,
            usd_per_hour=20.0,
            egress_bytes_per_iteration=1e6,
        ),
        inputs=PlanInputs(
            cluster_hash="sha256:0123456789abcdef",
            profiles=(
                ProfileRef(
                    key="compute/OPT-350M/A100-40/tp2/mbs2",
                    source="estimated" if estimated else "measured",
                ),
            ),
        ),
    )


def pool(
    name: str,
    node_pool: str,
    zones: dict[str, int],
    *,
    gpu_type: str = "A100-40",
    gpus_per_node: int = 4,
    spot: bool = False,
    **spec: Any,
) -> GPUPool:
    """A GPUPool whose status says `zones[zone]` nodes are free there."""
    return GPUPool.model_validate(
        {
            "name": name,
            "generation": 1,
            "spec": {"nodePool": node_pool, **spec},
            "status": {
                "gpuType": gpu_type,
                "spot": spot,
                "zones": [
                    {
                        "zone": zone,
                        "nodesTotal": n,
                        "nodesReady": n,
                        "nodesFree": n,
                        "gpusPerNode": gpus_per_node,
                        "gpusAllocatable": n * gpus_per_node,
                    }
                    for zone, n in sorted(zones.items())
                ],
            },
        }
    )


JOB_SPEC: dict[str, Any] = {
    "model": {"name": "OPT-350M"},
    "training": {"globalBatchSize": 8, "steps": 100, "seed": 7},
    "trainer": {"image": "sailplan-trainer:test", "cpu": 4, "memory": "16Gi"},
    "checkpoint": {"storage": {"uri": "gs://bucket/ckpt"}, "intervalSteps": 25},
    # Planning and replanning tests; profiling Jobs are the subject of test_reconcile_profiling.
    "profiling": {"mode": "Skip"},
}


class RecordingPlanner:
    """Returns a fixed result and records the requests (the real search is tested elsewhere)."""

    def __init__(self, result: PlanResult) -> None:
        self.result = result
        self.requests: list[PlanRequest] = []

    def __call__(self, request: PlanRequest, measured: ProfileSet) -> PlanResult:
        self.requests.append(request)
        return self.result
