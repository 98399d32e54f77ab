"""Both CRDs serve v1beta1 (stored) and the deprecated v1alpha1 with conversion strategy None,
which is only sound while the two versions' specs are the same schema: checked here, so a
spec change made to one version only fails before it reaches a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sailplan.operator.api import crd
from sailplan.operator.api.common import LEGACY_VERSION, VERSION

# kubectl's client-side apply keeps the whole object in an annotation of at most 256 KiB.
LAST_APPLIED_LIMIT = 262144


def _versions(definition: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in definition["spec"]["versions"]}


@pytest.mark.parametrize("definition", crd.all_crds(), ids=lambda d: d["spec"]["names"]["kind"])
def test_v1beta1_is_stored_and_v1alpha1_still_served_deprecated(
    definition: dict[str, Any],
) -> None:
    versions = _versions(definition)
    assert set(versions) == {VERSION, LEGACY_VERSION} == {"v1beta1", "v1alpha1"}
    assert [v["name"] for v in definition["spec"]["versions"] if v["storage"]] == ["v1beta1"]
    assert definition["spec"]["versions"][0]["name"] == "v1beta1"
    assert all(v["served"] for v in versions.values())
    assert versions["v1alpha1"]["deprecated"] is True
    assert "v1beta1" in versions["v1alpha1"]["deprecationWarning"]
    assert "deprecated" not in versions["v1beta1"]
    assert definition["spec"]["conversion"] == {"strategy": "None"}


@pytest.mark.parametrize("definition", crd.all_crds(), ids=lambda d: d["spec"]["names"]["kind"])
def test_versions_share_spec_schema_columns_and_subresources(definition: dict[str, Any]) -> None:
    new, old = (_versions(definition)[v] for v in ("v1beta1", "v1alpha1"))
    new_root, old_root = (v["schema"]["openAPIV3Schema"] for v in (new, old))
    assert new_root["properties"]["spec"] == old_root["properties"]["spec"]
    assert new_root.get("x-kubernetes-validations") == old_root.get("x-kubernetes-validations")
    assert new["additionalPrinterColumns"] == old["additionalPrinterColumns"]
    assert new["subresources"] == old["subresources"]
    # Every status field of v1beta1 is in v1alpha1 with the same schema (v1alpha1 may list
    # more: fields moved out of the status, kept readable for the migration).
    new_status = new_root["properties"]["status"]["properties"]
    old_status = old_root["properties"]["status"]["properties"]
    assert {k: old_status[k] for k in new_status} == new_status


@pytest.mark.parametrize("definition", crd.all_crds(), ids=lambda d: d["spec"]["names"]["kind"])
def test_crd_fits_kubectl_client_side_apply(definition: dict[str, Any]) -> None:
    size = len(json.dumps(definition, separators=(",", ":")))
    assert size < LAST_APPLIED_LIMIT, f"{size} bytes: kubectl apply (client side) refuses it"
