"""The RBAC table of docs/operations.md grants exactly what the operator's ClusterRole
(manifests/base/rbac.yaml) grants: every (resource, verb) pair the role has is explained in
the table, and the table claims none the role lacks. The role is what the cluster tests run
the operator under, so this keeps the page an operator's reviewer reads true."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BACKTICKED = re.compile(r"`([^`]+)`")


def _role_grants() -> set[tuple[str, str]]:
    documents = yaml.safe_load_all((ROOT / "manifests" / "base" / "rbac.yaml").read_text())
    role = next(d for d in documents if d["kind"] == "ClusterRole")
    return {
        (resource, verb)
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _table_grants() -> set[tuple[str, str]]:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## RBAC\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "no RBAC table under ## RBAC in docs/operations.md"
    grants: set[tuple[str, str]] = set()
    for row in rows:
        resources_cell, verbs_cell = row.split("|")[1:3]
        # Only the names before a parenthesis are resources: "(only `x.sailplan.dev`)" and
        # "(batch)" qualify them.
        resources = BACKTICKED.findall(resources_cell.split("(")[0])
        for part in verbs_cell.split(";"):
            # "`patch` on `/status`": a verb on a subresource of the row's resources.
            on = re.fullmatch(r"\s*`(\w+)` on `(/\w+)`\s*", part)
            if on is not None:
                grants |= {(r + on.group(2), on.group(1)) for r in resources}
                continue
            grants |= {(r, v.strip()) for r in resources for v in part.split(",") if v.strip()}
    return grants


def test_the_rbac_table_is_exactly_the_cluster_role() -> None:
    role, table = _role_grants(), _table_grants()
    assert role - table == set(), "granted but not documented"
    assert table - role == set(), "documented but not granted"


def test_the_rbac_prose_names_every_resource_the_role_may_patch() -> None:
    patched = {resource for resource, verb in _role_grants() if verb == "patch"}
    text = (ROOT / "docs" / "operations.md").read_text()
    prose = text.split("\n## RBAC\n", 1)[1].split("| resource |", 1)[0]
    # The paragraph says which kinds of object the operator may patch, in words.
    words = {
        "trainingjobs/status": "status",
        "gpupools/status": "status",
        "customresourcedefinitions/status": "status",
        "pods": "pods",
        "jobs": "Jobs",
        "workloads": "Kueue Workloads",
    }
    assert patched <= words.keys(), f"a patch grant the prose has no word for: {patched}"
    assert all(words[resource] in prose for resource in patched)
