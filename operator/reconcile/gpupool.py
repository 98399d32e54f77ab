"""GPUPool status from the nodes it selects: counts per zone, GPU type, spot, conditions.

Called by the GPUPool handler whenever a node or a GPU-holding pod changes. Pure: nodes,
GPU usage, the GPUs reserved by unbound workers and the catalog come in as arguments, the
clock as `now`.

A pool with spec.autoscaling also lists what it can become: per zone, the nodes it may
still add under its autoscaling maximum (possible) and those that exist but are not Ready
yet (provisioning). A pool-wide maximum (totalMaxNodes) is split evenly over the zones, so
the zones' possible nodes never add up to more than the pool may create. A zone whose
waiting workers got no node within provisioningTimeoutSeconds is backed off
(reconcile.scaleup): no possible nodes until the backoff ends, condition ScaleUpAvailable
False with the zone and the time. A pool that asks for capacity through ProvisioningRequests
also says whether an autoscaler answers its class (condition ProvisioningClassServed,
reconcile.provisioning.class_condition).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime

from sailplan.operator.api import gpupool as api
from sailplan.operator.api.common import Condition, find_condition, set_condition
from sailplan.operator.api.gpupool import Autoscaling, GPUPool, GPUPoolStatus, ZoneStatus
from sailplan.operator.api.machines import MACHINE_SHAPES
from sailplan.operator.reconcile.nodes import NodeInfo
from sailplan.operator.reconcile.provisioning import CLASS_SERVED, Verdicts, class_condition
from sailplan.operator.reconcile.scaleup import (
    DEFAULT_BACKOFF,
    BackoffPolicy,
    ZoneBackoff,
    zone_backoff,
)
from sailplan.planner.catalog import Catalog, UnknownGPUError


def selects(pool: GPUPool, node: NodeInfo) -> bool:
    spec = pool.spec
    if spec.node_pool is not None:
        return node.labels.get(api.NODEPOOL_LABEL) == spec.node_pool
    if spec.selector is not None:
        return spec.selector.matches(dict(node.labels))
    return False


def _resolve_gpu_type(
    pool: GPUPool, nodes: list[NodeInfo], catalog: Catalog
) -> tuple[str | None, Condition]:
    """The pool's catalog GPU name: from the spec, else the autoscaling machine type, else
    the nodes' GKE accelerator label."""
    machine = _machine_type(pool)
    if pool.spec.gpu_type is not None:
        wanted, source = {pool.spec.gpu_type}, "spec.gpuType"
        mismatch = _shape_mismatch(pool.spec.gpu_type, machine, catalog)
        if mismatch is not None:
            return None, mismatch
    elif machine is not None:
        wanted, source = {MACHINE_SHAPES[machine].gpu_type}, f"machine type {machine}"
    else:
        wanted = {
            n.labels[api.ACCELERATOR_LABEL] for n in nodes if api.ACCELERATOR_LABEL in n.labels
        }
        source = f"label {api.ACCELERATOR_LABEL}"
    if not wanted:
        return None, Condition(
            type=api.GPU_TYPE_RESOLVED,
            status="False",
            reason=api.REASON_NO_GPU_TYPE,
            message=f"set spec.gpuType or label the nodes with {api.ACCELERATOR_LABEL}",
        )
    try:
        resolved = {catalog.resolve_gpu(name) for name in wanted}
    except UnknownGPUError as error:
        return None, Condition(
            type=api.GPU_TYPE_RESOLVED,
            status="False",
            reason=api.REASON_UNKNOWN_GPU_TYPE,
            message=f"{source}: {error}",
        )
    if len(resolved) > 1:
        return None, Condition(
            type=api.GPU_TYPE_RESOLVED,
            status="False",
            reason=api.REASON_MIXED_GPU_TYPES,
            message=f"nodes carry several GPU types ({', '.join(sorted(resolved))}); "
            "a pool must be homogeneous: split it or set spec.gpuType",
        )
    (gpu_type,) = resolved
    return gpu_type, Condition(
        type=api.GPU_TYPE_RESOLVED,
        status="True",
        reason=api.REASON_RESOLVED,
        message=f"{gpu_type} (from {source})",
    )


def _machine_type(pool: GPUPool) -> str | None:
    autoscaling = pool.spec.autoscaling
    return autoscaling.machine_type if autoscaling is not None else None


def _shape_mismatch(gpu_type: str, machine: str | None, catalog: Catalog) -> Condition | None:
    if machine is None:
        return None
    shape = MACHINE_SHAPES[machine]
    try:
        if catalog.resolve_gpu(gpu_type) == catalog.resolve_gpu(shape.gpu_type):
            return None
    except UnknownGPUError:
        return None  # reported as UnknownGPUType by the caller
    return Condition(
        type=api.GPU_TYPE_RESOLVED,
        status="False",
        reason=api.REASON_SHAPE_MISMATCH,
        message=f"spec.gpuType {gpu_type} contradicts machine type {machine} "
        f"({shape.gpu_type}): drop one",
    )


def new_node_gpus(autoscaling: Autoscaling) -> int:
    """GPUs of a node the pool would add: the spec's count, else the machine type's."""
    if autoscaling.gpus_per_node is not None:
        return autoscaling.gpus_per_node
    if autoscaling.machine_type is not None:
        return MACHINE_SHAPES[autoscaling.machine_type].gpus_per_node
    return 0  # the CRD's rule requires one of them


def possible_nodes(
    autoscaling: Autoscaling, existing: Mapping[str, int], zones: list[str]
) -> dict[str, int]:
    """Nodes the pool may still add per zone, given its existing nodes per zone."""
    if autoscaling.max_nodes_per_zone is not None:
        limit = autoscaling.max_nodes_per_zone
        return {z: max(0, limit - existing.get(z, 0)) for z in zones}
    room = max(0, (autoscaling.total_max_nodes or 0) - sum(existing.values()))
    allowed = set(autoscaling.zones)
    growing = [z for z in zones if z in allowed]
    share, extra = divmod(room, len(growing)) if growing else (0, 0)
    return {z: (share + (1 if i < extra else 0)) for i, z in enumerate(growing)} | {
        z: 0 for z in zones if z not in allowed
    }


def _zone_status(
    zone: str,
    nodes: list[NodeInfo],
    in_use: Mapping[str, int],
    *,
    reserved: int,
    possible: int,
    new_gpus: int,
    backoff: ZoneBackoff | None = None,
) -> ZoneStatus:
    ready = [n for n in nodes if n.schedulable]
    sizes = Counter(n.gpus_allocatable for n in ready if n.gpus_allocatable > 0)
    # The most common node size; ties go to the larger one (deterministic). A zone with no
    # ready node has the size of the nodes the pool would add.
    gpus_per_node = max(sizes.items(), key=lambda kv: (kv[1], kv[0]))[0] if sizes else new_gpus
    free = [
        n for n in ready if n.gpus_allocatable >= gpus_per_node > 0 and in_use.get(n.name, 0) == 0
    ]
    return ZoneStatus(
        zone=zone,
        nodes_total=len(nodes),
        nodes_ready=len(ready),
        nodes_free=len(free),
        gpus_per_node=gpus_per_node,
        gpus_allocatable=sum(n.gpus_allocatable for n in ready),
        gpus_in_use=sum(in_use.get(n.name, 0) for n in ready),
        nodes_provisioning=sum(1 for n in nodes if not n.ready),
        nodes_possible=possible,
        gpus_possible=possible * new_gpus,
        gpus_reserved=reserved,
        scale_up_backoff_until=backoff.until if backoff is not None else None,
        scale_up_backoff_seconds=backoff.seconds if backoff is not None else 0,
    )


def pool_status(
    pool: GPUPool,
    nodes: Iterable[NodeInfo],
    gpus_in_use: Mapping[str, int],
    catalog: Catalog,
    now: datetime,
    *,
    reserved: Mapping[str, int] | None = None,
    waiting_since: Mapping[str, datetime] | None = None,
    verdicts: Verdicts | None = None,
    backoff_policy: BackoffPolicy = DEFAULT_BACKOFF,
) -> GPUPoolStatus:
    """The status the pool should have given every node of the cluster, GPU usage per node,
    `reserved`: zone -> GPUs that this pool's created but unbound workers will take,
    `waiting_since`: zone -> creation time of the oldest of those workers, `verdicts`:
    what the operator's ProvisioningRequests say about the autoscalers, and `backoff_policy`: how
    long a zone that gave no node is backed off (the operator's setting)."""
    selected = sorted((n for n in nodes if selects(pool, n)), key=lambda n: n.name)
    gpu_type, type_condition = _resolve_gpu_type(pool, selected, catalog)
    reserved = reserved or {}
    autoscaling = pool.spec.autoscaling

    by_zone: dict[str, list[NodeInfo]] = {}
    for node in selected:
        by_zone.setdefault(node.zone or "unknown", []).append(node)
    if autoscaling is not None:
        for zone in autoscaling.zones:
            by_zone.setdefault(zone, [])
    zone_names = sorted(by_zone)
    new_gpus = new_node_gpus(autoscaling) if autoscaling is not None else 0
    # A node still starting is counted among the nodes the pool may add, not among those
    # it has: it is not ready, and counting it against the maximum alone would make the
    # capacity a job was planned on dip while its node comes up.
    existing = {z: sum(1 for n in by_zone[z] if not n.starting) for z in zone_names}
    possible = possible_nodes(autoscaling, existing, zone_names) if autoscaling is not None else {}
    backoffs: dict[str, ZoneBackoff] = {}
    if autoscaling is not None:
        previous = {z.zone: z for z in pool.status.zones}
        for z in zone_names:
            backoffs[z] = zone_backoff(
                previous.get(z),
                nodes_ready=sum(1 for n in by_zone[z] if n.schedulable),
                waiting_since=(waiting_since or {}).get(z),
                timeout_seconds=autoscaling.provisioning_timeout_seconds,
                now=now,
                policy=backoff_policy,
            )
    zones = tuple(
        _zone_status(
            z,
            by_zone[z],
            gpus_in_use,
            reserved=reserved.get(z, 0),
            possible=0 if z in backoffs and backoffs[z].active(now) else possible.get(z, 0),
            new_gpus=new_gpus,
            backoff=backoffs.get(z),
        )
        for z in zone_names
    )

    if pool.spec.spot is not None:
        spot: bool | None = pool.spec.spot
    elif selected:
        # One preemptible node makes the pool preemptible for planning purposes.
        spot = any(n.labels.get(api.SPOT_LABEL) == "true" for n in selected)
    else:
        spot = None

    nodes_ready = sum(z.nodes_ready for z in zones)
    nodes_possible = sum(z.nodes_possible for z in zones)
    message = f"{nodes_ready}/{len(selected)} nodes ready and schedulable"
    if nodes_ready:
        reason = api.REASON_NODES_READY
    elif nodes_possible:
        reason, message = api.REASON_CAN_GROW, f"{message}; may add {nodes_possible} nodes"
    else:
        reason = api.REASON_NO_READY_NODES
    ready_condition = Condition(
        type=api.READY,
        status="True" if nodes_ready or nodes_possible else "False",
        reason=reason,
        message=message,
    )
    conditions = pool.status.conditions
    updates = [ready_condition, type_condition]
    if autoscaling is not None:
        updates.append(_scale_up_condition(backoffs, autoscaling, now))
    if autoscaling is not None and autoscaling.provisioning_request is not None:
        previous_class = find_condition(conditions, CLASS_SERVED)
        if previous_class is not None and previous_class.observed_generation != pool.generation:
            previous_class = None  # the spec changed (the class, maybe): judge afresh
        updates.append(
            class_condition(
                autoscaling.provisioning_request.class_name,
                pool.name,
                verdicts or Verdicts(),
                previous_class,
            )
        )
    else:
        conditions = tuple(c for c in conditions if c.type != CLASS_SERVED)
    for condition in updates:
        conditions = set_condition(
            conditions, condition.model_copy(update={"observed_generation": pool.generation}), now
        )
    return GPUPoolStatus(
        observed_generation=pool.generation,
        gpu_type=gpu_type,
        spot=spot,
        nodes_total=len(selected),
        nodes_ready=nodes_ready,
        gpus_allocatable=sum(z.gpus_allocatable for z in zones),
        gpus_in_use=sum(z.gpus_in_use for z in zones),
        gpus_per_node=new_gpus,
        provisioning_seconds=(
            autoscaling.provisioning_seconds if autoscaling is not None else None
        ),
        gpus_possible=sum(z.gpus_possible for z in zones),
        gpus_reserved=sum(z.gpus_reserved for z in zones),
        zones=zones,
        conditions=conditions,
    )


def _scale_up_condition(
    backoffs: Mapping[str, ZoneBackoff], autoscaling: Autoscaling, now: datetime
) -> Condition:
    """ScaleUpAvailable: False while a zone is backed off, naming each zone and its end."""
    short = [(zone, b) for zone, b in sorted(backoffs.items()) if b.active(now) and b.until]
    if not short:
        return Condition(
            type=api.SCALE_UP_AVAILABLE,
            status="True",
            reason=api.REASON_SCALE_UP_HEALTHY,
            message="every zone may add nodes up to its maximum",
        )
    zones = "; ".join(
        f"{zone} until {b.until:%Y-%m-%dT%H:%M:%SZ} (backoff {b.seconds} s)"
        for zone, b in short
        if b.until is not None
    )
    return Condition(
        type=api.SCALE_UP_AVAILABLE,
        status="False",
        reason=api.REASON_SCALE_UP_BACKOFF,
        message=f"workers waited over {autoscaling.provisioning_timeout_seconds} s for a node "
        f"(stockout or quota?); planning counts no new nodes in {zones}",
    )
