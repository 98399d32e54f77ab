"""Pieces shared by both custom resources: group/version, the model base, conditions.

Kubernetes objects are camelCase; Python is snake_case. `KubeModel` maps one to the other
with aliases so the same model parses an object from the API server, renders the CRD schema
and serializes a status patch. Condition types and reasons are named constants so the
reconcile code, the tests and the docs cannot drift apart on spelling.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

GROUP: Final = "sailplan.dev"
# The version the operator reads, writes and watches, and the CRDs' storage version.
VERSION: Final = "v1beta1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
# Still served (deprecated) so manifests written for it keep applying; the same spec, so the
# CRDs convert with strategy None (docs/reference/api-versions.md says why).
LEGACY_VERSION: Final = "v1alpha1"

# Kubernetes' own regular expressions (apimachinery validation), so the API server rejects
# what the kubelet or the scheduler would reject later.
DNS1123_LABEL: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUANTITY: Final = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"


class KubeModel(BaseModel):
    """Base of every CRD model: camelCase on the wire, strict about unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    def to_kube(self) -> dict[str, Any]:
        """The JSON-ready dict the API server expects (camelCase, no unset optionals)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class StatusModel(KubeModel):
    """Status is written by the operator and read back: tolerate fields of newer versions."""

    model_config = ConfigDict(extra="ignore")


def _quantity_to_str(value: object) -> object:
    # YAML `cpu: 4` arrives as an int; Kubernetes quantities are strings.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_quantity_to_str),
    Field(pattern=QUANTITY, max_length=64),
    # The same shape Kubernetes uses for resource.Quantity in its own OpenAPI schema.
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY,
        }
    ),
]


class LabelSelector(KubeModel):
    """The matchLabels part of a metav1.LabelSelector (equality only, all must match)."""

    match_labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        min_length=1, description="label key -> value; a node must carry all of them"
    )

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.match_labels.items())


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(StatusModel):
    """metav1.Condition: one aspect of the object's state, with a machine-readable reason."""

    type: str = Field(max_length=316)
    status: ConditionStatus
    reason: str = Field(max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: datetime | None = None
    observed_generation: int | None = Field(default=None, ge=0)


# Conditions form a map keyed by type (as metav1.Condition lists do), so server-side apply
# and strategic merges treat each type as one entry.
Conditions = Annotated[
    tuple[Condition, ...],
    Field(
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
        max_length=32,
    ),
]


def set_condition(
    conditions: tuple[Condition, ...], new: Condition, now: datetime
) -> tuple[Condition, ...]:
    """Replace the condition of `new.type`, keeping its transition time if status is unchanged.

    lastTransitionTime means "when status last flipped", not "when we last looked", so an
    unchanged status keeps the old time and a status patch stays a no-op.
    """
    previous = next((c for c in conditions if c.type == new.type), None)
    keep_time = previous is not None and previous.status == new.status
    stamped = new.model_copy(
        update={
            "last_transition_time": (
                previous.last_transition_time if keep_time and previous else now
            )
        }
    )
    others = tuple(c for c in conditions if c.type != new.type)
    return tuple(sorted((*others, stamped), key=lambda c: c.type))


def find_condition(conditions: tuple[Condition, ...], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)
