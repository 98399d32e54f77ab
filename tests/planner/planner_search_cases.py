"""Small, hand-made planning problems shared by the search, optimality and CLI tests.

Profiles are written here by hand (not estimated), so each test knows exactly why a plan
should win: per-layer times are round numbers, a fast and a slow GPU type differ by a
fixed factor, and the head can be made heavy. Network profiles are the catalog defaults
(complete_profiles), the same for the search and for the brute force.
"""

from __future__ import annotations

from collections.abc import Sequence

from sailplan.planner.catalog import default_catalog
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.estimate import complete_profiles
from sailplan.planner.profiles.types import ComputeProfile, ProfileSet, Provenance

FAST, SLOW = "A100-40", "V100-16"


def tiny_model(blocks: int = 3, name: str = "tiny") -> ModelSpec:
    return ModelSpec(
        name=name,
        hidden_size=256,
        num_blocks=blocks,
        num_heads=4,
        vocab_size=8000,
        sequence_length=256,
    )


def compute_profiles(
    model: ModelSpec,
    slowdown: dict[str, float],
    *,
    block_s: float = 0.010,
    head_s: float | None = None,
    tps: Sequence[int] = (1, 2),
    sizes: Sequence[int] = (1, 2),
) -> list[ComputeProfile]:
    """Forward = 1/3, backward = 2/3 of a layer's time; time scales with mbs / tp.

    Embedding 1 ms, each block `block_s`, the head `head_s` (default: one block), all
    multiplied by the GPU type's slowdown.
    """
    head = block_s if head_s is None else head_s
    out = []
    for gpu, factor in slowdown.items():
        for tp in tps:
            for mbs in sizes:
                scale = factor * mbs / tp
                layer = [0.001 * scale] + [block_s * scale] * model.num_blocks + [head * scale]
                out.append(
                    ComputeProfile(
                        model=model.name,
                        gpu_type=gpu,
                        tensor_parallel=tp,
                        micro_batch_size=mbs,
                        forward_s=tuple(t / 3 for t in layer),
                        backward_s=tuple(2 * t / 3 for t in layer),
                        update_s=tuple(1e-4 * factor for _ in layer),
                        provenance=Provenance(source="measured", tool="test"),
                    )
                )
    return out


def profile_set(
    model: ModelSpec, gpu_types: Sequence[str], compute: list[ComputeProfile]
) -> ProfileSet:
    measured = ProfileSet(compute=tuple(compute))
    return complete_profiles(model, gpu_types, [], [], measured=measured, catalog=default_catalog())


def pool(
    gpu: str,
    zone: str,
    gpus: int,
    *,
    per_node: int = 1,
    price: float | None = None,
    name: str | None = None,
) -> Pool:
    return Pool(
        name=name or f"{gpu.lower()}-{zone}",
        gpu_type=gpu,
        zone=zone,
        gpus_per_node=per_node,
        nodes=gpus // per_node,
        usd_per_gpu_hour=price,
    )


def cluster(*pools: Pool) -> ClusterSnapshot:
    return ClusterSnapshot(pools=pools)


def two_types_two_zones() -> tuple[ModelSpec, ClusterSnapshot, ProfileSet]:
    """Both types in two zones of one region, 1-GPU nodes (TP 1), the slow type 2.5x the
    fast one: pipelines may cross zones (the optimality and energy-optimality cases)."""
    model = tiny_model(blocks=3)
    snapshot = cluster(
        pool(FAST, "us-central1-a", 2),
        pool(SLOW, "us-central1-a", 1),
        pool(FAST, "us-central1-b", 1),
        pool(SLOW, "us-central1-b", 2),
    )
    profiles = profile_set(
        model, [FAST, SLOW], compute_profiles(model, {FAST: 1.0, SLOW: 2.5}, tps=(1,))
    )
    return model, snapshot, profiles
