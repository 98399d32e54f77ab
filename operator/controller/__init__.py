"""The operator's controller: the Kopf wiring and the I/O around the pure reconcile.

One module per job: `config` (what `sailplan operator run` configures), `queue` (the
per-job work queue and the coalescing runner), `observation` (reading a job and what
surrounds it from the API server into the reconcile's `Observed`), `apply` (writing an
`Outcome` back), `runtime` (what the handlers share: the reconcile pass, GPUPool status
refresh, background tasks) and `registration` (the Kopf registry: indices, event handlers,
startup/cleanup, login). The CLI (`sailplan operator run`) imports the two names below.
"""

from sailplan.operator.controller.config import OperatorConfig
from sailplan.operator.controller.registration import build_registry

__all__ = ["OperatorConfig", "build_registry"]
