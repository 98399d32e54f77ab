"""The agent's reads of the API server (agent.ClusterView) over the kubernetes client.

Only reads, as the agent's ClusterRole allows (get/list/watch pods, get configmaps, get
trainingjobs): the agent never writes to the API. Raw JSON, like the operator's kube.py.
A 404 is None; other API errors propagate, and the loop logs them and retries next pass.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sailplan.operator.api.common import GROUP, VERSION

JOBS = "trainingjobs"


class KubeView:
    def __init__(self, api_client: client.ApiClient, node_name: str) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.node_name = node_name

    @staticmethod
    def _json(response: Any) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(response.data)
        return loaded

    def node_pods(self) -> list[dict[str, Any]]:
        body = self._json(
            self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node_name}", _preload_content=False
            )
        )
        items: list[dict[str, Any]] = body.get("items", [])
        return items

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._json(
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, JOBS, name, _preload_content=False
                )
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._json(
                self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
