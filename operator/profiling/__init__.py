"""Profiling Jobs: measure the compute and network profiles a TrainingJob's pools lack.

- needs: what is missing from the profile store, and what the profiling policy makes of it
- jobs: the batch/v1 Jobs (and rendezvous Service) that measure it
- report: the command a profiling pod's `report` container runs (prints results to its log)
- results: from that log to a profile-store ConfigMap
- status: pending/running/done/failed per need, and the Profiling condition
- importing: a profile directory as store ConfigMaps (`sailplan profiles import`)

- step: what one TrainingJob reconcile pass does about all of the above (pure)

The TrainingJob reconcile calls step.profiling_step on every pass and merges what it returns
(Jobs to create, the Profiling condition, Events; under policy Auto the nodes to keep free
of workers); the Kopf handler collects the results of finished needs (the `report` log
through pods/log, then a store ConfigMap via results.collect) and marks unreadable ones.

No imports here: `report` runs inside the trainer image and must stay light.
"""
