"""The operator's I/O against the API server, in one thin layer over the kubernetes client.

Every call is synchronous (the handlers run them in a thread). Creation is idempotent: a
409 Conflict means the object is already there under its deterministic name, which after
a restart is exactly the expected case. Lists are read as raw JSON (no model objects), which
is both what the pure reconcile functions take and much faster for hundreds of items.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sailplan.operator.api.common import GROUP, VERSION
from sailplan.operator.api.gpupool import PLURAL as POOLS
from sailplan.operator.api.trainingjob import PLURAL as JOBS
from sailplan.operator.profiling.jobs import ROLE_PROFILER
from sailplan.operator.reconcile import kueue, naming, provisioning

MERGE_PATCH = "application/merge-patch+json"
# The operator's name in every object's metadata.managedFields. The API server takes a
# writer's field manager from its User-Agent (up to the first "/") when the request names
# none; the client library's default ("OpenAPI-Generator") would be the same for any Python
# client, so a GitOps user could not tell the operator's entries (status only) from others.
FIELD_MANAGER = "sailplan-operator"


def as_field_manager(api_client: client.ApiClient) -> client.ApiClient:
    """`api_client`, its writes recorded under FIELD_MANAGER (called where the operator's
    client is made, so Lease, status and child writes all carry it)."""
    api_client.user_agent = FIELD_MANAGER
    return api_client


class Kube:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)

    @staticmethod
    def _json(response: Any) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(response.data)
        return loaded

    # -- reads ----------------------------------------------------------------------------
    def get_job(self, namespace: str, name: str, version: str = VERSION) -> dict[str, Any] | None:
        """The TrainingJob as `version` shows it (the deprecated one only for migrations)."""
        try:
            return self._json(
                self.custom.get_namespaced_custom_object(
                    GROUP, version, namespace, JOBS, name, _preload_content=False
                )
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list_pools(self) -> list[dict[str, Any]]:
        body = self._json(
            self.custom.list_cluster_custom_object(GROUP, VERSION, POOLS, _preload_content=False)
        )
        items: list[dict[str, Any]] = body.get("items", [])
        return items

    def priority_class_value(self, name: str) -> int | None:
        """The value of PriorityClass `name`; None if there is none of that name."""
        try:
            found = self.scheduling.read_priority_class(name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        value: int | None = found.value
        return value

    # -- ProvisioningRequests (autoscaling.x-k8s.io; the CRD may not be installed) ---------
    def create_provisioning_request(self, obj: dict[str, Any]) -> bool:
        """Create it; False if it already existed."""
        try:
            self.custom.create_namespaced_custom_object(
                provisioning.GROUP,
                provisioning.VERSION,
                obj["metadata"]["namespace"],
                provisioning.PLURAL,
                obj,
            )
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    def get_provisioning_request(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._json(
                self.custom.get_namespaced_custom_object(
                    provisioning.GROUP,
                    provisioning.VERSION,
                    namespace,
                    provisioning.PLURAL,
                    name,
                    _preload_content=False,
                )
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list_provisioning_requests(self, label_selector: str) -> list[dict[str, Any]]:
        """The operator's requests in every namespace; none where the CRD is not installed."""
        try:
            body = self._json(
                self.custom.list_cluster_custom_object(
                    provisioning.GROUP,
                    provisioning.VERSION,
                    provisioning.PLURAL,
                    label_selector=label_selector,
                    _preload_content=False,
                )
            )
        except ApiException as error:
            if error.status == 404:
                return []
            raise
        items: list[dict[str, Any]] = body.get("items", [])
        return items

    def provisioning_requests_served(self) -> bool:
        """Whether the API server serves ProvisioningRequests (their CRD is installed)."""
        try:
            self.custom.list_cluster_custom_object(
                provisioning.GROUP,
                provisioning.VERSION,
                provisioning.PLURAL,
                limit=1,
                _preload_content=False,
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def delete_provisioning_request(self, body: Mapping[str, Any]) -> None:
        """Delete one of the operator's requests and the PodTemplates it references."""
        metadata = body["metadata"]
        namespace = metadata["namespace"]
        self._unless_gone(
            self.custom.delete_namespaced_custom_object,
            provisioning.GROUP,
            provisioning.VERSION,
            namespace,
            provisioning.PLURAL,
            metadata["name"],
        )
        for template in provisioning.pod_template_names(body):
            self._unless_gone(self.core.delete_namespaced_pod_template, template, namespace)

    def list_live_workers(self) -> list[dict[str, Any]]:
        """Every namespace's worker pods that have not finished, bound or not: the GPUs the
        jobs' plans hold or reserve, read fresh (a watch may not have delivered a pod created
        or bound just now, and the GPUPool status that counts bound ones is written later)."""
        items: list[dict[str, Any]] = self._json(
            self.core.list_pod_for_all_namespaces(
                label_selector=naming.LABEL_GPUPOOL,
                field_selector="status.phase!=Succeeded,status.phase!=Failed",
                _preload_content=False,
            )
        ).get("items", [])
        return items

    def list_running_pods(self, label_selector: str) -> list[dict[str, Any]]:
        """Every namespace's running pods with these labels (rank 0 of every job, for its
        progress: controller.progress)."""
        items: list[dict[str, Any]] = self._json(
            self.core.list_pod_for_all_namespaces(
                label_selector=label_selector,
                field_selector="status.phase=Running",
                _preload_content=False,
            )
        ).get("items", [])
        return items

    def list_job_children(
        self, namespace: str, job: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
        """(worker pods, plan ConfigMaps, whether the rendezvous Service exists)."""
        pods = self._json(
            self.core.list_namespaced_pod(
                namespace,
                label_selector=f"{naming.LABEL_JOB}={job},{naming.LABEL_ROLE}={naming.ROLE_WORKER}",
                _preload_content=False,
            )
        ).get("items", [])
        plans = self._json(
            self.core.list_namespaced_config_map(
                namespace,
                label_selector=f"{naming.LABEL_JOB}={job},{naming.LABEL_ROLE}={naming.ROLE_PLAN}",
                _preload_content=False,
            )
        ).get("items", [])
        try:
            self.core.read_namespaced_service(naming.service_name(job), namespace)
            service = True
        except ApiException as error:
            if error.status != 404:
                raise
            service = False
        return pods, plans, service

    def list_profiling_jobs(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The batch/v1 Jobs measuring profiles for one TrainingJob."""
        selector = f"{naming.LABEL_JOB}={job},{naming.LABEL_ROLE}={ROLE_PROFILER}"
        items: list[dict[str, Any]] = self._json(
            self.batch.list_namespaced_job(
                namespace, label_selector=selector, _preload_content=False
            )
        ).get("items", [])
        return items

    def succeeded_pod_log(
        self, namespace: str, labels: Mapping[str, str], container: str
    ) -> str | None:
        """The log of `container` in the newest Succeeded pod with `labels`; None if no such
        pod exists (a Job's pods may be gone after its TTL)."""
        selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        pods = self._json(
            self.core.list_namespaced_pod(
                namespace, label_selector=selector, _preload_content=False
            )
        ).get("items", [])
        done = sorted(
            (p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"),
            key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
        )
        if not done:
            return None
        text: str = self.core.read_namespaced_pod_log(
            done[-1]["metadata"]["name"], namespace, container=container
        )
        return text

    def list_nodes(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._json(self.core.list_node(_preload_content=False)).get(
            "items", []
        )
        return items

    def node_labels(self) -> dict[str, dict[str, str]]:
        items = self._json(self.core.list_node(_preload_content=False)).get("items", [])
        return {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in items}

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One ConfigMap (a job's state ConfigMap); None if there is none of that name."""
        try:
            return self._json(
                self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list_profile_configmaps(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._json(
            self.core.list_namespaced_config_map(
                namespace, label_selector=naming.LABEL_PROFILE, _preload_content=False
            )
        ).get("items", [])
        return items

    # -- Kueue Workloads (kueue.x-k8s.io; the CRD may not be installed) --------------------
    def list_workloads(self, namespace: str, job: str) -> list[dict[str, Any]] | None:
        """The job's Workloads; None where the API server does not serve Workloads."""
        selector = f"{naming.LABEL_JOB}={job},{naming.LABEL_ROLE}={kueue.ROLE_WORKLOAD}"
        try:
            body = self._json(
                self.custom.list_namespaced_custom_object(
                    kueue.GROUP,
                    kueue.VERSION,
                    namespace,
                    kueue.PLURAL,
                    label_selector=selector,
                    _preload_content=False,
                )
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        items: list[dict[str, Any]] = body.get("items", [])
        return items

    def _create_workload(self, namespace: str, obj: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, namespace, kueue.PLURAL, obj
        )

    def patch_workload(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch one of the operator's Workloads (a resourceVersion in the patch makes
        the API server refuse it, 409, if the Workload changed since it was read)."""
        self.custom.patch_namespaced_custom_object(
            kueue.GROUP,
            kueue.VERSION,
            namespace,
            kueue.PLURAL,
            name,
            patch,
            _content_type=MERGE_PATCH,
        )

    def workloads_served(self) -> bool:
        """Whether the API server serves Kueue's Workloads (Kueue is installed)."""
        try:
            self.custom.list_cluster_custom_object(
                kueue.GROUP, kueue.VERSION, kueue.PLURAL, limit=1, _preload_content=False
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def delete_workload(self, namespace: str, name: str) -> None:
        self._unless_gone(
            self.custom.delete_namespaced_custom_object,
            kueue.GROUP,
            kueue.VERSION,
            namespace,
            kueue.PLURAL,
            name,
        )

    # -- storage-version migration (controller.storage) ------------------------------------
    def get_crd(self, name: str) -> dict[str, Any] | None:
        try:
            return self._json(
                client.ApiextensionsV1Api(self.api_client).read_custom_resource_definition(
                    name, _preload_content=False
                )
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def set_stored_versions(self, name: str, versions: list[str]) -> None:
        """The CRD's status.storedVersions, once no object is stored at another version."""
        client.ApiextensionsV1Api(self.api_client).patch_custom_resource_definition_status(
            name, {"status": {"storedVersions": versions}}
        )

    def list_objects(self, plural: str, version: str = VERSION) -> list[dict[str, Any]]:
        """Every GPUPool or TrainingJob (all namespaces) as `version` shows it."""
        body = self._json(
            self.custom.list_cluster_custom_object(GROUP, version, plural, _preload_content=False)
        )
        items: list[dict[str, Any]] = body.get("items", [])
        return items

    def replace_object(self, plural: str, body: dict[str, Any]) -> None:
        """PUT an object back as read (at its resourceVersion: 409 if it changed since), so
        the API server stores it again, encoded at the storage version."""
        metadata = body["metadata"]
        namespace = metadata.get("namespace")
        if namespace:
            self.custom.replace_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, metadata["name"], body
            )
        else:
            self.custom.replace_cluster_custom_object(
                GROUP, VERSION, plural, metadata["name"], body
            )

    # -- writes ---------------------------------------------------------------------------
    def create(self, obj: dict[str, Any]) -> bool:
        """Create a namespaced ConfigMap, Service, Pod, Job, PodTemplate or Kueue Workload;
        False if it already existed."""
        namespace = obj["metadata"]["namespace"]
        creators: dict[str, Callable[..., Any]] = {
            "ConfigMap": self.core.create_namespaced_config_map,
            "Service": self.core.create_namespaced_service,
            "Pod": self.core.create_namespaced_pod,
            "Job": self.batch.create_namespaced_job,
            "PodTemplate": self.core.create_namespaced_pod_template,
            kueue.KIND: self._create_workload,
        }
        try:
            creators[obj["kind"]](namespace, obj)
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    def put_configmap(self, obj: dict[str, Any]) -> bool:
        """Create or replace a ConfigMap (an explicit import overwrites); True if created."""
        if self.create(obj):
            return True
        meta = obj["metadata"]
        body: Any = obj  # the client serialises dicts as they are
        self.core.replace_namespaced_config_map(meta["name"], meta["namespace"], body)
        return False

    def write_configmap(self, obj: dict[str, Any]) -> bool:
        """Create a ConfigMap, or replace it when `obj` carries the resourceVersion it was
        read at (the API server refuses with 409 if it changed since); False when a create
        found one already there."""
        meta = obj["metadata"]
        if not meta.get("resourceVersion"):
            return self.create(obj)
        body: Any = obj
        self.core.replace_namespaced_config_map(meta["name"], meta["namespace"], body)
        return True

    @staticmethod
    def _unless_gone(call: Callable[..., Any], *args: Any) -> None:
        """Run a write on an object that may have been deleted meanwhile: 404 is not an error."""
        try:
            call(*args)
        except ApiException as error:
            if error.status != 404:
                raise

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """Delete a TrainingJob, only the one with `uid` (not a newer one of the same name);
        its children go with it (ownerReferences)."""
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
            propagation_policy="Background",
        )
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, JOBS, name, body=options
            )
        except ApiException as error:
            # 404: gone already; 409: the uid precondition failed (a new job of that name).
            if error.status not in (404, 409):
                raise

    def delete_pod(self, namespace: str, name: str) -> None:
        self._unless_gone(self.core.delete_namespaced_pod, name, namespace)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge `annotations` into a pod's."""
        patch = {"metadata": {"annotations": annotations}}
        self._unless_gone(self.core.patch_namespaced_pod, name, namespace, patch)

    def annotate_batch_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge `annotations` into a batch/v1 Job's."""
        patch = {"metadata": {"annotations": annotations}}
        self._unless_gone(self.batch.patch_namespaced_job, name, namespace, patch)

    def patch_job_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, JOBS, name, {"status": patch}, _content_type=MERGE_PATCH
        )

    def patch_pool_status(self, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_cluster_custom_object_status(
            GROUP, VERSION, POOLS, name, {"status": patch}, _content_type=MERGE_PATCH
        )
