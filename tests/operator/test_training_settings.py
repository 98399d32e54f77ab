"""spec.training.precision and zeroStage reach the planner (how it prices each GPU's
memory) and the trainer (what it runs)."""

from __future__ import annotations

from typing import Any

import pytest
from operator_builders import JOB_SPEC, pool
from pydantic import ValidationError

from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.reconcile.children import trainer_config
from sailplan.operator.replan.decision import plan_request
from sailplan.operator.replan.triggers import capacity_snapshot
from sailplan.planner.catalog import default_catalog


def job(**training: Any) -> TrainingJob:
    spec = JOB_SPEC | {"training": JOB_SPEC["training"] | training}
    return TrainingJob.model_validate({"name": "opt", "namespace": "ns", "spec": spec})


def request(**training: Any) -> Any:
    cluster = capacity_snapshot([pool("a100", "a100-ondemand", {"us-central1-a": 2})], [], {})
    return plan_request(job(**training), default_catalog().model("OPT-350M"), cluster)


def test_defaults_plan_fp32_at_zero_stage_1_as_the_trainer_runs() -> None:
    assert (request().precision, request().zero_stage) == ("fp32", 1)
    assert trainer_config(job()).zero_stage == 1


def test_mixed_precision_means_auto_unless_precision_says_otherwise() -> None:
    assert request(mixedPrecision=True).precision == "auto"
    assert request(mixedPrecision=True, precision="fp16").precision == "fp16"
    assert request(precision="bf16", zeroStage=2).zero_stage == 2
    assert trainer_config(job(zeroStage=2)).zero_stage == 2


def test_a_zero_stage_the_trainer_lacks_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"zero_stage|zeroStage"):
        job(zeroStage=3)
    with pytest.raises(ValidationError, match="precision"):
        job(precision="fp8")
