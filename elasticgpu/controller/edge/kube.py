"""The only module of the controller that talks to the Kubernetes API: the calls per kind.

It speaks plain JSON dicts (the wire form of `elasticgpu.api` models). `KubeApi` names each read
and write the controller makes (GPUs, ElasticGPUs, claims, classes, pods, nodes, events); the
connection under them (requests, paged lists, watches, errors translated into
`elasticgpu.controller.errors`, reachability) is `requesting.KubeRequests`, which it extends.
"""

from __future__ import annotations

import logging

from kubernetes import client, config

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.edge.requesting import (
    MERGE,
    METADATA_LIST,
    POD_SELECTOR,
    STRATEGIC,
    WATCH_READ_MARGIN_S,
    Body,
    KubeRequests,
)
from elasticgpu.controller.settings import ApiSettings

__all__ = ["POD_SELECTOR", "WATCH_READ_MARGIN_S", "Body", "KubeApi"]

logger = logging.getLogger(__name__)
_QUOTAS = f"/apis/{names.GROUP}/{names.VERSION}"


class KubeApi(KubeRequests):
    """Typed-by-convention calls for the kinds the controller reads and writes.

    Objects go in and come out as dicts; callers validate them with the `elasticgpu.api`
    models. Writes that must not overwrite a concurrent change carry the resourceVersion the
    caller read (`metadata.resourceVersion` in the body or patch): the server answers 409.
    """

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: str | None = None, *, context: str | None = None, settings: ApiSettings | None = None
    ) -> KubeApi:
        """A client for the cluster of `kubeconfig` (default: in-cluster, then $KUBECONFIG)."""
        if kubeconfig is None:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]  # the client is untyped
                return cls(client.ApiClient(), settings=settings)
            except config.ConfigException:
                pass
        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=configuration)
        configuration.connection_pool_maxsize = 32
        return cls(client.ApiClient(configuration), settings=settings)

    # -- any watched kind (the periodic relist, flow/machinery/metadata_relist.py) ------------

    def list_metadata(self, kind: str, namespace: str | None = None) -> tuple[list[Body], str]:
        """The metadata of every object of a watched kind (`collection_path`), as
        PartialObjectMetadata (name, namespace, uid, resourceVersion, labels, annotations,
        managedFields; no spec, no status), and the list's resourceVersion."""
        return self.list_collection(self.collection_path(kind, namespace), accept=METADATA_LIST)

    def get_object(self, kind: str, namespace: str, name: str) -> Body:
        """One object of a watched kind, whole (`namespace` "" for a cluster-scoped kind); raises NotFound."""
        return self._call("GET", f"{self.collection_path(kind, namespace or None)}/{name}")

    # -- GPUs ----------------------------------------------------------------------------------

    def list_gpus(self) -> list[Body]:
        """Every GPU object (a live read: the quota resync confirms what the cards reserve before
        it lowers a charge)."""
        return self._list(self._cluster(names.PLURAL_GPU))[0]

    def get_gpu(self, name: str) -> Body:
        """One GPU object; raises NotFound."""
        return self._call("GET", self._cluster(names.PLURAL_GPU, name))

    def replace_gpu_status(self, body: Body) -> Body:
        """PUT the status of a GPU. `body.metadata.resourceVersion` is the precondition: this is
        the commit point of a reservation. Raises Conflict when the card changed meanwhile and
        Rejected when the CRD's rules refuse the allocations (oversubscription)."""
        name = body["metadata"]["name"]
        return self._call("PUT", self._cluster(names.PLURAL_GPU, name, status=True), body=body,
                          query=self._write_query())

    def create_gpu(self, body: Body) -> Body:
        """Create a GPU object (tests and the simulated agent)."""
        return self._call("POST", self._cluster(names.PLURAL_GPU), body=body, query=self._write_query())

    def delete_gpu(self, name: str, *, uid: str | None = None) -> None:
        """Delete a GPU object; with `uid`, only that incarnation of the name (Conflict otherwise)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}} if uid else None
        self._call("DELETE", self._cluster(names.PLURAL_GPU, name), body=body)

    # -- ElasticGPUs ---------------------------------------------------------------------------

    def list_elastic_gpus(self) -> list[Body]:
        """Every ElasticGPU."""
        return self._list(self._cluster(names.PLURAL_ELASTIC_GPU))[0]

    def get_elastic_gpu(self, name: str) -> Body:
        """One ElasticGPU; raises NotFound."""
        return self._call("GET", self._cluster(names.PLURAL_ELASTIC_GPU, name))

    def create_elastic_gpu(self, body: Body) -> Body:
        """Create an ElasticGPU; raises AlreadyExists when the name is taken."""
        return self._call("POST", self._cluster(names.PLURAL_ELASTIC_GPU), body=body, query=self._write_query())

    def patch_elastic_gpu(self, name: str, patch: Body) -> Body:
        """Merge-patch an ElasticGPU (metadata, spec); a resourceVersion in the patch is a precondition."""
        return self._call("PATCH", self._cluster(names.PLURAL_ELASTIC_GPU, name), body=patch, content_type=MERGE,
                          query=self._write_query())

    def patch_elastic_gpu_status(self, name: str, patch: Body) -> Body:
        """Merge-patch the status of an ElasticGPU."""
        return self._call("PATCH", self._cluster(names.PLURAL_ELASTIC_GPU, name, status=True), body=patch,
                          content_type=MERGE, query=self._write_query())

    def delete_elastic_gpu(self, name: str, *, uid: str | None = None) -> None:
        """Delete an ElasticGPU; with `uid`, only that incarnation of the name."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}} if uid else None
        self._call("DELETE", self._cluster(names.PLURAL_ELASTIC_GPU, name), body=body)

    # -- claims and classes --------------------------------------------------------------------

    def list_claims(self, namespace: str | None = None) -> list[Body]:
        """Every claim, of one namespace or of all."""
        return self._list(self._claims(namespace))[0]

    def get_claim(self, namespace: str, name: str) -> Body:
        """One claim; raises NotFound."""
        return self._call("GET", self._claims(namespace, name))

    def create_claim(self, body: Body) -> Body:
        """Create a claim (tests and benchmarks)."""
        namespace = body["metadata"]["namespace"]
        return self._call("POST", self._claims(namespace), body=body, query=self._write_query())

    def delete_claim(self, namespace: str, name: str) -> None:
        """Delete a claim (tests and benchmarks)."""
        self._call("DELETE", self._claims(namespace, name))

    def patch_claim(self, namespace: str, name: str, patch: Body) -> Body:
        """Merge-patch a claim's metadata and spec; a resourceVersion in the patch is a precondition."""
        return self._call("PATCH", self._claims(namespace, name), body=patch, content_type=MERGE,
                          query=self._write_query())

    def patch_claim_status(self, namespace: str, name: str, patch: Body) -> Body:
        """Merge-patch a claim's status."""
        return self._call("PATCH", self._claims(namespace, name, status=True), body=patch, content_type=MERGE,
                          query=self._write_query())

    # -- quotas (flow/quota_guard.py) ----------------------------------------------------------

    def list_quotas(self, namespace: str | None) -> list[Body]:
        """The ElasticGPUQuotas of one namespace, or (None) of all (a live read: the charge that
        follows is guarded by each one's resourceVersion). A few small objects read in a bind's
        path: the ordinary request timeout, not a large list's."""
        where = f"/namespaces/{namespace}" if namespace else ""
        return self._list(f"{_QUOTAS}{where}/{names.PLURAL_QUOTA}", timeout_s=self.settings.request_timeout_s)[0]

    def replace_quota_status(self, body: Body) -> Body:
        """PUT an ElasticGPUQuota's status; `body.metadata.resourceVersion` is the precondition
        (the commit point of a charge). Raises Conflict when the quota changed meanwhile."""
        meta = body["metadata"]
        path = f"{_QUOTAS}/namespaces/{meta['namespace']}/{names.PLURAL_QUOTA}/{meta['name']}/status"
        return self._call("PUT", path, body=body, query=self._write_query())

    def list_classes(self) -> list[Body]:
        """Every ElasticGPUClass."""
        return self._list(self._cluster(names.PLURAL_CLASS))[0]

    def create_class(self, body: Body) -> Body:
        """Create an ElasticGPUClass (tests)."""
        return self._call("POST", self._cluster(names.PLURAL_CLASS), body=body, query=self._write_query())

    def delete_class(self, name: str) -> None:
        """Delete an ElasticGPUClass (tests)."""
        self._call("DELETE", self._cluster(names.PLURAL_CLASS, name))

    # -- core kinds ----------------------------------------------------------------------------

    def list_pods(self, namespace: str | None = None) -> list[Body]:
        """Pods of one namespace or of all."""
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        return self._list(path)[0]

    def get_node(self, name: str) -> Body:
        """One Node; raises NotFound (the GPU garbage collection confirms a Node is gone with it)."""
        return self._call("GET", f"/api/v1/nodes/{name}")

    def list_nodes(self) -> list[Body]:
        """Every Node; an empty list where the caller may not read them."""
        return self._list("/api/v1/nodes")[0]

    # -- pods that use claims (pod_sync) -------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> Body:
        """One pod; raises NotFound."""
        return self._call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def patch_pod(self, namespace: str, name: str, patch: Body) -> Body:
        """Merge-patch a pod (metadata, spec); a resourceVersion in the patch is a precondition
        (the gate lift is one such update: node affinity added and the gate removed together)."""
        return self._call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", body=patch, content_type=MERGE,
                          query=self._write_query())

    def patch_pod_status(self, namespace: str, name: str, patch: Body) -> Body:
        """Strategic-merge-patch a pod's status: `status.conditions` merge by type, so the
        conditions of kubelet and the scheduler are kept without a resourceVersion."""
        return self._call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", body=patch,
                          content_type=STRATEGIC, query=self._write_query())

    def list_pods_on_node(self, node: str) -> list[Body]:
        """The pods bound to `node` (every pod, not only ours: their CPU and memory requests
        count against the node when a pod's WaitForFirstConsumer claims choose one). Read with
        resourceVersion 0, from the server's watch cache (kube-apiserver indexes spec.nodeName
        there) instead of a read through to etcd per decision: a list a moment old is as good
        as the scheduler's own cache for a fit check."""
        page = self._call("GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}",
                                                        "resourceVersion": "0"}, timeout_s=60.0)
        return list(page.get("items") or [])

    # -- preemption (flow/preemption/preempting.py) ---------------------------------------------------------

    def evict_pod(self, namespace: str, name: str, *, uid: str | None = None, dry_run: bool = False) -> None:
        """Evict a pod through the Eviction API (policy/v1), so that PodDisruptionBudgets are honoured.
        Raises EvictionBlocked (HTTP 429) while a budget allows no disruption, and NotFound when the pod
        is gone or the server has no eviction subresource (the caller tells the two apart). `dry_run`: the
        server checks the budgets and evicts nothing (`deleteOptions.dryRun: [All]`, as `kubectl drain
        --dry-run=server` asks)."""
        body: Body = {"apiVersion": "policy/v1", "kind": "Eviction",
                      "metadata": {"name": name, "namespace": namespace}}
        options: Body = {}
        if uid:
            options["preconditions"] = {"uid": uid}
        if dry_run:
            options["dryRun"] = ["All"]
        if options:
            body["deleteOptions"] = options
        try:
            self._call("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=body)
        except errors.ApiUnavailable as err:
            if err.status == 429:
                raise errors.EvictionBlocked(f"pod {namespace}/{name}: eviction refused for now (HTTP 429, a"
                                             f" PodDisruptionBudget allows no disruption): {err}", status=429) from None
            raise

    def delete_pod(self, namespace: str, name: str, *, uid: str | None = None,
                   grace_period_s: int | None = None) -> None:
        """Delete a pod (with `uid`, only that incarnation; with `grace_period_s`, that grace, 0: gone
        at once without its kubelet's word); for servers without the eviction subresource."""
        options: Body = {}
        if uid:
            options["preconditions"] = {"uid": uid}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        body = {"kind": "DeleteOptions", "apiVersion": "v1", **options} if options else None
        self._call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body)

    def get_priority_class(self, name: str) -> Body:
        """One PriorityClass (scheduling.k8s.io/v1); raises NotFound."""
        return self._call("GET", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")

    def delete_claim_of(self, namespace: str, name: str, *, uid: str) -> None:
        """Delete that incarnation (`uid`) of a claim; NotFound when gone, Conflict when the name
        now belongs to another claim (a recreated pod's inline claim must survive)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid},
                "propagationPolicy": "Background"}
        self._call("DELETE", self._claims(namespace, name), body=body)


    # -- node autoscalers (flow/node_autoscaling.py) ------------------------------------------

    def list_labelled_pods(self, namespace: str, selector: str) -> list[Body]:
        """The pods of `namespace` with labels matching `selector` (the placeholder pods)."""
        page = self._call("GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector},
                          timeout_s=self.settings.request_timeout_s)
        return list(page.get("items") or [])

    def create_pod(self, namespace: str, body: Body) -> Body:
        """Create a pod; raises AlreadyExists when the name is taken."""
        return self._call("POST", f"/api/v1/namespaces/{namespace}/pods", body=body, query=self._write_query())

    def patch_node(self, name: str, patch: Body) -> Body:
        """Merge-patch a Node's metadata (the autoscalers' annotations)."""
        return self._call("PATCH", f"/api/v1/nodes/{name}", body=patch, content_type=MERGE,
                          query=self._write_query())

    def create_event(self, namespace: str, body: Body) -> None:
        """Create a core/v1 Event. Failures are logged, never raised: an Event is a courtesy."""
        try:
            self._call("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        except (errors.ApiError, errors.NotFound) as err:  # NotFound: its namespace is being deleted
            logger.debug("event not written", extra={"namespace": namespace, "error": str(err)})

    def list_events(self, namespace: str) -> list[Body]:
        """Events of a namespace (tests)."""
        return self._list(f"/api/v1/namespaces/{namespace}/events")[0]
