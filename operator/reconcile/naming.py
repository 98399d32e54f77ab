"""Names and labels of everything the operator creates, in one place.

Names are deterministic functions of (job, plan generation, attempt, worker index), so a
restarted operator computes the same names and a create that finds the object already there
(409 Conflict) means "done", never a duplicate. Labels carry the same coordinates, so the
operator can rebuild its view of a job from the cluster alone.
"""

from __future__ import annotations

import hashlib
from typing import Final

from sailplan.operator.api.common import GROUP

LABEL_JOB: Final = f"{GROUP}/job"
# On worker pods: the TrainingJob's metadata.uid, which tells jobs apart across namespaces
# (their nodes are exclusive to one job: reconcile.children.worker_pod_affinity).
LABEL_JOB_UID: Final = f"{GROUP}/job-uid"
LABEL_ROLE: Final = f"{GROUP}/role"
LABEL_GENERATION: Final = f"{GROUP}/plan-generation"
LABEL_ATTEMPT: Final = f"{GROUP}/attempt"
LABEL_WORKER: Final = f"{GROUP}/worker-index"
LABEL_STAGE: Final = f"{GROUP}/stage"
LABEL_GPUPOOL: Final = f"{GROUP}/gpupool"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "sailplan-operator"

ROLE_WORKER: Final = "worker"
ROLE_PLAN: Final = "plan"
ROLE_RENDEZVOUS: Final = "rendezvous"

# Profile store: ConfigMaps with this label in the operator's namespace hold profile
# documents (sailplan.planner.profiles.types) under any key ending in .json.
LABEL_PROFILE: Final = f"{GROUP}/profile"

PLAN_KEY: Final = "plan.json"
TRAINER_KEY: Final = "trainer.json"


def plan_configmap_name(job: str, generation: int) -> str:
    return f"{job}-plan-g{generation}"


def service_name(job: str) -> str:
    return job


def worker_pod_name(job: str, generation: int, attempt: int, index: int) -> str:
    return f"{job}-g{generation}-a{attempt}-w{index}"


def job_labels(job: str, role: str) -> dict[str, str]:
    return {LABEL_JOB: job, LABEL_ROLE: role, LABEL_MANAGED_BY: MANAGED_BY}


def job_uid_label(namespace: str, name: str, uid: str) -> str:
    """LABEL_JOB_UID's value: the job's metadata.uid, which the API server always sets; a
    job without one (built in a pure test) gets a label-safe hash of namespace/name."""
    if uid:
        return uid
    return hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:40]


def pool_key(gpupool: str, zone: str) -> str:
    """Snapshot pool name of one GPUPool's nodes in one zone ('/' never occurs in either)."""
    return f"{gpupool}/{zone}"


def split_pool_key(key: str) -> tuple[str, str]:
    gpupool, _, zone = key.partition("/")
    return gpupool, zone
