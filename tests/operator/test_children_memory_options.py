"""Worker pods of an offloaded stage ask for the host memory its optimizer state takes."""

from __future__ import annotations

from collections.abc import Callable

from sailplan.operator.api.gpupool import GPUPool
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.children import desired_children
from sailplan.planner.plan import Plan, Predictions, StagePrediction

HOST = 3 * 2**30  # the plan's predicted host memory per GPU of the offloaded stage


def _offloaded(plan: Plan) -> Plan:
    stages = (plan.stages[0], plan.stages[1].model_copy(update={"optimizer_offload": True}))
    predictions = Predictions(
        iteration_seconds=1.0,
        samples_per_second=1.0,
        stages=(
            StagePrediction(forward_backward_seconds=0.1, peak_memory_bytes=2**30),
            StagePrediction(
                forward_backward_seconds=0.1, peak_memory_bytes=2**30, host_memory_bytes=HOST
            ),
        ),
        usd_per_iteration=0.0,
        usd_per_hour=0.0,
        egress_bytes_per_iteration=0.0,
    )
    return plan.model_copy(update={"stages": stages, "predictions": predictions})


def test_offloaded_workers_get_the_host_memory_on_top_of_the_trainer_memory(
    make_job: Callable[..., TrainingJob], plan: Plan, pools: tuple[GPUPool, ...]
) -> None:
    job = make_job()
    assert job.spec.trainer.memory == "16Gi"
    offloaded = _offloaded(plan)
    children = desired_children(job, offloaded, 3, 0, {p.name: p for p in pools})
    for pod, worker in zip(children.pods, offloaded.workers(), strict=True):
        resources = pod["spec"]["containers"][0]["resources"]
        expected = "16Gi"
        if worker.stage == 1:
            # 16 GiB plus the offloaded state of each of the worker's GPUs, in bytes
            expected = str(16 * 2**30 + HOST * worker.tensor_parallel)
        assert resources["requests"]["memory"] == resources["limits"]["memory"] == expected
