"""A real Kubernetes control plane on loopback for tests, e2e runs and the quickstart.

etcd, kube-apiserver, kube-scheduler, kube-controller-manager and the kwok controller are
built from their Go modules (build), started by kwokctl's binary runtime (kwokctl), filled
with GKE-like fake GPU nodes created through the API (nodes), and exposed through a
kubeconfig (LocalCluster in cluster). No Docker, no kubelet: kwok plays the kubelets.
"""
