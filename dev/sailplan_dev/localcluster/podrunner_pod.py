"""Translate a bound Pod into what a local process needs, and its lifecycle into Pod status.

The e2e pod runner (podrunner.py) plays the kubelet for nodes kwok does not manage. This
module is its pure half: from the Pod object (a camelCase dict as the API server sends it)
and the objects it refers to, it computes the files of each volume, the container's
environment (env, envFrom, fieldRef, resourceFieldRef, configMap/secret keys, `$(VAR)`
expansion), the argv and working directory of each container it runs (the init containers
in order, then the first app container: run_order). No I/O: lookups of ConfigMaps, Secrets and tokens go through the `Sources` protocol,
so unit tests feed it plain dicts.

Two things differ from a kubelet, because the processes share this machine's filesystem
and network instead of getting their own:
- Mount paths are rewritten, not mounted: every occurrence of a mount path in env values,
  command, args, workingDir (and, by default, in ConfigMap file text, where e.g. the trainer
  config names its checkpoint directory) becomes the per-pod directory holding that volume;
  the image's own directories likewise become the container's root directory's
  (podrunner.py, podrunner_fs.make_root_filesystem).
- Cluster DNS names (`*.svc`, `*.svc.cluster.local`, `host.subdomain`, a Service's name) in
  env values, command and args become 127.0.0.1: every process listens on all of this
  machine's addresses (a pod's own status.podIP, podrunner_net, reaches only its forwarded
  ports).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from kubernetes.utils import parse_quantity as _parse_quantity

POD_IP = "127.0.0.1"
CLUSTER_DOMAIN = "cluster.local"
DEFAULT_FILE_MODE = 0o644
# Kubelet's mount point of the service account token volume the ServiceAccount admission
# plugin adds; its presence tells the runner to write the pod a kubeconfig (see podrunner).
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


class PodConfigError(Exception):
    """The pod cannot start yet (missing ConfigMap, Secret or key): the kubelet retries.

    `reason` is what the kubelet reports as the container's waiting reason.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Sources(Protocol):
    """Objects a pod refers to; None when absent."""

    def config_map(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def secret(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def service_account_token(
        self, pod: Mapping[str, Any], audience: str | None, expiration_seconds: int
    ) -> str: ...


@dataclass(frozen=True)
class VolumeFile:
    path: str  # relative to the volume directory
    content: bytes
    mode: int = DEFAULT_FILE_MODE


@dataclass(frozen=True)
class Volume:
    """One pod volume. `files` is None for directories that are not rendered (emptyDir,
    persistentVolumeClaim, hostPath); `shared_key` names a directory shared across pods."""

    name: str
    source: str  # the volume source's field name: configMap, downwardAPI, emptyDir, ...
    files: tuple[VolumeFile, ...] | None
    shared_key: str | None = None
    # Rendered from pod metadata that can change (labels, annotations): re-render on update.
    tracks_metadata: bool = False


@dataclass(frozen=True)
class Mount:
    mount_path: str
    volume: str
    sub_path: str = ""


@dataclass(frozen=True)
class Launch:
    """What to run for one container of the pod, paths not yet rewritten."""

    container: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str = ""
    mounts: tuple[Mount, ...] = ()
    # Env names whose value is the pod's own metadata (fieldRef, resourceFieldRef): data
    # about the pod, never an address or a path to rewrite (a pod may be named like a host).
    field_env: frozenset[str] = frozenset()


def parse_quantity(value: str) -> Decimal:
    """A Kubernetes quantity ("500m", "4Gi") as a Decimal (the client's parser, typed)."""
    parsed: Decimal = _parse_quantity(value)  # type: ignore[no-untyped-call]
    return parsed


# ---- small accessors --------------------------------------------------------------------------


def meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def key(pod: Mapping[str, Any]) -> str:
    return f"{meta(pod).get('namespace', '')}/{meta(pod).get('name', '')}"


def first_container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        raise PodConfigError("CreateContainerConfigError", "pod has no containers")
    first: Mapping[str, Any] = containers[0]
    return first


def run_order(pod: Mapping[str, Any]) -> tuple[tuple[Mapping[str, Any], bool], ...]:
    """The containers the runner runs, in order, each with whether it is an init container:
    every init container (each must exit 0 before the next starts), then the first app
    container. One app container because the runner runs one process per pod at a time
    (sidecars and multi-container pods are not needed by sailplan's pods)."""
    init = (pod.get("spec") or {}).get("initContainers") or []
    return (*((c, True) for c in init), (first_container(pod), False))


def _labels_or_annotations(pod: Mapping[str, Any], which: str) -> Mapping[str, str]:
    values: Mapping[str, str] = meta(pod).get(which) or {}
    return values


def format_map(values: Mapping[str, str]) -> str:
    """The kubelet's downward API rendering of labels/annotations: sorted `key="value"`
    lines (Go's %q; JSON string escaping agrees with it for printable text)."""
    return "\n".join(f"{k}={json.dumps(values[k], ensure_ascii=False)}" for k in sorted(values))


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_value(pod: Mapping[str, Any], path: str, pod_ip: str = POD_IP) -> str:
    """A downward API fieldRef value (the paths the kubelet supports); `pod_ip` is the
    address the runner gave the pod (podrunner_net)."""
    spec, metadata = pod.get("spec") or {}, meta(pod)
    subscript = _SUBSCRIPT.match(path)
    if subscript:
        return _labels_or_annotations(pod, subscript.group(1)).get(subscript.group(2), "")
    simple: dict[str, Any] = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        # The kubelet knows these before the status says so: they are this machine's.
        "status.hostIP": POD_IP,
        "status.hostIPs": POD_IP,
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
    }
    if path in ("metadata.labels", "metadata.annotations"):
        return format_map(_labels_or_annotations(pod, path.split(".")[1]))
    if path in simple:
        return str(simple[path])
    raise PodConfigError("CreateContainerConfigError", f"unsupported fieldRef {path!r}")


def resource_value(
    container: Mapping[str, Any], ref: Mapping[str, Any], allocatable: Mapping[str, str]
) -> str:
    """A resourceFieldRef value: the limit (node allocatable when unset), rounded up in
    units of the divisor, as the kubelet does."""
    resource = str(ref.get("resource", ""))
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise PodConfigError("CreateContainerConfigError", f"unsupported resource {resource!r}")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(name)
    if raw is None:
        raw = allocatable.get(name, "0")
    divisor = parse_quantity(str(ref.get("divisor") or "1"))
    if divisor == 0:
        divisor = Decimal(1)
    return str(math.ceil(parse_quantity(str(raw)) / divisor))


# ---- volumes ----------------------------------------------------------------------------------


def _items(
    data: Mapping[str, bytes],
    items: Iterable[Mapping[str, Any]] | None,
    default_mode: int,
    what: str,
    optional: bool,
) -> tuple[VolumeFile, ...]:
    if not items:
        return tuple(VolumeFile(k, data[k], default_mode) for k in sorted(data))
    files = []
    for item in items:
        name = str(item["key"])
        if name not in data:
            if optional:
                continue
            raise PodConfigError("CreateContainerConfigError", f"{what} has no key {name!r}")
        files.append(VolumeFile(str(item["path"]), data[name], int(item.get("mode", default_mode))))
    return tuple(files)


def _config_map_data(obj: Mapping[str, Any]) -> dict[str, bytes]:
    data = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _secret_data(obj: Mapping[str, Any]) -> dict[str, bytes]:
    data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data.update({k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()})
    return data


def _config_map_files(
    namespace: str, source: Mapping[str, Any], sources: Sources, default_mode: int
) -> tuple[VolumeFile, ...]:
    name, optional = str(source.get("name", "")), bool(source.get("optional", False))
    obj = sources.config_map(namespace, name)
    if obj is None:
        if optional:
            return ()
        raise PodConfigError("ContainerCreating", f'configmap "{name}" not found')
    what = f"configmap {name!r}"
    return _items(_config_map_data(obj), source.get("items"), default_mode, what, optional)


def _secret_files(
    namespace: str, source: Mapping[str, Any], name: str, sources: Sources, default_mode: int
) -> tuple[VolumeFile, ...]:
    optional = bool(source.get("optional", False))
    obj = sources.secret(namespace, name)
    if obj is None:
        if optional:
            return ()
        raise PodConfigError("ContainerCreating", f'secret "{name}" not found')
    what = f"secret {name!r}"
    return _items(_secret_data(obj), source.get("items"), default_mode, what, optional)


def _downward_files(
    pod: Mapping[str, Any], items: Iterable[Mapping[str, Any]], default_mode: int
) -> tuple[VolumeFile, ...]:
    files = []
    for item in items:
        mode = int(item.get("mode", default_mode))
        if "fieldRef" in item:
            value = field_value(pod, str(item["fieldRef"]["fieldPath"]))
        elif "resourceFieldRef" in item:
            ref = item["resourceFieldRef"]
            containers = (pod.get("spec") or {}).get("containers") or []
            named = [c for c in containers if c.get("name") == ref.get("containerName")]
            value = resource_value(named[0] if named else first_container(pod), ref, {})
        else:
            continue
        files.append(VolumeFile(str(item["path"]), value.encode(), mode))
    return tuple(files)


def _tracks_metadata(items: Iterable[Mapping[str, Any]]) -> bool:
    return any(
        str((i.get("fieldRef") or {}).get("fieldPath", "")).startswith(
            ("metadata.labels", "metadata.annotations")
        )
        for i in items
    )


def _projected(
    pod: Mapping[str, Any], source: Mapping[str, Any], sources: Sources
) -> tuple[tuple[VolumeFile, ...], bool]:
    namespace = str(meta(pod).get("namespace", ""))
    default_mode = int(source.get("defaultMode", DEFAULT_FILE_MODE))
    files: list[VolumeFile] = []
    tracks = False
    for projection in source.get("sources") or []:
        if "configMap" in projection:
            files += _config_map_files(namespace, projection["configMap"], sources, default_mode)
        elif "secret" in projection:
            secret = projection["secret"]
            name = str(secret.get("name", ""))
            files += _secret_files(namespace, secret, name, sources, default_mode)
        elif "downwardAPI" in projection:
            items = projection["downwardAPI"].get("items") or []
            files += _downward_files(pod, items, default_mode)
            tracks = tracks or _tracks_metadata(items)
        elif "serviceAccountToken" in projection:
            token = projection["serviceAccountToken"]
            value = sources.service_account_token(
                pod, token.get("audience"), int(token.get("expirationSeconds", 3607))
            )
            files.append(VolumeFile(str(token["path"]), value.encode(), 0o600))
    return tuple(files), tracks


def _shared_key(namespace: str, volume: Mapping[str, Any]) -> str | None:
    if "persistentVolumeClaim" in volume:
        # One directory per claim: what a pod writes survives its replacement, like a PVC.
        return f"pvc/{namespace}/{volume['persistentVolumeClaim']['claimName']}"
    if "hostPath" in volume:
        return "hostpath/" + str(volume["hostPath"]["path"]).strip("/").replace("/", "_")
    return None


def render_volume(pod: Mapping[str, Any], volume: Mapping[str, Any], sources: Sources) -> Volume:
    """One volume of the pod, rendered; raises PodConfigError while something is missing."""
    namespace = str(meta(pod).get("namespace", ""))
    name = str(volume["name"])
    if "configMap" in volume:
        source = volume["configMap"]
        mode = int(source.get("defaultMode", DEFAULT_FILE_MODE))
        return Volume(name, "configMap", _config_map_files(namespace, source, sources, mode))
    if "secret" in volume:
        source = volume["secret"]
        mode = int(source.get("defaultMode", DEFAULT_FILE_MODE))
        secret = str(source.get("secretName", ""))
        return Volume(name, "secret", _secret_files(namespace, source, secret, sources, mode))
    if "downwardAPI" in volume:
        source = volume["downwardAPI"]
        items = source.get("items") or []
        mode = int(source.get("defaultMode", DEFAULT_FILE_MODE))
        files = _downward_files(pod, items, mode)
        return Volume(name, "downwardAPI", files, tracks_metadata=_tracks_metadata(items))
    if "projected" in volume:
        files, tracks = _projected(pod, volume["projected"], sources)
        return Volume(name, "projected", files, tracks_metadata=tracks)
    # emptyDir, persistentVolumeClaim, hostPath and anything else: a plain directory.
    kind = next((k for k in volume if k != "name"), "emptyDir")
    return Volume(name, kind, None, shared_key=_shared_key(namespace, volume))


def render_volumes(pod: Mapping[str, Any], sources: Sources) -> tuple[Volume, ...]:
    return tuple(
        render_volume(pod, v, sources) for v in (pod.get("spec") or {}).get("volumes") or []
    )


def metadata_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether downward API files that follow labels/annotations need re-rendering."""
    return any(
        _labels_or_annotations(old, which) != _labels_or_annotations(new, which)
        for which in ("labels", "annotations")
    )


# ---- environment ------------------------------------------------------------------------------

_EXPANSION = re.compile(r"\$(\$|\(([^)]*)\))")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined names are replaced, `$$` escapes a `$`,
    undefined references stay as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(1) == "$":
            return "$"
        name = match.group(2)
        return env.get(name, match.group(0))

    return _EXPANSION.sub(replace, value)


def _key_ref(namespace: str, ref: Mapping[str, Any], sources: Sources, secret: bool) -> str | None:
    name, wanted = str(ref.get("name", "")), str(ref["key"])
    optional = bool(ref.get("optional", False))
    obj = sources.secret(namespace, name) if secret else sources.config_map(namespace, name)
    kind = "secret" if secret else "configmap"
    if obj is None:
        if optional:
            return None
        raise PodConfigError("CreateContainerConfigError", f'{kind} "{name}" not found')
    data = _secret_data(obj) if secret else _config_map_data(obj)
    if wanted not in data:
        if optional:
            return None
        raise PodConfigError(
            "CreateContainerConfigError", f"couldn't find key {wanted} in {kind} {namespace}/{name}"
        )
    return data[wanted].decode()


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    sources: Sources,
    allocatable: Mapping[str, str] | None = None,
    pod_ip: str = POD_IP,
) -> dict[str, str]:
    """The container's environment as the kubelet builds it (envFrom first, env overrides,
    each `value` expanded against the variables defined before it)."""
    namespace = str(meta(pod).get("namespace", ""))
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix", ""))
        ref = source.get("configMapRef") or source.get("secretRef") or {}
        is_secret = "secretRef" in source
        name = str(ref.get("name", ""))
        obj = sources.secret(namespace, name) if is_secret else sources.config_map(namespace, name)
        if obj is None:
            if ref.get("optional", False):
                continue
            kind = "secret" if is_secret else "configmap"
            raise PodConfigError("CreateContainerConfigError", f'{kind} "{name}" not found')
        data = _secret_data(obj) if is_secret else _config_map_data(obj)
        env.update({prefix + k: v.decode() for k, v in sorted(data.items())})
    for var in container.get("env") or []:
        name = str(var["name"])
        if "valueFrom" not in var:
            env[name] = expand(str(var.get("value", "")), env)
            continue
        source = var["valueFrom"]
        value: str | None
        if "fieldRef" in source:
            value = field_value(pod, str(source["fieldRef"]["fieldPath"]), pod_ip)
        elif "resourceFieldRef" in source:
            value = resource_value(container, source["resourceFieldRef"], allocatable or {})
        elif "configMapKeyRef" in source:
            value = _key_ref(namespace, source["configMapKeyRef"], sources, secret=False)
        elif "secretKeyRef" in source:
            value = _key_ref(namespace, source["secretKeyRef"], sources, secret=True)
        else:
            raise PodConfigError("CreateContainerConfigError", f"env {name}: unsupported source")
        if value is not None:
            env[name] = value
    return env


def launch(
    pod: Mapping[str, Any],
    sources: Sources,
    entrypoints: Mapping[str, Iterable[str]],
    allocatable: Mapping[str, str] | None = None,
    container: Mapping[str, Any] | None = None,
    *,
    pod_ip: str = POD_IP,
) -> Launch:
    """A container's argv, env, working dir and mounts (paths not yet rewritten); the first
    app container unless `container` (one of the pod's, e.g. an init container) is given.
    Each container has its own env and resources, so resourceFieldRef reads its own limits.

    A container without `command` runs its image's entrypoint, which only the image knows:
    `entrypoints` maps image references to it (the runner cannot read images).
    """
    if container is None:
        container = first_container(pod)
    env = container_env(pod, container, sources, allocatable, pod_ip)
    command = [str(c) for c in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    if not command:
        image = str(container.get("image", ""))
        if image not in entrypoints:
            raise PodConfigError(
                "CreateContainerConfigError",
                f"container {container.get('name')!r} has no command and the runner does not "
                f"know the entrypoint of image {image!r} (pass it in entrypoints)",
            )
        command = list(entrypoints[image])
    argv = tuple(expand(part, env) for part in (*command, *args))
    mounts = tuple(
        Mount(str(m["mountPath"]), str(m["name"]), str(m.get("subPath", "")))
        for m in container.get("volumeMounts") or []
    )
    last_source = {str(v["name"]): v.get("valueFrom") or {} for v in container.get("env") or []}
    return Launch(
        field_env=frozenset(
            name
            for name, source in last_source.items()
            if "fieldRef" in source or "resourceFieldRef" in source
        ),
        container=str(container.get("name", "")),
        argv=argv,
        env=env,
        working_dir=str(container.get("workingDir", "")),
        mounts=mounts,
    )


# ---- rewriting for a shared machine -------------------------------------------------------------


def path_rewriter(mounts: Mapping[str, str]) -> Callable[[str], str]:
    """A function replacing each mount path (as a whole path prefix) by its local directory.

    One regex alternation, longest first, in a single pass: a replacement is never itself
    rewritten, and `/etc/podinfo` does not touch `/etc/podinfo2` or `/x/etc/podinfo`.
    """
    if not mounts:
        return lambda text: text
    ordered = sorted(mounts, key=len, reverse=True)
    pattern = re.compile(
        r"(?<![\w.-])("
        + "|".join(re.escape(p.rstrip("/") or "/") for p in ordered)
        + r")(?![\w.-])"
    )
    table = {p.rstrip("/") or "/": local for p, local in mounts.items()}

    def rewrite(text: str) -> str:
        return pattern.sub(lambda m: table[m.group(1)], text)

    return rewrite


@dataclass(frozen=True)
class LocalNames:
    """The cluster DNS names that mean "a pod or Service of this cluster" for one pod."""

    namespace: str
    services: frozenset[str] = frozenset()
    subdomain: str = ""
    cluster_domain: str = CLUSTER_DOMAIN

    def is_local(self, host: str) -> bool:
        name = host.lower().rstrip(".")
        if name.endswith((".svc", f".svc.{self.cluster_domain}")):
            return True
        labels = name.split(".")
        if len(labels) == 1:
            return name in self.services
        # service.namespace, host.subdomain, host.subdomain.namespace
        if len(labels) == 2:
            first, second = labels
            return (first in self.services and second == self.namespace) or (
                second in self.services or (bool(self.subdomain) and second == self.subdomain)
            )
        if len(labels) == 3:
            return labels[2] == self.namespace and (
                labels[1] in self.services or labels[1] == self.subdomain
            )
        return False


# A dotted DNS name not glued to a longer word or path part ("/" may precede it: a URL).
_LABEL = r"[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?"
_DOTTED_HOST = re.compile(rf"(?<![\w.-])({_LABEL}(?:\.{_LABEL})+\.?)(?![\w.-])")
_BARE_HOST = re.compile(r"^([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)(:\d+)?$")


def localize_hosts(text: str, names: LocalNames) -> str:
    """Cluster DNS names in `text` -> 127.0.0.1.

    Dotted names are found anywhere (a URL, host:port, a flag value); a single-label name (a
    Service) only when it is the whole value, optionally with a
    port, since a lone word inside a longer value is more likely a path part than a host.
    """
    bare = _BARE_HOST.match(text)
    if bare and names.is_local(bare.group(1)):
        return POD_IP + (bare.group(2) or "")
    return _DOTTED_HOST.sub(lambda m: POD_IP if names.is_local(m.group(1)) else m.group(1), text)
