"""Profiling Jobs: measure the compute and network profiles a TrainingJob's pools lack.

- needs: what is missing from the profile store, and what the profiling policy makes of it
- jobs: the batch/v1 Jobs (and rendezvous Service) that measure it
- report: the command a profiling pod's `report` container runs (prints results to its log)
- results: from that log to a profile-store ConfigMap
- status: pending/running/done/failed per need, and the Profiling condition
- importing: a profile directory as store ConfigMaps (`sailplan profiles import`)

How to call this from the TrainingJob reconcile (before planning):

    selected = snapshot.select_pools(job.spec.pools, observed.pools)
    needs = needs.missing_profiles(model, job.spec.training.global_batch_size,
                                   snapshot.build_snapshot(selected), observed.measured)
    decision = needs.profiling_decision(job.spec.profiling.mode, needs)
    create += jobs.render_profiling_objects(job, decision.launch, {p.name: p for p in selected})
    progress = status.profiling_status(needs, [observed_job(j) for j in profiling_job_bodies])
    conditions.append(progress.condition(job.generation))
    for key in progress.done:   # the handler: read the result pod's `report` log, then
        create_in_store(results.collect(log, need, profile_namespace, f"{ns}/{job_name}"))
    if not decision.may_plan: stay Pending with decision.message

No imports here: `report` runs inside the trainer image and must stay light.
"""
