"""The example GPUPools (manifests/examples) as the planner sees them on the default local
cluster's nodes: one planner-side copy for the tests and benchmarks that plan over the
operator's own example (tests/operator/test_planning_service.py,
tests/planner/test_memory_options_deadline.py, benchmarks/first_plan.py)."""

from __future__ import annotations

from sailplan.planner.cluster import Pool

EXAMPLE_POOLS: tuple[Pool, ...] = (
    Pool(name="a100-ondemand/us-central1-a", gpu_type="A100-40", zone="us-central1-a",
         region="us-central1", gpus_per_node=4, nodes=2),
    Pool(name="a100-ondemand/us-central1-b", gpu_type="A100-40", zone="us-central1-b",
         region="us-central1", gpus_per_node=4, nodes=2),
    Pool(name="a100-spot/us-central1-a", gpu_type="A100-40", zone="us-central1-a",
         region="us-central1", gpus_per_node=4, nodes=3, spot=True),
    Pool(name="v100-ondemand/us-central1-a", gpu_type="V100-16", zone="us-central1-a",
         region="us-central1", gpus_per_node=4, nodes=3),
    Pool(name="v100-ondemand/us-west1-b", gpu_type="V100-16", zone="us-west1-b",
         region="us-west1", gpus_per_node=4, nodes=3),
    Pool(name="v100-spot/us-west1-b", gpu_type="V100-16", zone="us-west1-b",
         region="us-west1", gpus_per_node=2, nodes=2, spot=True),
)  # fmt: skip
