"""Translate a pydantic model's JSON schema into a Kubernetes structural OpenAPI v3 schema.

pydantic emits JSON Schema 2020-12: `$ref`/`$defs`, `anyOf` with `{"type": "null"}` for
optionals, numeric `exclusiveMinimum`, `additionalProperties: false`, titles. The API server
wants a structural schema: everything inlined, every node typed, `nullable` instead of a
null branch, boolean `exclusiveMinimum` beside `minimum`, no `additionalProperties: false`.
This module does that translation and refuses what it cannot express faithfully (a real
union, a fixed-length tuple), so a model change that would silently weaken validation
fails `sailplan crds` instead. Called by crd.py; tests walk the result for leftovers.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

# Keywords copied unchanged (OpenAPI v3 and the Kubernetes extensions).
_PASSTHROUGH = frozenset(
    {
        "type",
        "description",
        "enum",
        "pattern",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "minimum",
        "maximum",
        "multipleOf",
        "required",
        "x-kubernetes-validations",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
    }
)
# Keywords dropped: documentation-only in JSON Schema, or implied by the structural form.
_DROPPED = frozenset({"title", "examples", "$defs"})
# `format` values the API server understands (k8s.io/kube-openapi strfmt); others are dropped.
_FORMATS = frozenset({"int32", "int64", "float", "double", "byte", "date", "date-time"})


class SchemaTranslationError(ValueError):
    """The model uses a construct a structural schema cannot express."""


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of `model` (camelCase property names)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.get("$defs", {})
    return _translate(raw, definitions, path=model.__name__)


def _resolve(ref: str, definitions: dict[str, Any], path: str) -> dict[str, Any]:
    prefix = "#/$defs/"
    if not ref.startswith(prefix) or ref[len(prefix) :] not in definitions:
        raise SchemaTranslationError(f"{path}: cannot resolve {ref}")
    resolved: dict[str, Any] = definitions[ref[len(prefix) :]]
    return resolved


def _translate(node: dict[str, Any], definitions: dict[str, Any], path: str) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        # Siblings of $ref (description, default, field-level CEL rules) refine the target.
        target = _translate(_resolve(node.pop("$ref"), definitions, path), definitions, path)
        siblings = _translate(node, definitions, path) if node else {}
        return _merge(target, siblings)

    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        branches = node.pop("anyOf")
        non_null = [b for b in branches if b != {"type": "null"}]
        if len(non_null) != 1:
            raise SchemaTranslationError(
                f"{path}: a union of {len(non_null)} types has no structural form; "
                "use one type (optionally nullable)"
            )
        inner = _translate(non_null[0], definitions, path)
        outer = _translate(node, definitions, path)
        merged = _merge(inner, outer)
        if len(non_null) < len(branches):
            merged["nullable"] = True
        return merged

    if "prefixItems" in node:
        raise SchemaTranslationError(f"{path}: fixed-length tuples have no structural form")
    if "allOf" in node or "oneOf" in node:
        raise SchemaTranslationError(f"{path}: allOf/oneOf are not translated; use CEL rules")

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        # anyOf survives only for int-or-string, the one form Kubernetes allows here.
        if key in _PASSTHROUGH or key == "anyOf":
            out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key == "format":
            if value in _FORMATS:
                out[key] = value
        elif key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum":
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        elif key == "properties":
            out[key] = {
                name: _translate(child, definitions, f"{path}.{name}")
                for name, child in value.items()
            }
        elif key == "items":
            out[key] = _translate(value, definitions, f"{path}[]")
        elif key == "additionalProperties":
            # `false` (extra="forbid") is what pruning does anyway; a schema means a map.
            if isinstance(value, dict):
                out[key] = _translate(value, definitions, f"{path}{{}}")
        elif key == "default":
            if value is None:
                continue
            # An object default of {} lets the API server apply each field's own default;
            # copying pydantic's fully expanded default would duplicate them (and drift).
            out[key] = {} if isinstance(value, dict) else value
        else:
            raise SchemaTranslationError(f"{path}: JSON schema keyword {key!r} not handled")

    if "const" in node and "type" not in out:
        out["type"] = _json_type(node["const"], path)
    if "enum" in out and "type" not in out:
        out["type"] = _json_type(out["enum"][0], path)
    if "properties" in out or "additionalProperties" in out:
        out.setdefault("type", "object")
    if "type" not in out and not out.get("x-kubernetes-int-or-string") and _is_value_node(out):
        raise SchemaTranslationError(f"{path}: schema node without a type")
    return out


def _is_value_node(node: dict[str, Any]) -> bool:
    # A node that only refines (description, CEL rules, default) is merged into a typed one.
    refinements = {"description", "default", "x-kubernetes-validations", "nullable"}
    return not set(node) <= refinements


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if key == "x-kubernetes-validations":
            merged[key] = [*merged.get(key, []), *value]
        else:
            merged[key] = value
    return merged


def _json_type(value: object, path: str) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    raise SchemaTranslationError(f"{path}: cannot type constant {value!r}")


def walk(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every node of a translated schema with its path (used by tests and crd.py checks)."""
    nodes: list[tuple[str, dict[str, Any]]] = []

    def visit(node: dict[str, Any], path: str) -> None:
        nodes.append((path, node))
        for name, child in node.get("properties", {}).items():
            visit(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            visit(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            visit(node["additionalProperties"], f"{path}{{}}")

    visit(schema, "")
    return nodes
