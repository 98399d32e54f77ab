"""Pure reconcile logic: observed objects in, desired children and new status out.

Nothing here performs I/O, reads a clock or touches Kubernetes clients: the Kopf handlers
(sailplan.operator.controller) observe, call these functions, and apply what they return.
That keeps every decision testable without a cluster and makes a restart of the operator
harmless: the functions only ever look at what is stored in the cluster.
"""
