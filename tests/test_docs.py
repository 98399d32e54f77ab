"""The documentation cannot silently fall behind the code or the CI script.

The API reference is generated from the pydantic models (sailplan_dev.apidocs): every field
of every documented model must reach its table, the expected set being derived from the
models' own fields, not from the schema the generator walks. The nav must list every page,
and the README must stay short, link only to files that exist and state the install and test
commands .ci/run really runs. `mkdocs build --strict` in .ci/run checks links inside docs/.
"""

from __future__ import annotations

import re
import shlex
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from sailplan.operator.api import gpupool, trainingjob
from sailplan.planner import plan
from sailplan_dev import apidocs

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _unwrap(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """The models nested in a field's type, with the path suffix a list or map adds."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _unwrap(args[0])
    if origin in (typing.Union, types.UnionType):
        return [found for arg in args for found in _unwrap(arg)]
    if origin in (tuple, list):
        return [(f"[]{suffix}", model) for arg in args for suffix, model in _unwrap(arg)]
    if origin is dict:
        return [(f".<key>{suffix}", model) for suffix, model in _unwrap(args[1])]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    return []


def _field_paths(model: type[BaseModel], prefix: str) -> set[str]:
    """Every field below `model`, named as on the wire (its alias), depth first."""
    paths: set[str] = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}.{field.alias or name}" if prefix else (field.alias or name)
        paths.add(path)
        for suffix, nested in _unwrap(field.annotation):
            paths |= _field_paths(nested, f"{path}{suffix}")
    return paths


def _page(path: str) -> str:
    return next(page.markdown for page in apidocs.reference_pages() if page.path == path)


@pytest.mark.parametrize(
    ("model", "prefix", "page"),
    [
        (trainingjob.TrainingJobSpec, "spec", "reference/trainingjob.md"),
        (trainingjob.TrainingJobStatus, "status", "reference/trainingjob.md"),
        (gpupool.GPUPoolSpec, "spec", "reference/gpupool.md"),
        (gpupool.GPUPoolStatus, "status", "reference/gpupool.md"),
    ],
)
def test_crd_reference_has_a_row_for_every_model_field(
    model: type[BaseModel], prefix: str, page: str
) -> None:
    expected = _field_paths(model, prefix)
    rows = {row.path for row in apidocs.crd_rows(model, prefix)}
    assert expected - rows == set(), "fields missing from the generated reference"
    markdown = _page(page)
    assert [path for path in sorted(expected) if f"| `{path}` |" not in markdown] == []


def test_trainingjob_spec_reference_reaches_the_nested_policies() -> None:
    # Guards the derivation above: were it to stop descending, the test would pass vacuously.
    expected = _field_paths(trainingjob.TrainingJobSpec, "spec")
    assert {
        "spec.replan.horizonSeconds",
        "spec.checkpoint.storage.persistentVolumeClaim.claimName",
        "spec.model.custom.numKvHeads",
    } <= expected


def test_plan_reference_has_a_row_for_every_plan_field() -> None:
    expected = _field_paths(plan.Plan, "")
    assert "stages[].replicas[].gpu_type" in expected
    rows = {row.path for row in apidocs.plan_rows()}
    assert expected - rows == set()
    markdown = _page("reference/plan.md")
    assert [path for path in sorted(expected) if f"| `{path}` |" not in markdown] == []


def test_reference_table_cells_never_split_on_a_pipe_in_a_pattern() -> None:
    # PVC subPath's pattern `^[^/].*$|^$` holds a pipe: its row must keep six cells.
    markdown = _page("reference/trainingjob.md")
    row = next(line for line in markdown.splitlines() if "persistentVolumeClaim.subPath`" in line)
    unescaped_pipes = re.findall(r"(?<!\\)\|", row)
    assert len(unescaped_pipes) == 7


def _nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for entry in nav for page in _nav_pages(entry)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_has_a_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    written = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    generated = {page.path for page in apidocs.reference_pages()}
    assert len(nav) == len(set(nav)), "a page is listed twice"
    assert set(nav) == written | generated


README = ROOT / "README.md"
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) < 150


def test_readme_links_only_to_files_that_exist() -> None:
    targets = [
        target.split("#", 1)[0]
        for target in MARKDOWN_LINK.findall(README.read_text())
        if "://" not in target and not target.startswith("#")
    ]
    assert targets, "the README links into docs/"
    assert [target for target in targets if not (ROOT / target).exists()] == []


def test_readme_states_the_install_and_test_commands_of_ci() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    install = re.search(r"^python -m pip install -q (-e .*)$", ci, re.M)
    assert install is not None, ".ci/run no longer installs with `pip install -q -e ...`"
    assert ci.rstrip().splitlines()[-1] == "python -m pytest -q -n auto"
    expected = [
        "pip",
        "install",
        *shlex.split(install.group(1)),
        "&&",
        "python",
        "-m",
        "pytest",
        "-q",
        "-n",
        "auto",
    ]
    readme_commands = [
        shlex.split(line)
        for line in README.read_text().splitlines()
        if line.rstrip().endswith("python -m pytest -q -n auto")
    ]
    assert any(_contains(tokens, expected) for tokens in readme_commands), (
        "README must install what .ci/run installs, then run `python -m pytest -q -n auto`"
    )


def _contains(tokens: list[str], run: list[str]) -> bool:
    return any(tokens[i : i + len(run)] == run for i in range(len(tokens) - len(run) + 1))


def test_embedded_kubernetes_types_link_to_kubernetes_reference() -> None:
    # spec.podTemplateOverrides embeds core/v1 schemas (api.kubeschema): the reference names
    # the type and links to Kubernetes' own page instead of repeating its fields.
    markdown = _page("reference/trainingjob.md")
    row = next(
        line
        for line in markdown.splitlines()
        if line.startswith("| `spec.podTemplateOverrides.spec.tolerations` |")
    )
    assert f"list of [Toleration]({apidocs.KUBERNETES_REFERENCE}#toleration-v1-core)" in row
    assert "spec.podTemplateOverrides.spec.tolerations[].key" not in markdown
    assert "spec.podTemplateOverrides.spec.volumes[]." not in markdown
