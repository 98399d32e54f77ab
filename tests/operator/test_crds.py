"""The CRDs in crds/ are generated from the pydantic models, structural, and validating."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from sailplan.operator.api import crd
from sailplan.operator.api.schema import SchemaTranslationError, structural_schema, walk

ROOT = Path(__file__).resolve().parents[2]


def _root_schema(definition: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    return dict(walk(schema))[path]


def test_crds_directory_matches_the_models() -> None:
    expected = crd.rendered_files()
    on_disk = {p.name: p.read_text() for p in (ROOT / "crds").iterdir() if p.is_file()}
    assert on_disk == expected, "crds/ drifted from the models: run `sailplan crds -o crds`"


@pytest.mark.parametrize("definition", crd.all_crds(), ids=lambda d: d["spec"]["names"]["kind"])
def test_schema_is_structural(definition: dict[str, Any]) -> None:
    schema = _root_schema(definition)
    for path, node in walk(schema):
        assert "$ref" not in node, path
        assert "additionalProperties" not in node or isinstance(
            node["additionalProperties"], dict
        ), path
        assert "uniqueItems" not in node, path  # forbidden in CRD schemas
        if "anyOf" in node:
            # The only anyOf Kubernetes accepts at a typed position: int-or-string.
            assert node.get("x-kubernetes-int-or-string") is True, path
        else:
            assert "type" in node, f"untyped node at {path}"
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def test_trainingjob_validation_keywords() -> None:
    schema = _root_schema(crd.trainingjob_crd())
    spec = _node(schema, ".spec")
    assert set(spec["required"]) == {"model", "training", "trainer", "checkpoint"}
    assert _node(schema, ".spec.training.globalBatchSize")["minimum"] == 1
    assert _node(schema, ".spec.objective.kind")["enum"] == ["Throughput", "Cost", "Energy"]
    assert [r["rule"] for r in _node(schema, ".spec.objective")["x-kubernetes-validations"]] == [
        # has(self.kind) first: the API server also checks the rule on the default ({}), which
        # has no kind yet, and refuses the CRD if the rule cannot evaluate there
        "!has(self.kind) || self.kind != 'Energy' || has(self.minSamplesPerSecond)"
    ]
    assert _node(schema, ".spec.energy.clocks")["enum"] == ["Default", "NoSlowdown"]
    assert _node(schema, ".spec.energy")["default"] == {}
    assert _node(schema, ".spec.profiling.mode")["enum"] == ["Auto", "Skip", "Required"]
    learning_rate = _node(schema, ".spec.training.learningRate")
    assert (learning_rate["minimum"], learning_rate["exclusiveMinimum"]) == (0, True)
    assert _node(schema, ".spec.model.name")["maxLength"] == 63
    claim = _node(schema, ".spec.checkpoint.storage.persistentVolumeClaim.claimName")
    assert claim["pattern"].startswith("^[a-z0-9]")
    cpu = _node(schema, ".spec.trainer.cpu")
    assert cpu["x-kubernetes-int-or-string"] is True and "pattern" in cpu
    # Optional fields are nullable instead of anyOf-with-null.
    assert _node(schema, ".spec.objective.maxUsdPerHour")["nullable"] is True
    # Nested defaults are {} so the API server fills each field's own default.
    assert _node(schema, ".spec.failure")["default"] == {}
    assert _node(schema, ".spec.failure.maxRestarts")["default"] == 3


def test_per_job_replan_and_failure_settings_are_bounded_optional_integers() -> None:
    schema = _root_schema(crd.trainingjob_crd())
    bounds = {
        ".spec.replan.horizonSeconds": (60, 30 * 86400),
        ".spec.replan.drainTimeoutSeconds": (10, 86400),
        ".spec.replan.checkpointBandwidthBytesPerSecond": (10**6, 10**13),
        ".spec.failure.backoffSeconds": (1, 3600),
        ".spec.failure.maxBackoffSeconds": (1, 86400),
    }
    for path, (low, high) in bounds.items():
        node = _node(schema, path)
        assert (node["type"], node["minimum"], node["maximum"]) == ("integer", low, high), path
        # No default in the schema: absent must stay absent so the operator's default applies
        # (a CRD default would freeze today's value into every stored object).
        assert node["nullable"] is True and "default" not in node, path
        assert "Unset:" in node["description"], path
    assert "21600" in _node(schema, ".spec.replan.horizonSeconds")["description"]
    assert "600" in _node(schema, ".spec.failure.maxBackoffSeconds")["description"]
    (rule,) = _node(schema, ".spec.failure")["x-kubernetes-validations"]
    assert rule["rule"] == (
        "!has(self.backoffSeconds) || !has(self.maxBackoffSeconds) "
        "|| self.maxBackoffSeconds >= self.backoffSeconds"
    )


def test_trainingjob_cel_rules() -> None:
    schema = _root_schema(crd.trainingjob_crd())
    rules = {
        path: [r["rule"] for r in node.get("x-kubernetes-validations", [])]
        for path, node in walk(schema)
        if node.get("x-kubernetes-validations")
    }
    assert "self == oldSelf" in rules[".spec.model"]  # immutable model
    assert "has(self.name) != has(self.custom)" in rules[".spec.model"]
    assert "self == oldSelf" in rules[".spec.checkpoint.storage"]  # immutable storage
    assert "has(self.persistentVolumeClaim) != has(self.uri)" in rules[".spec.checkpoint.storage"]
    assert any("self.metadata.name" in r for r in rules[""])
    # Interval may change: no immutability rule on the checkpoint object itself.
    assert ".spec.checkpoint" not in rules


def test_gpupool_crd_shape() -> None:
    definition = crd.gpupool_crd()
    assert definition["spec"]["scope"] == "Cluster"
    version = definition["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    schema = _root_schema(definition)
    rules = [r["rule"] for r in _node(schema, ".spec")["x-kubernetes-validations"]]
    assert rules == ["has(self.nodePool) != has(self.selector)"]
    conditions = _node(schema, ".status.conditions")
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["GPU"] == ".status.gpuType"
    energy_price = _node(schema, ".spec.pricing.energyUsdPerKwh")
    assert (energy_price["minimum"], energy_price["nullable"]) == (0, True)
    assert columns["In-Use"] == ".status.gpusInUse"


def test_trainingjob_printer_columns_and_status() -> None:
    definition = crd.trainingjob_crd()
    assert definition["spec"]["scope"] == "Namespaced"
    version = definition["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    for name, path in {
        "Phase": ".status.phase",
        "Model": ".status.model",
        "GPUs": ".status.plan.gpus",
        "Samples/s": ".status.progress.samplesPerSecond",
        "Plan": ".status.plan.generation",
        "Age": ".metadata.creationTimestamp",
    }.items():
        assert columns[name] == path
    # Every printer column points at a field the schema defines.
    schema = _root_schema(definition)
    paths = dict(walk(schema))
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"].startswith(".status"):
            assert column["jsonPath"] in paths, column


def test_translator_rejects_unions_and_fixed_tuples() -> None:
    class Union(BaseModel):
        value: int | str

    class Pair(BaseModel):
        value: tuple[int, str]

    with pytest.raises(SchemaTranslationError, match="union"):
        structural_schema(Union)
    with pytest.raises(SchemaTranslationError, match="tuple"):
        structural_schema(Pair)


def test_translator_inlines_refs_and_keeps_field_rules() -> None:
    class Inner(BaseModel):
        size: int = Field(gt=2, le=10)

    class Outer(BaseModel):
        inner: Inner = Field(
            description="kept", json_schema_extra={"x-kubernetes-validations": [{"rule": "r"}]}
        )
        maybe: Inner | None = None

    schema = structural_schema(Outer)
    inner = schema["properties"]["inner"]
    assert inner["properties"]["size"] == {
        "type": "integer",
        "minimum": 2,
        "exclusiveMinimum": True,
        "maximum": 10,
    }
    assert inner["description"] == "kept"
    assert inner["x-kubernetes-validations"] == [{"rule": "r"}]
    assert schema["properties"]["maybe"]["nullable"] is True
    assert "title" not in yaml.safe_dump(schema)


def test_crds_command_writes_the_rendered_files_and_bad_input_exits_2(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from sailplan.operator.cli.operator_commands import register

    app = typer.Typer()
    register(app)
    runner = CliRunner()
    written = runner.invoke(app, ["crds", "-o", str(tmp_path)])
    assert written.exit_code == 0, written.output
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == crd.rendered_files()
    missing = runner.invoke(app, ["operator", "run", "--kubeconfig", str(tmp_path / "nope")])
    assert missing.exit_code == 2
    assert "no kubeconfig at" in missing.output
    assert "Traceback" not in missing.output
