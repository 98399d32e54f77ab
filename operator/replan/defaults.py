"""The operator-wide replan and failure defaults, in one place.

A TrainingJob may override each of them (spec.replan, spec.failure); an unset field means
the value here. ReplanConfig and RestartCostModel take their defaults from these constants
and the CRD field descriptions (api/trainingjob.py) quote them, so the default a user reads
in `kubectl explain` is the one the operator applies. Plain numbers only: the API models
import this module, and it must not import them back.
"""

from __future__ import annotations

from typing import Final

# A plan is trusted for about this long when a voluntary switch weighs its gain against the
# restart: predictions further out are worth little (cluster and prices change).
HORIZON_SECONDS: Final = 6 * 3600
# Time a planned switch gives the workers to write a checkpoint and exit before deleting them.
DRAIN_TIMEOUT_SECONDS: Final = 300
# Aggregate bandwidth to checkpoint storage (a bucket or Filestore from one zone).
CHECKPOINT_BANDWIDTH_BYTES_PER_SECOND: Final = 1_000_000_000
# Restart delay after a real failure: BACKOFF_SECONDS x 2^(restarts-1), at most the cap.
BACKOFF_SECONDS: Final = 10
MAX_BACKOFF_SECONDS: Final = 600
# A plan search's wall-clock budget (spec.planning.deadlineSeconds): long enough for a 30B
# model over a handful of pools, short enough that an impossible request is told so soon.
PLANNING_DEADLINE_SECONDS: Final = 120
# The planner checks its deadline between candidates and not while completing profiles:
# a search still running this long past its deadline is killed.
PLANNING_GRACE_SECONDS: Final = 30
