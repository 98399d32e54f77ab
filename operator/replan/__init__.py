"""Replanning: keep a TrainingJob on the best plan for the cluster it has right now.

- triggers: what changed (preemption vs real failure vs node loss, capacity, prices, spec)
- cost: restart cost and the gain a switch must beat
- decision: keep, switch (to which plan) or wait
- state: ReplanState, kept in the job's state ConfigMap between passes (reconcile.memory)
- machine: next_state(state, inputs, now, context) -> (state, actions)

How to call this from the TrainingJob reconcile (once a plan generation exists):

    pods = [f for body in worker_pod_bodies if (f := triggers.pod_facts(body))]
    selected = snapshot.select_pools(job.spec.pools, observed.pools)
    inputs = decision.ReplanInputs(
        job=job, model=resolve_model(job, catalog), plan=<plan of state.generation>,
        pods=tuple(pods), nodes=<NodeInfo by name>, measured=observed.measured,
        cluster=triggers.capacity_snapshot(selected, pods, nodes),
    )
    state = job.memory.replan or machine.initial_state(job, gen, attempt, plan,
    #                                      cluster=<snapshot planned on>, measured=...)
    state, actions = machine.next_state(state, inputs, now, ReplanContext(make_plan, catalog))
    # 1. memory.replan = state (the state ConfigMap); status: history gets
    #    machine.history_entry(state.switch) once (when no entry has its generation),
    #    condition machine.replanning_condition(state, job.generation), phase Replanning
    #    while state.phase is Draining/Switching/Waiting;
    # 2. perform the actions (annotate, delete, create with 409 = done, Events).

While the state is Draining, workers exit 0 after their checkpoint: the reconcile must not
read that as the job having Succeeded.
"""
