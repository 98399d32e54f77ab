"""From a finished profiling Job to the profile store: parse its log, write a ConfigMap.

The operator reads the `report` container's log of the Job's succeeded pod (rank 0 for a
network pair), parses the ProfileSet between the markers, keeps only measured profiles of
what the Job was asked to measure (a pod cannot inject profiles for other GPUs, links or
zone pairs),
and creates one ConfigMap in the profile store namespace, labelled as
operator/profilestore.py reads it. The ConfigMap has no owner: profiles outlive the job
that measured them and serve every later job on the same GPUs and links.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

from sailplan.operator.api.common import GROUP
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.profiling.jobs import LABEL_RANK, labels
from sailplan.operator.profiling.needs import ComputeNeed, Need, key_id
from sailplan.operator.profiling.report import BEGIN, END
from sailplan.operator.reconcile import naming
from sailplan.planner.profiles.store import ProfileStoreError, dumps, loads
from sailplan.planner.profiles.types import ProfileSet

LABEL_PROFILE_KIND: Final = f"{GROUP}/profile-kind"
SOURCE_ANNOTATION: Final = f"{GROUP}/measured-by"
KEY_ANNOTATION: Final = f"{GROUP}/profile-key"
DATA_KEY: Final = "profiles.json"

ProfileKind = Literal["compute", "network", "power"]

_BLOCK = re.compile(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), re.DOTALL)


class ProfilingResultError(ValueError):
    """A profiling pod's log holds no readable result; the message says why."""


def parse_report(log: str) -> ProfileSet:
    """The ProfileSet a report container printed (the last block, should it have printed two)."""
    blocks = _BLOCK.findall(log)
    if not blocks:
        raise ProfilingResultError("the report container printed no profile block")
    try:
        return loads(blocks[-1], "report container log")
    except ProfileStoreError as error:
        raise ProfilingResultError(str(error)) from error


def result_pod_labels(job: TrainingJob, need: Need) -> dict[str, str]:
    """Labels of the pod whose log holds the result (rank 0 writes the network profile)."""
    found = labels(job, need)
    return (
        found
        if isinstance(need, ComputeNeed) or need.link == "intra-node"
        else found | {LABEL_RANK: "0"}
    )


def relevant(profiles: ProfileSet, need: Need) -> ProfileSet:
    """Only measured profiles of what `need` asked for."""
    if isinstance(need, ComputeNeed):
        compute = tuple(
            p
            for p in profiles.compute
            if p.provenance.source == "measured"
            and (p.model, p.gpu_type) == (need.model.name, need.site.gpu_type)
        )
        return ProfileSet(compute=compute)
    ends = {(need.site.zone, need.site.gpu_type), (need.peer.zone, need.peer.gpu_type)}
    network = tuple(
        p
        for p in profiles.network
        if p.provenance.source == "measured"
        and p.link == need.link
        and {p.gpu_type, p.peer_gpu_type} <= {need.site.gpu_type, need.peer.gpu_type}
        # between zones only the pair's own curves (no class-wide profile from this pod)
        and (
            not need.zone_pair
            or (p.zone_pair and {(p.zone, p.gpu_type), (p.peer_zone, p.peer_gpu_type)} == ends)
        )
    )
    return ProfileSet(network=network)


def store_configmap(
    profiles: ProfileSet, need: Need, namespace: str, measured_by: str
) -> dict[str, Any]:
    """The profile-store ConfigMap for one need's results (deterministic name: 409 = stored)."""
    kind: ProfileKind = "compute" if isinstance(need, ComputeNeed) else "network"
    return keyed_configmap(profiles, kind, need.key, namespace, measured_by)


def keyed_configmap(
    profiles: ProfileSet, kind: ProfileKind, key: str, namespace: str, measured_by: str
) -> dict[str, Any]:
    """The profile-store ConfigMap holding `key`'s profiles; its name depends on the key only,
    so a profiling Job and `sailplan profiles import` of the same key write the same object."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"sailplan-profile-{kind}-{key_id(key)}",
            "namespace": namespace,
            "labels": {
                naming.LABEL_PROFILE: "measured",
                LABEL_PROFILE_KIND: kind,
                naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
            },
            "annotations": {KEY_ANNOTATION: key, SOURCE_ANNOTATION: measured_by},
        },
        "data": {DATA_KEY: dumps(profiles)},
    }


def collect(log: str, need: Need, namespace: str, measured_by: str) -> dict[str, Any]:
    """Log in, ConfigMap out; raises ProfilingResultError when nothing usable was measured."""
    profiles = relevant(parse_report(log), need)
    if not profiles.compute and not profiles.network:
        raise ProfilingResultError(f"the profiling pod reported no measured profile for {need.key}")
    return store_configmap(profiles, need, namespace, measured_by)
