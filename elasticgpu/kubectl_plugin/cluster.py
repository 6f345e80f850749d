"""What `kubectl egpu` reads from the cluster: the plugin's only user of the Kubernetes API.

It loads the kubeconfig as kubectl does (`--kubeconfig`, else $KUBECONFIG, else ~/.kube/config;
`--context`; the context's namespace unless `-n` is given) and returns the objects as the
models of `elasticgpu.api`. Reading is all it does, but for `release --force`, which sets one
annotation on one ElasticGPU (`annotate_elastic_gpu`), and `handover`, an admin's command that cordons a
node, evicts its GPU pods, labels it and deletes its GPU objects (the Node methods at the end).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from elasticgpu import user_errors
from elasticgpu.api import GPU, ElasticGPU, ElasticGPUClaim, ElasticGPUClass, names

DEFAULT_NAMESPACE = "default"
REQUEST_TIMEOUT_S = 30.0
"""Seconds per API call: a server that hangs fails the command instead of hanging it."""


@dataclass
class Cluster:
    """A read-only view of one cluster through one kubeconfig context."""

    api: client.ApiClient
    namespace: str
    """The namespace of claims: `-n`, else the kubeconfig context's, else `default`."""

    @classmethod
    def connect(cls, *, kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
        """Load the kubeconfig (errors become the boundary's one-line messages)."""
        # The kubernetes client ships no type hints; its ApiClient is typed where we use it.
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context
        )
        if namespace is None:
            contexts: list[dict[str, Any]]
            active: dict[str, Any]
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
            namespace = str(((chosen or {}).get("context") or {}).get("namespace") or DEFAULT_NAMESPACE)
        return cls(api=api, namespace=namespace)

    def _custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def _list(self, plural: str) -> list[dict[str, Any]]:
        try:
            answer = self._custom().list_cluster_custom_object(
                names.GROUP, names.VERSION, plural, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as err:
            raise _api_error(err, f"{plural}.{names.GROUP}") from None
        # The client types the answer as `object`; a list answer is a dict with `items`.
        items: list[dict[str, Any]] = answer.get("items") or [] if isinstance(answer, dict) else []
        return items

    def gpus(self) -> list[GPU]:
        """Every GPU object of the cluster."""
        return [GPU.model_validate(item) for item in self._list(names.PLURAL_GPU)]

    def classes(self) -> list[ElasticGPUClass]:
        """Every ElasticGPUClass."""
        return [ElasticGPUClass.model_validate(item) for item in self._list(names.PLURAL_CLASS)]

    def elastic_gpus(self) -> list[ElasticGPU]:
        """Every ElasticGPU of the cluster (`usage`)."""
        return [ElasticGPU.model_validate(item) for item in self._list(names.PLURAL_ELASTIC_GPU)]

    def claims(self) -> list[ElasticGPUClaim]:
        """Every claim of every namespace (`usage`)."""
        return [ElasticGPUClaim.model_validate(item) for item in self._list(names.PLURAL_CLAIM)]

    def claim(self, name: str) -> ElasticGPUClaim:
        """The claim `name` of this namespace; a missing one is the user's mistake, told as such."""
        try:
            body = self._custom().get_namespaced_custom_object(
                names.GROUP, names.VERSION, self.namespace, names.PLURAL_CLAIM, name,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except ApiException as err:
            if err.status == 404:
                raise user_errors.UserError(
                    f"ElasticGPUClaim {name} not found in namespace {self.namespace}: check the name"
                    f" (kubectl get egpuc -n {self.namespace}) or pass -n NAMESPACE"
                ) from None
            raise _api_error(err, f"elasticgpuclaims.{names.GROUP}") from None
        return ElasticGPUClaim.model_validate(body)

    def elastic_gpu(self, name: str) -> ElasticGPU | None:
        """The ElasticGPU `name`, or None when there is none."""
        try:
            body = self._custom().get_cluster_custom_object(
                names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU, name, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise _api_error(err, f"elasticgpus.{names.GROUP}") from None
        return ElasticGPU.model_validate(body)

    def annotate_elastic_gpu(self, name: str, annotations: dict[str, str]) -> None:
        """Merge `annotations` into the ElasticGPU `name`'s (a merge patch of metadata.annotations only)."""
        try:
            self._custom().patch_cluster_custom_object(
                names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU, name,
                {"metadata": {"annotations": annotations}}, _request_timeout=REQUEST_TIMEOUT_S,
            )
        except ApiException as err:
            if err.status == 404:
                raise user_errors.UserError(f"ElasticGPU {name} not found: check the name (kubectl get egpu)") from None
            if err.status in (401, 403):
                raise user_errors.UserError(
                    f"the API server refused to annotate ElasticGPU {name} ({err.status} {err.reason}): the"
                    " kubeconfig's user needs patch on elasticgpus (an admin's command)") from None
            raise _api_error(err, f"elasticgpus.{names.GROUP}") from None

    def pods_using_claims(self) -> list[dict[str, Any]]:
        """The pods of this namespace that use claims (the webhook labels them), as API bodies."""
        try:
            pods = client.CoreV1Api(self.api).list_namespaced_pod(
                self.namespace, label_selector=f"{names.LABEL_USES_CLAIMS}=true", _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as err:
            if err.status == 403:
                return []  # a user who may read claims but not pods still gets the claim's answer
            raise _api_error(err, "pods") from None
        bodies: list[dict[str, Any]] = [
            self.api.sanitize_for_serialization(pod)  # type: ignore[no-untyped-call]
            for pod in pods.items
        ]
        return bodies

    def node_labels(self) -> dict[str, dict[str, str]]:
        """Labels of every node (a class's nodeSelector matches them); empty when nodes may not be listed."""
        try:
            nodes = client.CoreV1Api(self.api).list_node(_request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as err:
            if err.status == 403:
                return {}  # a user who may read claims but not nodes still gets an answer
            raise _api_error(err, "nodes") from None
        return {str(n.metadata.name): dict(n.metadata.labels or {}) for n in nodes.items if n.metadata is not None}


    # The Node and its pods, for `handover` and `doctor` (an admin's commands) ----------------------------------

    def _core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def _body(self, obj: Any) -> dict[str, Any]:
        body: dict[str, Any] = self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return body

    def node(self, name: str) -> dict[str, Any]:
        """The Node `name` as an API body; a missing one is the user's mistake."""
        try:
            return self._body(self._core().read_node(name, _request_timeout=REQUEST_TIMEOUT_S))
        except ApiException as err:
            if err.status == 404:
                raise user_errors.UserError(f"Node {name} not found: check the name (kubectl get nodes)") from None
            raise _api_error(err, "nodes") from None

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        """A merge patch of the Node `name` (labels, annotations, spec.unschedulable)."""
        try:
            self._core().patch_node(name, body, _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as err:
            raise _write_error(err, f"patch Node {name}", "patch on nodes") from None

    def pods_on_node(self, node: str, *, label_selector: str = "") -> list[dict[str, Any]]:
        """The pods of every namespace on `node` (spec.nodeName), as API bodies."""
        try:
            pods = self._core().list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}",
                                                            label_selector=label_selector,
                                                            _request_timeout=REQUEST_TIMEOUT_S)  # fmt: skip
        except ApiException as err:
            raise _api_error(err, "pods") from None
        return [self._body(pod) for pod in pods.items]

    def evict(self, namespace: str, name: str, *, grace_s: int | None) -> bool:
        """Ask the API server to evict a pod (policy/v1 Eviction: PodDisruptionBudgets are honoured). True when
        it is evicted or gone; False when a budget refuses it now (429: try again later)."""
        options = client.V1DeleteOptions(grace_period_seconds=grace_s) if grace_s is not None else None
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace), delete_options=options)
        try:
            self._core().create_namespaced_pod_eviction(name, namespace, body, _preload_content=False,
                                                        _request_timeout=REQUEST_TIMEOUT_S)  # fmt: skip
        except ApiException as err:
            if err.status == 429:
                return False
            if err.status == 404 and self._pod_exists(namespace, name):
                raise user_errors.UserError(
                    f"the API server serves no eviction of pods (pods/eviction answered 404 for {namespace}/{name}):"
                    " pass --disable-eviction to delete the pods instead (PodDisruptionBudgets are then not"
                    " consulted)") from None
            if err.status == 404:
                return True
            raise _write_error(err, f"evict pod {namespace}/{name}", "create on pods/eviction") from None
        return True

    def _pod_exists(self, namespace: str, name: str) -> bool:
        try:
            self._core().read_namespaced_pod(name, namespace, _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as err:
            if err.status == 404:
                return False
            raise _api_error(err, "pods") from None
        return True

    def delete_pod(self, namespace: str, name: str, *, grace_s: int | None) -> None:
        """Delete a pod (--disable-eviction), gone already is fine."""
        try:
            # Not read back: an immediate deletion answers a Status, which the client cannot read as a Pod.
            self._core().delete_namespaced_pod(name, namespace, grace_period_seconds=grace_s, _preload_content=False,
                                               _request_timeout=REQUEST_TIMEOUT_S)  # fmt: skip
        except ApiException as err:
            if err.status != 404:
                raise _write_error(err, f"delete pod {namespace}/{name}", "delete on pods") from None

    def node_gpus(self, node: str) -> list[dict[str, Any]]:
        """The GPU objects of `node` (the agent labels each with its node), as API bodies."""
        try:
            answer = self._custom().list_cluster_custom_object(
                names.GROUP, names.VERSION, names.PLURAL_GPU, label_selector=f"{names.LABEL_NODE}={node}",
                _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as err:
            raise _api_error(err, f"{names.PLURAL_GPU}.{names.GROUP}") from None
        items: list[dict[str, Any]] = answer.get("items") or [] if isinstance(answer, dict) else []
        return items

    def delete_gpu(self, name: str) -> None:
        """Delete one GPU object (gone already is fine)."""
        try:
            self._custom().delete_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_GPU, name,
                                                        _request_timeout=REQUEST_TIMEOUT_S)  # fmt: skip
        except ApiException as err:
            if err.status != 404:
                raise _write_error(err, f"delete GPU {name}", f"delete on {names.PLURAL_GPU}") from None

    def elastic_gpu_bodies(self) -> list[dict[str, Any]]:
        """Every ElasticGPU as an API body."""
        return self._list(names.PLURAL_ELASTIC_GPU)

    def claim_bodies(self) -> list[dict[str, Any]]:
        """Every ElasticGPUClaim, of every namespace, as an API body."""
        return self._list(names.PLURAL_CLAIM)

    def node_events(self, node: str) -> list[dict[str, Any]]:
        """The Events about the Node `node`, oldest first; [] when Events may not be listed."""
        try:
            events = self._core().list_event_for_all_namespaces(
                field_selector=f"involvedObject.kind=Node,involvedObject.name={node}",
                _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as err:
            if err.status in (400, 403):
                return []
            raise _api_error(err, "events") from None
        bodies = [self._body(event) for event in events.items]
        return sorted(bodies, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def _write_error(err: ApiException, what: str, permission: str) -> user_errors.UserError:
    if err.status in (401, 403):
        return user_errors.UserError(f"the API server refused to {what} ({err.status} {err.reason}): the kubeconfig's"
                                     f" user needs {permission} (an admin's command)")  # fmt: skip
    return user_errors.UserError(f"{what}: the API server answered {err.status} {err.reason}: run the command again")


def _api_error(err: ApiException, resource: str) -> user_errors.UserError:
    """An API refusal the user can act on, in one line."""
    if err.status == 404:
        return user_errors.UserError(
            f"the cluster does not serve {resource}: install the CRDs (elasticgpu crds --apply, or the chart in"
            " deploy/chart)"
        )
    if err.status in (401, 403):
        return user_errors.UserError(
            f"the API server refused to list {resource} ({err.status} {err.reason}): the kubeconfig's user needs"
            " get/list on it (RBAC)"
        )
    return user_errors.UserError(f"the API server answered {err.status} {err.reason} for {resource}: try again")
