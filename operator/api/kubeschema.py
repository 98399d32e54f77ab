"""Kubernetes' own OpenAPI schemas for the core/v1 types a TrainingJob embeds.

spec.podTemplateOverrides takes tolerations, affinity, volumes, env, security contexts and
resources exactly as a Pod does. Rather than re-describe those types (and drift from
Kubernetes), the CRD carries Kubernetes' published schemas: `data/kubernetes-core-v1.json`
holds the definitions those types need, copied unchanged from the OpenAPI v3 document of
the pinned Kubernetes release (k8s.io/kubernetes api/openapi-spec/v3/api__v1_openapi.json;
`python -m sailplan.operator.api.kubeschema SPEC.json` rewrites it). `schema(name)` turns
one definition into a structural schema the CRD generator (api.schema) passes through:
references inlined, `allOf` wrappers dropped, merge-strategy hints and server defaults
left out (they are the Pod API's business, not the CRD's), Quantity as int-or-string, and
descriptions cut to their first sentence (so the CRD stays well under the 256 KiB that a
client-side `kubectl apply` can record). ObjectMeta inside an ephemeral
volume's claim template is the one place kept open (x-kubernetes-preserve-unknown-fields):
its full schema is large and the API server validates it again when the claim is made.

Called by api.trainingjob (the override models) at import time.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path
from typing import Any, Final

DATA: Final = Path(__file__).with_name("data") / "kubernetes-core-v1.json"
SOURCE: Final = "k8s.io/kubernetes v1.36.3 api/openapi-spec/v3/api__v1_openapi.json"
CORE: Final = "io.k8s.api.core.v1."
# The types spec.podTemplateOverrides embeds; the data file holds their closure.
ROOTS: Final = (
    "Affinity",
    "EnvFromSource",
    "EnvVar",
    "LocalObjectReference",
    "PodSecurityContext",
    "ResourceRequirements",
    "SecurityContext",
    "Toleration",
    "Volume",
    "VolumeMount",
)
_REF_PREFIX: Final = "#/components/schemas/"
_QUANTITY: Final = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_OBJECT_META: Final = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_TIME: Final = "io.k8s.apimachinery.pkg.apis.meta.v1.Time"
QUANTITY_PATTERN: Final = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
# Kept as they are; everything else is a hint for the Pod API (patch strategies, unions,
# discriminators) or a server-side default, and left out.
_KEPT: Final = frozenset(
    {
        "type",
        "format",
        "enum",
        "required",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
    }
)


@functools.cache
def _definitions() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DATA.read_text())["definitions"]
    return loaded


def schema(name: str) -> dict[str, Any]:
    """The structural schema of core/v1 `name` (e.g. "Toleration"), fresh for each caller."""
    return _translate({"$ref": _REF_PREFIX + CORE + name}, _definitions(), ())


# What a field adds to an embedded type's schema (its own words, optionality, our rules).
_FIELD_KEYS: Final = frozenset({"description", "nullable", "x-kubernetes-validations"})


def _bare(node: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in node.items() if key not in _FIELD_KEYS}


@functools.cache
def _bare_roots() -> tuple[tuple[str, str], ...]:
    return tuple((json.dumps(_bare(schema(root)), sort_keys=True), root) for root in ROOTS)


def kubernetes_type(node: dict[str, Any]) -> str | None:
    """The core/v1 type (one of ROOTS) whose schema `node` is, or None. The API reference
    (sailplan_dev.apidocs) names such a field's type and links to Kubernetes' reference
    instead of listing the type's fields again."""
    bare = json.dumps(_bare(node), sort_keys=True)
    return next((root for text, root in _bare_roots() if text == bare), None)


def _first_sentence(text: str) -> str:
    paragraph = text.strip().split("\n\n")[0]
    match = re.match(r"(.+?\.)(\s|$)", paragraph, re.DOTALL)
    return (match.group(1) if match else paragraph).replace("\n", " ")


def _translate(
    node: dict[str, Any], definitions: dict[str, Any], seen: tuple[str, ...]
) -> dict[str, Any]:
    description = node.get("description")
    if "$ref" in node or "allOf" in node:
        ref = node["$ref"] if "$ref" in node else node["allOf"][0]["$ref"]
        target = _resolve(ref, definitions, seen)
        if description:
            target["description"] = _first_sentence(description)
        return target
    out: dict[str, Any] = {key: value for key, value in node.items() if key in _KEPT}
    if description:
        out["description"] = _first_sentence(description)
    if "properties" in node:
        out["properties"] = {
            name: _translate(child, definitions, seen) for name, child in node["properties"].items()
        }
    if "items" in node:
        out["items"] = _translate(node["items"], definitions, seen)
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _translate(node["additionalProperties"], definitions, seen)
    if out.get("format") not in (None, "int32", "int64", "double", "byte"):
        del out["format"]
    return out


def _resolve(ref: str, definitions: dict[str, Any], seen: tuple[str, ...]) -> dict[str, Any]:
    name = ref.removeprefix(_REF_PREFIX)
    if name == _QUANTITY:
        return {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
        }
    if name == _OBJECT_META:
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    if name == _TIME:
        return {"type": "string", "format": "date-time"}
    if name in seen:
        raise ValueError(f"{name} refers to itself; a structural schema cannot")
    if name not in definitions:
        raise KeyError(f"{name} is missing from {DATA.name}: regenerate it")
    return _translate(definitions[name], definitions, (*seen, name))


def closure(upstream: dict[str, Any]) -> dict[str, Any]:
    """The definitions of `upstream` (an OpenAPI v3 document) that ROOTS need."""
    schemas: dict[str, Any] = upstream["components"]["schemas"]
    found: dict[str, Any] = {}
    stack = [CORE + root for root in ROOTS]
    while stack:
        name = stack.pop()
        if name in found or name in (_QUANTITY, _OBJECT_META, _TIME):
            continue
        found[name] = schemas[name]
        stack.extend(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(schemas[name])))
    return dict(sorted(found.items()))


def main(argv: list[str]) -> int:
    """Rewrite the data file from the upstream OpenAPI v3 document named in argv[1]."""
    if len(argv) != 2:
        print(f"usage: python -m sailplan.operator.api.kubeschema <{SOURCE}>", file=sys.stderr)
        return 2
    upstream = json.loads(Path(argv[1]).read_text())
    body = {"source": SOURCE, "definitions": closure(upstream)}
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
