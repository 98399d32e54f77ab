"""Storage-version migration of the operator's custom resources, once per operator start.

The CRDs store v1beta1 and still serve v1alpha1 (api.crd). Objects written before the
upgrade stay encoded at v1alpha1 in etcd until something writes them again, and the CRD's
`status.storedVersions` lists v1alpha1 as long as any might: a later release can stop
serving v1alpha1 only once that list is just v1beta1. So the operator does what
kube-storage-version-migrator does, for its own two CRDs: it writes every object back
unchanged (the API server encodes it at the storage version), then sets storedVersions to
v1beta1 alone. A TrainingJob an older operator ran keeps the operator's memory in its
v1alpha1 status, which v1beta1 does not have: that memory is moved to the job's state
ConfigMap first (reconcile.memory), or the rewrite would drop it.

`migrate` is called by the startup handler (controller.registration); it returns at once
when storedVersions is already v1beta1 alone, and a failure is logged, never fatal: the
next start tries again, and until then nothing but storedVersions is behind.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from sailplan.operator.api.common import GROUP, LEGACY_VERSION, VERSION
from sailplan.operator.api.gpupool import PLURAL as POOLS
from sailplan.operator.api.trainingjob import PLURAL as JOBS
from sailplan.operator.controller.blocking import run_blocking
from sailplan.operator.kube import Kube
from sailplan.operator.reconcile import memory

log = logging.getLogger("sailplan.operator")

PLURALS: Final = (POOLS, JOBS)


def needs_migration(crd: Mapping[str, Any] | None) -> bool:
    """Whether objects of `crd` may still be stored at another version than VERSION: its
    storedVersions lists another, and VERSION is its storage version (CRDs not upgraded
    yet: nothing to do until they are)."""
    if crd is None:
        return False
    versions = (crd.get("spec") or {}).get("versions") or ()
    storage = next((v.get("name") for v in versions if v.get("storage")), None)
    stored = list((crd.get("status") or {}).get("storedVersions") or ())
    return storage == VERSION and stored != [VERSION]


def memories_to_move(legacy_jobs: list[dict[str, Any]]) -> list[tuple[str, str, str, Any]]:
    """(namespace, name, uid, memory) of each TrainingJob, as v1alpha1 shows it, whose
    status still holds the operator's memory."""
    moved = []
    for body in legacy_jobs:
        status = body.get("status") or {}
        if not memory.has_legacy_fields(status):
            continue
        metadata = body.get("metadata") or {}
        found = memory.legacy(status).memory
        if not found.is_empty():
            moved.append(
                (metadata.get("namespace", ""), metadata["name"], metadata.get("uid", ""), found)
            )
    return moved


async def migrate(kube: Kube) -> None:
    """Rewrite every object stored at an older version, then set storedVersions."""
    for plural in PLURALS:
        name = f"{plural}.{GROUP}"
        try:
            await _migrate(kube, plural, name)
        except ApiException as error:
            log.warning(
                "storage migration not finished; the next operator start tries again",
                extra={"crd": name, "status_code": error.status, "reason": error.reason},
            )


async def _migrate(kube: Kube, plural: str, name: str) -> None:
    crd = await run_blocking(kube.get_crd, name)
    if not needs_migration(crd):
        return
    if plural == JOBS:
        for namespace, job, uid, found in memories_to_move(
            await run_blocking(kube.list_objects, plural, LEGACY_VERSION)
        ):
            await _keep_memory(kube, namespace, job, uid, found)
    rewritten = 0
    for body in await run_blocking(kube.list_objects, plural):
        rewritten += await _rewrite(kube, plural, body)
    await run_blocking(kube.set_stored_versions, name, [VERSION])
    log.info(
        "storage migration done",
        extra={"crd": name, "objects": rewritten, "stored_versions": [VERSION]},
    )


async def _keep_memory(kube: Kube, namespace: str, job: str, uid: str, found: Any) -> None:
    """The job's memory into its state ConfigMap, unless it has one already (newer)."""
    existing = await run_blocking(kube.get_configmap, namespace, memory.state_configmap_name(job))
    if existing is not None:
        return
    body = memory.render(namespace, job, uid, found, None)
    await run_blocking(kube.write_configmap, body)
    log.info(
        "job memory moved from its status to its state ConfigMap",
        extra={"namespace": namespace, "trainingjob": job},
    )


async def _rewrite(kube: Kube, plural: str, body: dict[str, Any]) -> int:
    """Write one object back as read; 1 if it is stored anew, 0 if it was deleted."""
    try:
        await run_blocking(kube.replace_object, plural, body)
    except ApiException as error:
        if error.status == 404:
            return 0
        # 409: written by someone else since it was listed, which stored it at the
        # storage version just the same.
        if error.status != 409:
            raise
    return 1
