"""The API reference pages of the documentation site, generated from the pydantic models.

The models are the source of truth for the CRDs (sailplan.operator.api) and for the Plan
contract (sailplan.planner.plan), so the reference is rendered from them at every docs build
rather than written by hand: it cannot drift. The MkDocs hook docs/hooks/api_reference.py
calls `reference_pages()`; tests/test_docs.py checks that every model field reaches a table.

The CRD pages walk the structural schema the CRDs are built from (camelCase names, the API
server's bounds and CEL rules); the Plan page walks pydantic's JSON schema of the Plan.
"""

from __future__ import annotations

import html
import inspect
import json
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

from sailplan.operator.api import crd, gpupool, kubeschema, trainingjob
from sailplan.operator.api.schema import structural_schema
from sailplan.planner import plan

# The bounds a JSON schema node can carry, in the order a reader wants them.
_BOUND_WORDS: Final = (
    ("minLength", "length ≥ {}"),
    ("maxLength", "length ≤ {}"),
    ("minItems", "items ≥ {}"),
    ("maxItems", "items ≤ {}"),
    ("minProperties", "entries ≥ {}"),
    ("maxProperties", "entries ≤ {}"),
    ("format", "format {}"),
)


# Where an embedded core/v1 type's fields are documented (the pinned release's reference).
KUBERNETES_REFERENCE: Final = "https://kubernetes.io/docs/reference/generated/kubernetes-api/v1.36/"
_SCOPES: Final = {"Namespaced": "namespaced", "Cluster": "cluster-scoped"}

# Characters that Markdown or HTML would interpret inside a table cell.
_MARKUP: Final = frozenset("|*_[]()\\`<>&{}#+-.!~")


@dataclass(frozen=True)
class FieldRow:
    """One field of a reference table; `path` is dotted, `[]` marks list items."""

    path: str
    type: str
    required: bool
    default: str
    description: str
    constraints: str


@dataclass(frozen=True)
class ReferencePage:
    """A generated Markdown page and its path under docs/."""

    path: str
    markdown: str


def schema_rows(schema: dict[str, Any], prefix: str) -> list[FieldRow]:
    """Every field below `schema` (an object schema), depth first, in declaration order."""
    definitions = schema.get("$defs", {})
    rows: list[FieldRow] = []
    _walk_object(_resolved(schema, definitions), prefix, definitions, rows)
    return rows


def crd_rows(model: type[BaseModel], prefix: str) -> list[FieldRow]:
    """The rows of a CRD part (spec or status) as the API server sees it."""
    return schema_rows(structural_schema(model), prefix)


def plan_rows() -> list[FieldRow]:
    """The rows of the Plan document (the JSON in the plan ConfigMap)."""
    return schema_rows(plan.Plan.model_json_schema(mode="serialization"), "")


def reference_pages() -> list[ReferencePage]:
    """The pages under docs/reference/ that the docs build adds."""
    return [
        ReferencePage(
            "reference/trainingjob.md",
            _crd_page(
                crd.trainingjob_crd(),
                trainingjob.TrainingJob,
                trainingjob.TrainingJobSpec,
                trainingjob.TrainingJobStatus,
            ),
        ),
        ReferencePage(
            "reference/gpupool.md",
            _crd_page(
                crd.gpupool_crd(), gpupool.GPUPool, gpupool.GPUPoolSpec, gpupool.GPUPoolStatus
            ),
        ),
        ReferencePage("reference/plan.md", _plan_page()),
    ]


def render_table(rows: list[FieldRow]) -> str:
    """A Markdown table of `rows` (pipes inside cells escaped)."""
    lines = [
        "| field | type | required | default | description | constraints |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        cells = (
            f"`{row.path}`",
            row.type,
            "yes" if row.required else "",
            f"`{row.default}`" if row.default else "",
            html.escape(row.description, quote=False),
            row.constraints,
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def _crd_page(
    definition: dict[str, Any],
    model: type[BaseModel],
    spec: type[BaseModel],
    status: type[BaseModel],
) -> str:
    """A CRD's page: identity, `kubectl get` columns, object-level rules, spec and status."""
    names = definition["spec"]["names"]
    version = definition["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    short_names = ", ".join(f"`{name}`" for name in names.get("shortNames", ()))
    module_doc = inspect.getdoc(inspect.getmodule(model)) or ""
    columns = "\n".join(
        f"| {column['name']} | `{column['jsonPath']}` | {column['description']} |"
        + (" with `-o wide` |" if column.get("priority") else " always |")
        for column in version.get("additionalPrinterColumns", ())
    )
    rules = "".join(
        f"- {_cell(rule.get('message') or rule['rule'])}\n"
        for rule in root.get("x-kubernetes-validations", ())
    )
    return (
        f"# {names['kind']} reference\n\n"
        f"`{definition['spec']['group']}/{version['name']}`, {_SCOPES[definition['spec']['scope']]}, "
        f"short names {short_names}. Generated at docs build time from "
        f"`{spec.__module__}`; the CRD in `crds/` is rendered from the same models.\n\n"
        f"{_first_paragraph(module_doc)}\n\n"
        "## kubectl get\n\n"
        "| column | from | meaning | shown |\n| --- | --- | --- | --- |\n"
        f"{columns}\n\n"
        + (f"## Rules on the whole object\n\n{rules}\n" if rules else "")
        + "## spec\n\n"
        f"{render_table(crd_rows(spec, 'spec'))}\n"
        "## status\n\n"
        "Written by the operator only (through the status subresource).\n\n"
        f"{render_table(crd_rows(status, 'status'))}"
    )


def _plan_page() -> str:
    return (
        "# Plan reference\n\n"
        f"`apiVersion: {plan.PLAN_API_VERSION}`. Generated at docs build time from "
        "`sailplan.planner.plan.Plan`. The planner writes it, the operator stores it in the "
        "plan ConfigMap `<job>-plan-g<generation>`, and every worker reads it at "
        "`/etc/sailplan/plan/`.\n\n"
        f"{inspect.getdoc(plan)}\n\n"
        "## fields\n\n"
        f"{render_table(plan_rows())}"
    )


def _walk_object(
    node: dict[str, Any], prefix: str, definitions: dict[str, Any], rows: list[FieldRow]
) -> None:
    required = set(node.get("required", ()))
    for name, raw in node.get("properties", {}).items():
        field = _resolved(raw, definitions)
        path = f"{prefix}.{name}" if prefix else name
        embedded = _kubernetes_type(field)
        rows.append(
            FieldRow(
                path=path,
                type=embedded or _type_of(field, definitions),
                required=name in required,
                default=_default_of(raw, field),
                description=_description_of(raw, field),
                constraints=_constraints_of(field),
            )
        )
        if embedded is None:  # Kubernetes documents its own types' fields
            _walk_children(field, path, definitions, rows)


def _kubernetes_type(field: dict[str, Any]) -> str | None:
    """A link to Kubernetes' reference when `field` (or its items) is a core/v1 type the
    CRD embeds with Kubernetes' own schema (sailplan.operator.api.kubeschema)."""
    items = field.get("items")
    if field.get("type") == "array" and isinstance(items, dict):
        inner = _kubernetes_type(items)
        return f"list of {inner}" if inner else None
    name = kubeschema.kubernetes_type(field)
    return f"[{name}]({KUBERNETES_REFERENCE}#{name.lower()}-v1-core)" if name else None


def _walk_children(
    field: dict[str, Any], path: str, definitions: dict[str, Any], rows: list[FieldRow]
) -> None:
    if "properties" in field:
        _walk_object(field, path, definitions, rows)
        return
    items = field.get("items")
    if isinstance(items, dict):
        item = _resolved(items, definitions)
        if "properties" in item:
            _walk_object(item, f"{path}[]", definitions, rows)
    values = field.get("additionalProperties")
    if isinstance(values, dict):
        value = _resolved(values, definitions)
        if "properties" in value:
            _walk_object(value, f"{path}.<key>", definitions, rows)


def _resolved(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """`node` with `$ref` followed and an optional (`anyOf` with null) unwrapped."""
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolved(merged, definitions)
    options = node.get("anyOf")
    if options:
        not_null = [option for option in options if option.get("type") != "null"]
        if len(not_null) == 1 and len(not_null) < len(options):
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            return {**_resolved(not_null[0], definitions), **rest, "nullable": True}
    return node


def _type_of(field: dict[str, Any], definitions: dict[str, Any]) -> str:
    if field.get("x-kubernetes-int-or-string"):
        return "integer or string"
    options = field.get("anyOf")
    if options:
        return " or ".join(_type_of(_resolved(o, definitions), definitions) for o in options)
    kind = field.get("type", "any")
    if kind == "array" and isinstance(field.get("items"), dict):
        return f"list of {_type_of(_resolved(field['items'], definitions), definitions)}"
    if kind == "object" and isinstance(field.get("additionalProperties"), dict):
        value = _type_of(_resolved(field["additionalProperties"], definitions), definitions)
        return f"map of string to {value}"
    return str(kind)


def _default_of(raw: dict[str, Any], field: dict[str, Any]) -> str:
    for node in (raw, field):
        if "default" in node and node["default"] not in (None, {}, []):
            return _literal(node["default"])
    return ""


def _description_of(raw: dict[str, Any], field: dict[str, Any]) -> str:
    text = raw.get("description") or field.get("description") or ""
    return " ".join(str(text).split())


def _constraints_of(field: dict[str, Any]) -> str:
    parts: list[str] = []
    if "enum" in field:
        parts.append("one of " + ", ".join(f"`{_literal(v)}`" for v in field["enum"]))
    parts.extend(_numeric_bounds(field))
    parts.extend(template.format(field[key]) for key, template in _BOUND_WORDS if key in field)
    if "pattern" in field:
        parts.append(f"pattern {_code(field['pattern'])}")
    if field.get("nullable"):
        parts.append("may be null")
    for rule in field.get("x-kubernetes-validations", ()):
        if rule.get("rule") == "self == oldSelf":
            parts.append("immutable")
        else:
            parts.append(f"rule: {rule.get('message') or rule.get('rule')}")
    return "; ".join(parts)


def _numeric_bounds(field: dict[str, Any]) -> list[str]:
    bounds: list[str] = []
    # JSON Schema 2020 (pydantic) gives numeric exclusive bounds; OpenAPI v3 (the CRD)
    # gives `minimum` plus a boolean `exclusiveMinimum`.
    for key, strict, loose in (("minimum", ">", "≥"), ("maximum", "<", "≤")):
        exclusive_key = "exclusiveM" + key[1:]
        exclusive = field.get(exclusive_key)
        if isinstance(exclusive, bool) and key in field:
            bounds.append(f"{strict if exclusive else loose} {field[key]}")
        elif key in field:
            bounds.append(f"{loose} {field[key]}")
        elif isinstance(exclusive, int | float):
            bounds.append(f"{strict} {exclusive}")
    return bounds


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def _first_paragraph(text: str) -> str:
    return text.split("\n\n", 1)[0].replace("\n", " ")


def _code(text: str) -> str:
    """`text` as inline code that survives a table cell: a pipe would end the cell even in a
    code span (where a backslash escape shows literally), and regular expressions are full
    of characters Markdown would read as emphasis or links, so they become entities."""
    return "<code>" + "".join(f"&#{ord(c)};" if c in _MARKUP else c for c in text) + "</code>"


def _cell(text: str) -> str:
    # A pipe in plain text would end the cell of a Markdown table.
    return text.replace("|", "\\|").replace("\n", " ")
