"""Runs the Argo CD health checks of manifests/argocd in a real Lua interpreter (lupa), as
Argo CD runs them: the object in the global `obj`, a table with `status` and `message`
back. Used by test_argocd_health.py (hand-written status objects) and by the cluster tests
that read real TrainingJobs and GPUPools back from the API server (test_operator_cluster.py,
test_autoscaled_pools_bad_input_cluster.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

ARGOCD = Path(__file__).resolve().parents[2] / "manifests" / "argocd"
SCRIPTS = {"TrainingJob": "trainingjob-health.lua", "GPUPool": "gpupool-health.lua"}


def health(obj: Mapping[str, Any], script: str | None = None) -> tuple[str, str]:
    """(status, message) the health check of `obj`'s kind (or `script`) gives it."""
    lupa = pytest.importorskip("lupa")
    runtime = lupa.LuaRuntime(unpack_returned_tuples=True)

    def table(value: Any) -> Any:
        if isinstance(value, Mapping):
            return runtime.table_from({k: table(v) for k, v in value.items()})
        if isinstance(value, list):
            return runtime.table_from([table(v) for v in value])
        return value

    runtime.globals().obj = table(obj)
    result = runtime.execute((ARGOCD / (script or SCRIPTS[obj["kind"]])).read_text())
    return str(result["status"]), str(result["message"])
