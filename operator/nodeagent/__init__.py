"""The Sailplan node agent: locks the SM clocks of a TrainingJob's GPUs and measures energy.

A DaemonSet on GPU nodes (manifests/nodeagent) runs `python -m sailplan.operator.nodeagent`.
For worker pods of TrainingJobs that opted in (`spec.energy.clocks: NoSlowdown`, or the
deprecated annotation `sailplan.dev/energy-clocks: no-slowdown`) it locks each GPU to its
stage's no-slowdown SM clock (the plan's, planner/energy),
resets GPUs whose pod went, never touches other GPUs, and publishes the GPUs' measured
energy per training step as Prometheus metrics.

- nvml.py: the NVML calls it needs (real pynvml, or a fake for CPU-only machines);
- clocks.py: a Plan's per-worker clocks;
- assignment.py: the pure decision of which GPU gets which clock;
- energy.py: energy per step from counter samples;
- agent.py: the loop against the API server and NVML; __main__.py: the command.
"""
