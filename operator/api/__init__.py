"""The custom resources the operator serves: GPUPool and TrainingJob (sailplan.dev/v1alpha1).

The pydantic models here are the single source of truth: `sailplan crds` renders the CRD
YAML in crds/ from them (schema), the operator parses objects with them, and the pure
reconcile functions take and return them.
"""

from sailplan.operator.api.common import API_VERSION, GROUP, VERSION

__all__ = ["API_VERSION", "GROUP", "VERSION"]
