"""The custom resources the operator serves: GPUPool and TrainingJob (sailplan.dev/v1beta1,
and the deprecated v1alpha1 with the same spec: docs/reference/api-versions.md).

The pydantic models here are the single source of truth: `sailplan crds` renders the CRD
YAML in crds/ from them (schema), the operator parses objects with them, and the pure
reconcile functions take and return them.
"""

from sailplan.operator.api.common import API_VERSION, GROUP, LEGACY_VERSION, VERSION

__all__ = ["API_VERSION", "GROUP", "LEGACY_VERSION", "VERSION"]
