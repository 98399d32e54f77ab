"""simulate(plan, context) -> Predictions: iteration time, memory, cost and egress of one plan.

Pure: everything comes from the plan and the PlanningContext, priced through the same
CostModel the search uses. The model, term by term:

- compute: per stage, forward + backward of one micro-batch on its slowest replica
  (heterogeneous replicas of a stage run in lockstep because of the all-reduce); with an
  uneven data split (plan.pipeline_micro_batches) each pipeline runs its own 1F1B schedule
  on its own replicas with its own micro-batch count, and the slowest one counts;
- pipeline: 1F1B with heterogeneous stages (costs.one_f_one_b_seconds), where the boundary
  between stage k and k+1 costs the slowest pipeline's activation transfer over its link
  class (same zone / other zone / other region, with each side's GPU types);
- gradient all-reduce: per stage, NCCL's ring or tree over its replicas, one collective per
  bucket (CostModel.group_bucket_bytes: the runtime's bucket, each paying the collective's
  latency), exposed after the pipeline (or only what the last backward cannot hide when
  SimulatorConstants.overlap_allreduce is set; the Sailplan trainer does not overlap);
- shared parameters (tied embeddings, T5's position-bias tables: simulator/ties.py): when
  their users sit on several stages, each pipeline sums their gradients over those stages
  after the flush and before the optimizer step (CostModel.shared_gradient_seconds: TP
  gather, ring all-reduce of the TP roots over the link between the stages, TP broadcast),
  in the tail of the stages that take part (their DP all-reduce waits for it); the copy a
  stage keeps is a parameter of that stage (memory, DP all-reduce bytes);
- optimizer: each stage updates after its own all-reduce, so the iteration ends with the
  slowest stage's all-reduce + update;
- memory per GPU: model states (simulator/memory.py: weights, gradients, master weights,
  optimizer states and reduce buckets for the context's ZeRO stage and parameter dtype,
  shared over the plan's data-parallel degree), in-flight activations under 1F1B,
  framework overhead;
- USD: every GPU of the plan for the iteration at its pool's price, plus cross-zone bytes
  (activations and gradients between stages, all-reduce ring links) at the zone-pair price,
  plus, for pools with an energy price (Pool.usd_per_kwh), their GPUs' energy at default
  clocks (blocking power all iteration, load power while computing; catalog power fields).
"""

from __future__ import annotations

from sailplan.planner.plan import Plan, Predictions, ProfileRef, Replica, StagePrediction
from sailplan.planner.profiles.types import Source
from sailplan.planner.simulator.context import PlanningContext
from sailplan.planner.simulator.costs import ZoneLink, one_f_one_b_seconds
from sailplan.planner.simulator.ties import sharing_stages


def simulate(plan: Plan, context: PlanningContext) -> Predictions:
    """Predict what running `plan` costs on the context's cluster with its profiles."""
    if plan.model.name != context.model.name:
        raise ValueError(
            f"plan is for model {plan.model.name!r} but the context is for {context.model.name!r}"
        )
    costs = context.costs
    mbs = plan.micro_batch_size
    num_stages = plan.pipeline_depth
    num_micro = plan.num_micro_batches

    stage_seconds: list[float] = []
    stage_memory: list[float] = []
    stage_host: list[float] = []
    tail_seconds: list[float] = []  # exposed all-reduce + update, per stage
    exposed_allreduce: list[float] = []
    update_seconds: list[float] = []
    egress_bytes = 0.0
    egress_usd = 0.0

    for index, stage in enumerate(plan.stages):
        a, b, tp = stage.layer_start, stage.layer_end, stage.tensor_parallel
        slowest = 0.0
        slowest_backward = 0.0
        update = 0.0
        memory = 0.0
        host = 0.0
        grads = 0.0
        for replica in stage.replicas:
            table = costs.require_table(replica.gpu_type, tp, mbs)
            # memory options (Stage.recompute, Stage.optimizer_offload): CostModel prices them
            seconds = costs.stage_seconds(table, a, b, stage.recompute)
            slowest = max(slowest, seconds)
            slowest_backward = max(slowest_backward, seconds - table.forward_seconds(a, b))
            update = max(
                update,
                costs.stage_update_seconds(
                    table, a, b, stage.optimizer_offload, plan.data_parallel
                ),
            )
            memory = max(
                memory,
                costs.stage_memory_bytes(
                    table,
                    a,
                    b,
                    stage=index,
                    num_stages=num_stages,
                    num_micro_batches=num_micro,
                    data_parallel=plan.data_parallel,
                    recompute=stage.recompute,
                    offload=stage.optimizer_offload,
                ),
            )
            if stage.optimizer_offload:
                host = max(host, costs.stage_host_bytes(table, a, b, plan.data_parallel))
            grads = costs.gradient_bytes(table, a, b)
        allreduce = costs.allreduce_seconds(grads, stage.replicas, tp)
        if context.constants.overlap_allreduce:
            hidden = max(0.0, allreduce - slowest_backward)
            allreduce = max(hidden, costs.allreduce_last_bucket_seconds(grads, stage.replicas, tp))
        crossing, usd = costs.allreduce_egress(grads, stage.replicas)
        egress_bytes += crossing
        egress_usd += usd
        stage_seconds.append(slowest)
        stage_memory.append(memory)
        stage_host.append(host)
        exposed_allreduce.append(allreduce)
        update_seconds.append(update)
        tail_seconds.append(allreduce + update)

    # tied embeddings (and T5's shared tables): after the flush, before the optimizer
    # step, the stages that use a shared parameter sum its gradient (simulator/ties.py);
    # each pipeline's sync runs on its own, the stage's DP all-reduce waits for all of them
    ranges = [(s.layer_start, s.layer_end) for s in plan.stages]
    shared_sync = [0.0] * num_stages
    for r in range(plan.data_parallel):
        pipeline_sync = 0.0
        users_of_r: set[int] = set()
        for name, users in sharing_stages(context.model, ranges):
            ends = [(plan.stages[i].replicas[r], plan.stages[i].tensor_parallel) for i in users]
            pipeline_sync += costs.shared_gradient_seconds(name, ends)
            crossing, usd = costs.shared_gradient_egress(name, [end for end, _ in ends])
            egress_bytes += crossing
            egress_usd += usd
            users_of_r.update(users)
        for i in users_of_r:
            shared_sync[i] = max(shared_sync[i], pipeline_sync)
    for i in range(num_stages):
        exposed_allreduce[i] += shared_sync[i]
        tail_seconds[i] += shared_sync[i]

    boundary_seconds: list[float] = []
    for k in range(num_stages - 1):
        sender, receiver = plan.stages[k], plan.stages[k + 1]
        boundary = costs.boundary_bytes(mbs, receiver.layer_start)
        slowest_link = 0.0
        for r in range(plan.data_parallel):
            a_rep, b_rep = sender.replicas[r], receiver.replicas[r]
            # one copy crosses the network whatever the TP degrees (CostModel.boundary_seconds)
            link = costs.boundary_seconds(
                boundary, a_rep, b_rep, sender.tensor_parallel, receiver.tensor_parallel
            )
            slowest_link = max(slowest_link, link)
            if a_rep.zone != b_rep.zone:
                # every micro-batch sends its activation forward and its gradient back
                moved = 2.0 * boundary * plan.micro_batches_of(r)
                egress_bytes += moved
                egress_usd += moved / 1e9 * costs.egress_usd_per_gb(a_rep.zone, b_rep.zone)
        boundary_seconds.append(slowest_link)

    if plan.pipeline_micro_batches is None:
        pipeline = one_f_one_b_seconds(
            stage_seconds,
            boundary_seconds,
            num_micro,
            blocking_p2p=context.constants.blocking_p2p,
        )
    else:
        pipeline = _uneven_pipeline_seconds(plan, context)
    slowest_tail = max(range(num_stages), key=lambda i: tail_seconds[i])
    iteration = pipeline + tail_seconds[slowest_tail]

    gpu_usd_per_hour = 0.0
    for worker in plan.workers():
        gpu_usd_per_hour += worker.tensor_parallel * costs.price_per_gpu_hour(worker.pool)
    energy_usd = _energy_usd(plan, context, iteration)
    usd_per_iteration = gpu_usd_per_hour * iteration / 3600.0 + egress_usd + energy_usd

    return Predictions(
        iteration_seconds=iteration,
        samples_per_second=plan.global_batch_size / iteration,
        stages=tuple(
            StagePrediction(
                forward_backward_seconds=t, peak_memory_bytes=int(m), host_memory_bytes=int(h)
            )
            for t, m, h in zip(stage_seconds, stage_memory, stage_host, strict=True)
        ),
        usd_per_iteration=usd_per_iteration,
        usd_per_hour=usd_per_iteration * 3600.0 / iteration,
        egress_bytes_per_iteration=egress_bytes,
        pipeline_seconds=pipeline,
        allreduce_seconds=exposed_allreduce[slowest_tail],
        update_seconds=update_seconds[slowest_tail],
        energy_usd_per_iteration=energy_usd,
    )


def _energy_usd(plan: Plan, context: PlanningContext, iteration: float) -> float:
    """Energy of the GPUs in pools with an energy price, at default clocks: each GPU draws
    its blocking power for the whole iteration and its default-clock load power above that
    while it computes (its forward/backward passes with their recomputation, and its
    optimizer step unless the CPU runs it: an offloaded step is a GPU wait): the energy
    model's default point (planner/energy/plan_energy.py) with the catalog's power."""
    costs = context.costs
    usd = 0.0
    for worker in plan.workers():
        per_joule = costs.usd_per_joule(worker.pool)
        if per_joule == 0.0:
            continue
        stage = plan.stages[worker.stage]
        a, b = stage.layer_start, stage.layer_end
        table = costs.require_table(worker.gpu_type, stage.tensor_parallel, plan.micro_batch_size)
        busy = plan.micro_batches_of(worker.replica) * costs.stage_seconds(
            table, a, b, stage.recompute
        )
        if not stage.optimizer_offload:
            busy += table.update_seconds(a, b)
        load, blocking = costs.gpu_watts(worker.gpu_type)
        joules = worker.tensor_parallel * (blocking * iteration + (load - blocking) * busy)
        usd += joules * per_joule
    return usd


def _uneven_pipeline_seconds(plan: Plan, context: PlanningContext) -> float:
    """Forward/backward time of a plan whose pipelines run different micro-batch counts.

    Pipelines meet only at the gradient all-reduce, so each runs its own 1F1B schedule on
    its own replicas (replica r of every stage) and links, with its own count; the
    iteration waits for the slowest.
    """
    costs = context.costs
    mbs = plan.micro_batch_size
    slowest = 0.0
    for r in range(plan.data_parallel):
        stage_seconds = [
            costs.stage_seconds(
                costs.require_table(stage.replicas[r].gpu_type, stage.tensor_parallel, mbs),
                stage.layer_start,
                stage.layer_end,
                stage.recompute,
            )
            for stage in plan.stages
        ]
        links = []
        for sender, receiver in zip(plan.stages, plan.stages[1:], strict=False):
            boundary = costs.boundary_bytes(mbs, receiver.layer_start)
            links.append(
                costs.boundary_seconds(
                    boundary,
                    sender.replicas[r],
                    receiver.replicas[r],
                    sender.tensor_parallel,
                    receiver.tensor_parallel,
                )
            )
        pipeline = one_f_one_b_seconds(
            stage_seconds,
            links,
            plan.micro_batches_of(r),
            blocking_p2p=context.constants.blocking_p2p,
        )
        slowest = max(slowest, pipeline)
    return slowest


def profile_refs(plan: Plan, context: PlanningContext) -> tuple[ProfileRef, ...]:
    """Every profile the plan's prediction rests on, measured or estimated (for PlanInputs).

    Compute: one per (GPU type, TP, micro-batch) the stages use. Network: one per link the
    pipeline boundaries and all-reduce rings cross; a link no profile covers is priced from
    the catalog and listed as estimated.
    """
    costs = context.costs
    refs: dict[str, ProfileRef] = {}
    for stage in plan.stages:
        for replica in stage.replicas:
            profile = context.profiles.compute_profile(
                plan.model.name, replica.gpu_type, stage.tensor_parallel, plan.micro_batch_size
            )
            if profile is not None:
                refs[profile.key] = ProfileRef(
                    key=profile.key,
                    source=profile.provenance.source,
                    version=profile.provenance.date or profile.provenance.tool_version,
                )
    pairs: list[tuple[Replica, Replica]] = []
    for k in range(plan.pipeline_depth - 1):
        pairs.extend(zip(plan.stages[k].replicas, plan.stages[k + 1].replicas, strict=True))
    for stage in plan.stages:
        ring = costs.ring_order(stage.replicas)
        if len(ring) > 1:
            pairs.extend((ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring)))
    for a, b in pairs:
        link = costs.link_class(a, b)
        if link in {"inter-zone", "inter-region"}:
            continue  # priced per zone pair (zone_links below)
        network = context.profiles.network_profile(link, a.gpu_type, b.gpu_type)
        if network is not None:
            refs[network.key] = ProfileRef(
                key=network.key,
                source=network.provenance.source,
                version=network.provenance.date or network.provenance.tool_version,
            )
        else:
            key = f"network/{link}/{a.gpu_type}/{b.gpu_type}"
            refs[key] = ProfileRef(key=key, source="estimated", version="catalog")
    for _, _, zone_link in zone_links(plan, context):
        known = refs.get(zone_link.key)
        if known is None or known.source == "measured":  # one direction estimated: estimated
            refs[zone_link.key] = ProfileRef(
                key=zone_link.key,
                source=zone_link.source,
                version=zone_link.how,
            )
    # What the network model priced from node shapes: the nodes' NICs under pipeline sends,
    # each stage's all-reduce (inside nodes, across them, measured collective or not).
    inputs: dict[str, tuple[Source, str]] = {}
    for k in range(plan.pipeline_depth - 1):
        for a, b in zip(plan.stages[k].replicas, plan.stages[k + 1].replicas, strict=True):
            inputs |= costs.nic_inputs(a) | costs.nic_inputs(b)
    for stage in plan.stages:
        inputs |= costs.allreduce_inputs(stage.replicas, stage.tensor_parallel)
    for key, (source, version) in inputs.items():
        refs[key] = ProfileRef(key=key, source=source, version=version)
    return tuple(refs[key] for key in sorted(refs))


def zone_links(plan: Plan, context: PlanningContext) -> list[tuple[Replica, Replica, ZoneLink]]:
    """Every link between two zones the plan's prediction crossed, sender first, with the
    curve it was priced from (CostModel.zone_link): both directions of each pipeline
    boundary between stages at the TP group's node shape (activations one way, gradients
    the other), each stage's all-reduce ring edges that change zone at the sender's node
    shape, and the edges of the rings that sum a shared parameter's gradient between stages
    (tied embeddings: CostModel.shared_gradient_seconds). One entry per (sender, receiver,
    shape), in plan order."""
    costs = context.costs
    found: dict[tuple[str, str, str, str, int], tuple[Replica, Replica, ZoneLink]] = {}
    edges: list[tuple[Replica, Replica, int]] = []
    for k in range(plan.pipeline_depth - 1):
        tp = min(plan.stages[k].tensor_parallel, plan.stages[k + 1].tensor_parallel)
        for a, b in zip(plan.stages[k].replicas, plan.stages[k + 1].replicas, strict=True):
            edges.append((a, b, costs.zone_link_gpus(a, b, tp)))
            edges.append((b, a, costs.zone_link_gpus(a, b, tp)))
    for stage in plan.stages:
        for a, b in costs.ring_zone_edges(costs.ring_order(stage.replicas)):
            edges.append((a, b, costs.gpus_per_node(a)))
    # the rings that sum shared parameters' gradients (tied embeddings) between stages
    ranges = [(s.layer_start, s.layer_end) for s in plan.stages]
    for _, users in sharing_stages(context.model, ranges):
        for r in range(plan.data_parallel):
            ends = [plan.stages[i] for i in users]
            for k, stage in enumerate(ends):
                nxt = ends[(k + 1) % len(ends)]
                tp = min(stage.tensor_parallel, nxt.tensor_parallel)
                a, b = stage.replicas[r], nxt.replicas[r]
                edges.append((a, b, costs.zone_link_gpus(a, b, tp)))
    for a, b, gpus in edges:
        if costs.link_class(a, b) not in {"inter-zone", "inter-region"}:
            continue
        key = (a.zone, a.gpu_type, b.zone, b.gpu_type, gpus)
        if key not in found:
            found[key] = (a, b, costs.zone_link(a, b, gpus))
    return list(found.values())
