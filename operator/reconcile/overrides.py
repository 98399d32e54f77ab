"""spec.podTemplateOverrides merged into a rendered worker pod.

reconcile.children renders the pod the plan needs (pinned to its GPUPool and zone, the
plan's GPU count, the worker environment contract, non-root) and hands it here. The rules,
in one place: the user's labels and annotations are added (keys under sailplan.dev/ are
refused by the CRD); tolerations, volumes, mounts, env and envFrom are appended; pod and
container security contexts, resources and the termination grace period are merged with a
field set by the user winning; node affinity keeps the plan's pin in every required term,
and the user's pod affinity and anti-affinity terms are added to the operator's (a node
holds one job's workers, packed: reconcile.children.worker_pod_affinity).
What the plan needs always wins: a nodeSelector entry or a required node-affinity
expression on a label the plan pins, an env variable of the worker contract, a GPU count.
Each such entry is dropped and named in the pod's IGNORED_ANNOTATION (and by the reconcile
in an Event), so a user sees why a setting did not take. Pure.

`apply_to_profiling_pod` gives the profiling Jobs' pods (profiling.jobs, which run the same
image on the same pools) the overrides that concern running there at all: labels and
annotations, nodeSelector additions, tolerations, imagePullSecrets, pod and container
security contexts, env and envFrom. Not affinity (a profiling pod is pinned to the pool
and zone it measures, and a network pair keeps its own anti-affinity: affinity written for
the workers could change what is measured or leave it unschedulable), priorityClassName (a
measurement must not preempt running work), volumes and mounts (the profiler reads only its
model annotation and writes an emptyDir; a worker's ReadWriteOnce claim could block it),
resources (the GPU count is the measurement's, cpu and memory spec.trainer's) and the
termination grace period (nothing to checkpoint). The plan-pinned entries are dropped as
for the workers (whose pods and Events already name them).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from sailplan.operator.api.common import GROUP
from sailplan.operator.api.gpupool import GPU_RESOURCE
from sailplan.operator.api.trainingjob import ContainerOverrides, PodTemplateOverrides

IGNORED_ANNOTATION: Final = f"{GROUP}/overrides-ignored"


def ignored_notes(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The entries a rendered or observed pod's IGNORED_ANNOTATION names, one each."""
    return tuple(n for n in annotations.get(IGNORED_ANNOTATION, "").split("; ") if n)


def pinned_labels(pod_spec: Mapping[str, Any]) -> dict[str, str]:
    """Node label -> value the operator's required node affinity pins (one term, `In` one
    value each: the GPUPool's node pool or selector labels and the zone)."""
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return {e["key"]: e["values"][0] for e in terms[0]["matchExpressions"]}


def _excludes(expression: Mapping[str, Any], value: str) -> bool:
    """Whether a node-selector expression rules out nodes whose label has `value`."""
    operator, values = expression.get("operator"), expression.get("values") or []
    if operator == "In":
        return value not in values
    if operator == "NotIn":
        return value in values
    return operator == "DoesNotExist"


def _node_affinity(
    ours: dict[str, Any], user: Mapping[str, Any], pinned: Mapping[str, str], ignored: list[str]
) -> dict[str, Any]:
    merged = copy.deepcopy(ours)
    required_key = "requiredDuringSchedulingIgnoredDuringExecution"
    pin = merged[required_key]["nodeSelectorTerms"][0]["matchExpressions"]
    user_terms = (user.get(required_key) or {}).get("nodeSelectorTerms") or []
    if user_terms:
        terms = []
        for term in user_terms:
            kept = []
            for expression in term.get("matchExpressions") or []:
                key = expression.get("key")
                if key not in pinned:
                    kept.append(expression)
                elif _excludes(expression, pinned[key]):
                    ignored.append(
                        f"affinity: {key} {expression.get('operator')} "
                        f"{expression.get('values') or []} (the plan pins {key}={pinned[key]})"
                    )
            # (pin AND t1) OR (pin AND t2) = pin AND (t1 OR t2): every term keeps the pin.
            terms.append({**term, "matchExpressions": [*pin, *kept]})
        merged[required_key] = {"nodeSelectorTerms": terms}
    preferred = user.get("preferredDuringSchedulingIgnoredDuringExecution")
    if preferred:
        merged["preferredDuringSchedulingIgnoredDuringExecution"] = copy.deepcopy(preferred)
    return merged


def _pod_affinity(ours: Mapping[str, Any], user: Mapping[str, Any]) -> dict[str, Any]:
    """Pod (anti-)affinity: the user's required and preferred terms after the operator's
    (one job per node, its workers packed), none dropped. Terms are ANDed (required) or
    summed (preferred), so the user's can narrow where workers go but not undo ours."""
    merged: dict[str, Any] = {**copy.deepcopy(dict(user)), **copy.deepcopy(dict(ours))}
    for key in (
        "requiredDuringSchedulingIgnoredDuringExecution",
        "preferredDuringSchedulingIgnoredDuringExecution",
    ):
        terms = [*(ours.get(key) or ()), *(user.get(key) or ())]
        if terms:
            merged[key] = copy.deepcopy(terms)
    return merged


def _resources(
    ours: Mapping[str, Any], user: Mapping[str, Any], ignored: list[str]
) -> dict[str, Any]:
    merged: dict[str, Any] = copy.deepcopy(dict(user))
    for part in ("requests", "limits"):
        mine = dict(ours.get(part) or {})
        theirs = dict(user.get(part) or {})
        gpus = mine.get(GPU_RESOURCE)
        wanted = theirs.get(GPU_RESOURCE)
        if wanted is not None and str(wanted) != gpus:
            ignored.append(f"resources.{part}.{GPU_RESOURCE}={wanted} (the plan gives {gpus})")
        merged[part] = mine | theirs | {GPU_RESOURCE: gpus}
    return merged


def apply_overrides(pod: dict[str, Any], overrides: PodTemplateOverrides | None) -> list[str]:
    """Merge `overrides` into `pod` (changed in place); what was ignored, one line each
    (also written to the pod's IGNORED_ANNOTATION)."""
    if overrides is None:
        return []
    ignored: list[str] = []
    metadata, spec = pod["metadata"], pod["spec"]
    if overrides.metadata is not None:
        # The operator's own keys win (the CRD refuses user keys under sailplan.dev/).
        metadata["labels"] = dict(overrides.metadata.labels or {}) | metadata["labels"]
        metadata["annotations"] = dict(overrides.metadata.annotations or {}) | metadata.get(
            "annotations", {}
        )
    template = overrides.spec
    if template is not None:
        pinned = pinned_labels(spec)
        selector = {}
        for key, value in (template.node_selector or {}).items():
            if key in pinned and pinned[key] != value:
                ignored.append(f"nodeSelector {key}={value} (the plan pins {key}={pinned[key]})")
            elif key not in pinned:
                selector[key] = value
        if selector:
            spec["nodeSelector"] = selector
        tolerations = spec.get("tolerations", [])
        spec["tolerations"] = tolerations + [
            dict(t) for t in template.tolerations or () if t not in tolerations
        ]
        if template.affinity is not None:
            user = copy.deepcopy(dict(template.affinity))
            node = user.pop("nodeAffinity", None)
            ours = spec["affinity"]
            merged = {
                **user,
                "nodeAffinity": _node_affinity(
                    ours["nodeAffinity"],
                    node if isinstance(node, dict) else {},
                    pinned,
                    ignored,
                ),
            }
            for kind in ("podAffinity", "podAntiAffinity"):
                if kind in ours:
                    theirs = user.get(kind)
                    merged[kind] = _pod_affinity(
                        ours[kind], theirs if isinstance(theirs, dict) else {}
                    )
            spec["affinity"] = merged
        if template.priority_class_name is not None:
            spec["priorityClassName"] = template.priority_class_name
        if template.image_pull_secrets:
            spec["imagePullSecrets"] = [dict(s) for s in template.image_pull_secrets]
        if template.security_context is not None:
            spec["securityContext"] = spec["securityContext"] | copy.deepcopy(
                dict(template.security_context)
            )
        if template.termination_grace_period_seconds is not None:
            spec["terminationGracePeriodSeconds"] = template.termination_grace_period_seconds
        spec["volumes"] = spec["volumes"] + [copy.deepcopy(dict(v)) for v in template.volumes or ()]
        container = template.container()
        if container is not None:
            _container(spec["containers"][0], container, ignored)
    if ignored:
        metadata.setdefault("annotations", {})[IGNORED_ANNOTATION] = "; ".join(ignored)
    return ignored


def _container(ours: dict[str, Any], user: ContainerOverrides, ignored: list[str]) -> None:
    contract = {e["name"] for e in ours["env"]}
    for variable in user.env or ():
        if variable.get("name") in contract:
            ignored.append(f"env {variable.get('name')} (set by the operator for the trainer)")
        else:
            ours["env"].append(copy.deepcopy(dict(variable)))
    if user.env_from:
        ours["envFrom"] = [copy.deepcopy(dict(source)) for source in user.env_from]
    ours["volumeMounts"] = ours["volumeMounts"] + [
        copy.deepcopy(dict(m)) for m in user.volume_mounts or ()
    ]
    if user.security_context is not None:
        ours["securityContext"] = ours["securityContext"] | copy.deepcopy(
            dict(user.security_context)
        )
    if user.resources is not None:
        ours["resources"] = _resources(ours["resources"], dict(user.resources), ignored)


def apply_to_profiling_pod(
    template: dict[str, Any], overrides: PodTemplateOverrides | None
) -> None:
    """Merge the overrides that apply to profiling pods into a Job's pod `template`
    (metadata and spec; changed in place). The operator's own entries win on a clash."""
    if overrides is None:
        return
    metadata, spec = template["metadata"], template["spec"]
    if overrides.metadata is not None:
        metadata["labels"] = dict(overrides.metadata.labels or {}) | metadata.get("labels", {})
        metadata["annotations"] = dict(overrides.metadata.annotations or {}) | metadata.get(
            "annotations", {}
        )
    pod = overrides.spec
    if pod is None:
        return
    pinned = pinned_labels(spec)
    selector = {k: v for k, v in (pod.node_selector or {}).items() if k not in pinned}
    if selector:
        spec["nodeSelector"] = selector
    tolerations = spec.get("tolerations", [])
    spec["tolerations"] = tolerations + [
        dict(t) for t in pod.tolerations or () if t not in tolerations
    ]
    if pod.image_pull_secrets:
        spec["imagePullSecrets"] = [dict(s) for s in pod.image_pull_secrets]
    if pod.security_context is not None:
        spec["securityContext"] = spec["securityContext"] | copy.deepcopy(
            dict(pod.security_context)
        )
    user = pod.container()
    if user is None:
        return
    for container in (*spec.get("initContainers", ()), *spec["containers"]):
        if user.security_context is not None:
            container["securityContext"] = container["securityContext"] | copy.deepcopy(
                dict(user.security_context)
            )
    # The profiler (the init container, the user's image at work) gets the user's env; the
    # report container only prints files.
    profiler = (spec.get("initContainers") or spec["containers"])[0]
    contract = {e["name"] for e in profiler.get("env", ())}
    profiler["env"] = list(profiler.get("env", ())) + [
        copy.deepcopy(dict(v)) for v in user.env or () if v.get("name") not in contract
    ]
    if user.env_from:
        profiler["envFrom"] = [copy.deepcopy(dict(source)) for source in user.env_from]
