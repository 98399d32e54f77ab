"""A new plan that differs from the running one only in its data split is a new layout.

The replan decision skips a candidate with the running plan's layout (switching would
change nothing); an uneven data split (Plan.pipeline_micro_batches) changes what every
pipeline trains on per step, so it must not count as the same layout.
"""

from __future__ import annotations

from sailplan.operator.replan.decision import same_layout
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage

MODEL = ModelSpec(
    name="tiny", hidden_size=32, num_blocks=2, num_heads=4, vocab_size=64, sequence_length=16
)


def _plan(counts: tuple[int, ...] | None) -> Plan:
    replicas = (
        Replica(pool="a100", gpu_type="A100-40", zone="us-central1-a"),
        Replica(pool="v100", gpu_type="V100-16", zone="us-central1-a"),
    )
    return Plan(
        model=MODEL,
        global_batch_size=8,
        micro_batch_size=1,
        num_micro_batches=max(counts) if counts else 4,
        pipeline_micro_batches=counts,
        stages=(Stage(layer_start=0, layer_end=MODEL.num_layers, replicas=replicas),),
    )


def test_the_data_split_is_part_of_the_layout() -> None:
    assert same_layout(_plan(None), _plan(None))
    assert same_layout(_plan((6, 2)), _plan((6, 2)))
    assert not same_layout(_plan((6, 2)), _plan((5, 3)))
