"""Sailplan's development tooling: not part of the product.

A real Kubernetes control plane on loopback built from Go modules (`localcluster`), a kubelet
emulator that runs the pods bound to its nodes as local processes (`localcluster.podrunner`),
server-side apply of YAML without kubectl (`apply`), and the quickstart (`demo`). The tests,
the benchmarks and the README's demo use it; the operator, the planner and the trainer never
import it (an import-linter contract in pyproject.toml forbids it), and neither the product
wheel nor the operator image contains it. Installed with `pip install -e ./dev`.
"""
