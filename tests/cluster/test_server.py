"""The API server of the tests is real and usable by the Python client and kubectl.

These run against the local test server, or any cluster given by ELASTICGPU_TEST_KUBECONFIG; the
webhook test needs the API server to reach 127.0.0.1 of this machine, so it runs locally only.
"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.kube_cluster import TestCluster, _write_certs, kube_request, server_side_apply, wait_established

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def test_python_client_lists_namespaces(api_client: client.ApiClient) -> None:
    names = {ns.metadata.name for ns in client.CoreV1Api(api_client).list_namespace().items}
    assert {"default", "kube-system"} <= names


def test_version_with_and_without_trailing_slash(api_client: client.ApiClient) -> None:
    # The Python client asks /version/ (trailing slash); kubectl asks /version.
    assert client.VersionApi(api_client).get_code().git_version.startswith("v1.")
    for path in ("/version", "/version/"):
        response = kube_request(api_client, "GET", path)
        assert response.status == 200, (path, response.body)
        assert response.json()["major"] == "1"


def test_discovery_api_and_apis(api_client: client.ApiClient) -> None:
    for path in ("/api", "/api/"):
        response = kube_request(api_client, "GET", path)
        assert response.status == 200, (path, response.body)
        assert response.json()["kind"] == "APIVersions"
        assert "v1" in response.json()["versions"]
    for path in ("/apis", "/apis/"):
        response = kube_request(api_client, "GET", path)
        assert response.status == 200, (path, response.body)
        body = response.json()
        assert body["kind"] == "APIGroupList"
        assert "apiextensions.k8s.io" in {g["name"] for g in body["groups"]}
    aggregated = kube_request(api_client, "GET", "/apis", headers={"Accept": AGGREGATED})
    assert aggregated.status == 200
    assert aggregated.json()["kind"] == "APIGroupDiscoveryList"
    resources = kube_request(api_client, "GET", "/api/v1").json()
    by_name = {r["name"]: r for r in resources["resources"]}
    for name in ("pods", "pods/status", "nodes", "nodes/status", "namespaces", "events", "configmaps", "secrets"):
        assert name in by_name, name
    assert by_name["pods"]["namespaced"] is True
    assert by_name["nodes"]["namespaced"] is False


def test_kubectl_works(kube_cluster: TestCluster, namespace: str) -> None:
    kubectl = kube_cluster.kubectl
    if kubectl is None:
        pytest.skip("no kubectl (neither from testserver/build.sh nor on PATH)")

    def run(*args: str) -> str:
        result = subprocess.run(
            [str(kubectl), "--kubeconfig", str(kube_cluster.kubeconfig), *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout

    assert "namespace/default" in run("get", "namespaces", "-o", "name").split()
    api_resources = run("api-resources", "-o", "name").split()
    assert "pods" in api_resources
    assert "customresourcedefinitions.apiextensions.k8s.io" in api_resources
    assert "Server Version" in run("version")
    # client-side apply twice (create, then a strategic-merge patch) and server-side apply
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as manifest:
        manifest.write(
            f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: kubectl-applied, namespace: {namespace}}}\n"
            "data: {a: '1'}\n"
        )
        manifest.flush()
        assert "created" in run("apply", "-f", manifest.name)
        assert "unchanged" in run("apply", "-f", manifest.name)
        assert "serverside-applied" in run("apply", "--server-side", "-f", manifest.name)
        run("delete", "-f", manifest.name)


@pytest.fixture
def widget_crd(api_client: client.ApiClient) -> Iterator[dict[str, str]]:
    """A namespaced CRD with a CEL rule, status subresource and a printer column, in a unique group."""
    group = f"t{uuid.uuid4().hex[:8]}.elasticgpu.test"
    name = f"widgets.{group}"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer"}, "color": {"type": "string"}},
                                    "x-kubernetes-validations": [
                                        {"rule": "self.size <= 10", "message": "size must be at most 10"}
                                    ],
                                },
                                "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
                            },
                        }
                    },
                }
            ],
        },
    }
    extensions = client.ApiextensionsV1Api(api_client)
    extensions.create_custom_resource_definition(crd)
    try:
        wait_established(api_client, [name])
        yield {"group": group, "version": "v1", "plural": "widgets", "name": name}
    finally:
        extensions.delete_custom_resource_definition(name)


def _widget(name: str, size: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "", "kind": "Widget", "metadata": {"name": name}, "spec": {"size": size, **spec}}


def _wait_served(api_client: client.ApiClient, path: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while kube_request(api_client, "GET", path).status != 200:
        assert time.monotonic() < deadline, f"{path} not served after {timeout}s"
        time.sleep(0.1)


def test_crd_cel_rule_status_and_printer_columns(
    api_client: client.ApiClient, widget_crd: dict[str, str], namespace: str
) -> None:
    g, v, plural = widget_crd["group"], widget_crd["version"], widget_crd["plural"]
    custom = client.CustomObjectsApi(api_client)
    _wait_served(api_client, f"/apis/{g}/{v}/namespaces/{namespace}/{plural}")

    good = _widget("good", 3) | {"apiVersion": f"{g}/{v}"}
    custom.create_namespaced_custom_object(g, v, namespace, plural, good)

    bad = _widget("bad", 11) | {"apiVersion": f"{g}/{v}"}
    with pytest.raises(ApiException) as rejected:
        custom.create_namespaced_custom_object(g, v, namespace, plural, bad)
    assert rejected.value.status == 422
    assert "size must be at most 10" in rejected.value.body

    # Status subresource: status is ignored on the main resource and set through /status.
    custom.patch_namespaced_custom_object_status(g, v, namespace, plural, "good", {"status": {"ready": True}})
    stored = custom.get_namespaced_custom_object(g, v, namespace, plural, "good")
    assert stored["status"] == {"ready": True}

    table = kube_request(
        api_client,
        "GET",
        f"/apis/{g}/{v}/namespaces/{namespace}/{plural}",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    ).json()
    assert table["kind"] == "Table"
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert "Size" in columns
    assert table["rows"][0]["cells"][columns.index("Size")] == 3

    # The CRD group shows up in legacy (non-aggregated) discovery too.
    groups = {grp["name"] for grp in kube_request(api_client, "GET", "/apis").json()["groups"]}
    assert g in groups


def test_server_side_apply_on_custom_resource(
    api_client: client.ApiClient, widget_crd: dict[str, str], namespace: str
) -> None:
    g, v, plural = widget_crd["group"], widget_crd["version"], widget_crd["plural"]
    _wait_served(api_client, f"/apis/{g}/{v}/namespaces/{namespace}/{plural}")
    path = f"/apis/{g}/{v}/namespaces/{namespace}/{plural}/applied"
    obj = _widget("applied", 2, color="red") | {"apiVersion": f"{g}/{v}"}
    applied = server_side_apply(api_client, path, obj, manager="first")
    assert applied["spec"] == {"size": 2, "color": "red"}
    managers = {(m["manager"], m["operation"]) for m in applied["metadata"]["managedFields"]}
    assert ("first", "Apply") in managers

    # A second manager changing an owned field without force conflicts (409).
    conflict = kube_request(
        api_client,
        "PATCH",
        path,
        body=_widget("applied", 5) | {"apiVersion": f"{g}/{v}"},
        query=[("fieldManager", "second")],
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    assert conflict.status == 409, conflict.body
    # The CEL rule also applies to apply patches.
    invalid = kube_request(
        api_client,
        "PATCH",
        path,
        body=_widget("applied", 50) | {"apiVersion": f"{g}/{v}"},
        query=[("fieldManager", "first")],
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    assert invalid.status == 422, invalid.body


def test_server_side_apply_on_configmap(api_client: client.ApiClient, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps/applied"
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "1"}}
    applied = server_side_apply(api_client, path, obj, manager="first")
    assert applied["data"] == {"a": "1"}
    assert {m["manager"] for m in applied["metadata"]["managedFields"]} == {"first"}


def test_resource_version_conflict_is_409(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    created = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm"), data={"v": "1"})
    )
    stale = created.metadata.resource_version
    created.data = {"v": "2"}
    core.replace_namespaced_config_map("cm", namespace, created)
    created.data = {"v": "3"}
    created.metadata.resource_version = stale
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_config_map("cm", namespace, created)
    assert conflict.value.status == 409
    assert core.read_namespaced_config_map("cm", namespace).data == {"v": "2"}


def test_watch_delivers_events(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    start = core.list_namespaced_config_map(namespace).metadata.resource_version
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="watched")))
    core.delete_namespaced_config_map("watched", namespace)
    seen = []
    w = watch.Watch()
    for event in w.stream(core.list_namespaced_config_map, namespace, resource_version=start, timeout_seconds=10):
        if event["object"].metadata.name == "watched":
            seen.append(event["type"])
        if seen == ["ADDED", "DELETED"]:
            w.stop()
    assert seen == ["ADDED", "DELETED"]


def test_pod_create_and_status_update(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    node = f"elasticgpu-test-absent-node-{uuid.uuid4().hex[:6]}"  # no kubelet will touch this pod
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="p"),
        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(name="c", image="busybox:1.36")]),
    )
    created = core.create_namespaced_pod(namespace, pod)
    assert created.status.phase == "Pending"
    assert created.spec.restart_policy == "Always"  # defaulted by the server

    core.patch_namespaced_pod_status(
        "p", namespace, {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    )
    stored = core.read_namespaced_pod("p", namespace)
    assert stored.status.phase == "Running"
    assert {c.type: c.status for c in stored.status.conditions}["Ready"] == "True"

    # The main resource ignores status changes; spec is (mostly) immutable.
    core.patch_namespaced_pod("p", namespace, {"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Failed"}})
    assert core.read_namespaced_pod("p", namespace).status.phase == "Running"
    with pytest.raises(ApiException) as immutable:
        core.patch_namespaced_pod("p", namespace, {"spec": {"restartPolicy": "Never"}})
    assert immutable.value.status == 422

    on_node = core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    assert [p.metadata.name for p in on_node] == ["p"]
    assert core.list_namespaced_pod(namespace, field_selector="spec.nodeName=elsewhere").items == []

    invalid = client.V1Pod(metadata=client.V1ObjectMeta(name="nocontainers"), spec=client.V1PodSpec(containers=[]))
    with pytest.raises(ApiException) as rejected:
        core.create_namespaced_pod(namespace, invalid)
    assert rejected.value.status == 422


def test_node_status_update(api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    name = f"elasticgpu-test-node-{uuid.uuid4().hex[:6]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={"elasticgpu-test": "1"})))
    try:
        core.patch_node_status(name, {"status": {"capacity": {"nvidia.com/gpu": "4"}}})
        assert core.read_node(name).status.capacity["nvidia.com/gpu"] == "4"
    finally:
        core.delete_node(name)


def test_events_secrets_serviceaccounts(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    secret = core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="s"), string_data={"k": "v"})
    )
    assert secret.data == {"k": base64.b64encode(b"v").decode()}
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="sa")))
    core.create_namespaced_event(
        namespace,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="e"),
            involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace=namespace),
            reason="Testing",
            message="hello",
            type="Normal",
        ),
    )
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=p").items
    assert [e.reason for e in events] == ["Testing"]


def test_lease_create(api_client: client.ApiClient, namespace: str) -> None:
    coordination = client.CoordinationV1Api(api_client)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader"),
        spec=client.V1LeaseSpec(holder_identity="me", lease_duration_seconds=15),
    )
    coordination.create_namespaced_lease(namespace, lease)
    assert coordination.read_namespaced_lease("leader", namespace).spec.holder_identity == "me"


# --- admission webhooks go through the server --------------------------------------------------


class _WebhookHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        obj = request["object"]
        path = urllib.parse.urlsplit(self.path).path  # the API server appends ?timeout=...
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        if path == "/validate" and "forbidden" in (obj.get("data") or {}):
            response = {
                "uid": request["uid"],
                "allowed": False,
                "status": {"code": 403, "message": "no forbidden keys"},
            }
        elif path == "/mutate":
            patch = [{"op": "add", "path": "/metadata/labels", "value": {"mutated-by": "webhook"}}]
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def webhook_server() -> Iterator[tuple[str, str]]:
    """An HTTPS admission webhook on 127.0.0.1: (base URL, base64 CA bundle)."""
    with tempfile.TemporaryDirectory() as tmp:
        certs = _write_certs(Path(tmp))
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WebhookHandler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(certs["server.crt"]), str(certs["server.key"]))
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            ca = base64.b64encode(certs["ca.crt"].read_bytes()).decode()
            yield f"https://127.0.0.1:{httpd.server_address[1]}", ca
        finally:
            httpd.shutdown()
            httpd.server_close()


def test_admission_webhooks(
    kube_cluster: TestCluster, api_client: client.ApiClient, namespace: str, webhook_server: tuple[str, str]
) -> None:
    if kube_cluster.external:
        pytest.skip("the API server of an external cluster cannot reach a webhook on 127.0.0.1 here")
    url, ca = webhook_server
    admission = client.AdmissionregistrationV1Api(api_client)
    name = f"elasticgpu-test-{namespace}"

    def hook(path: str) -> dict[str, Any]:
        return {
            "name": f"{path}.elasticgpu.test",
            "clientConfig": {"url": f"{url}/{path}", "caBundle": ca},
            "rules": [
                {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}
            ],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
        }

    admission.create_validating_webhook_configuration({"metadata": {"name": name}, "webhooks": [hook("validate")]})
    admission.create_mutating_webhook_configuration({"metadata": {"name": name}, "webhooks": [hook("mutate")]})
    core = client.CoreV1Api(api_client)
    try:
        deadline = time.monotonic() + 20
        attempt = 0
        while True:  # webhook configurations reach the admission plugins through an informer
            attempt += 1
            cm = core.create_namespaced_config_map(
                namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"ok-{attempt}"), data={"a": "b"})
            )
            if (cm.metadata.labels or {}).get("mutated-by") == "webhook":
                break
            assert time.monotonic() < deadline, "mutating webhook never called"
            time.sleep(0.2)
        while True:
            attempt += 1
            try:
                core.create_namespaced_config_map(
                    namespace,
                    client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"bad-{attempt}"), data={"forbidden": "x"}),
                )
            except ApiException as denied:
                assert denied.status == 403, denied.body
                assert "no forbidden keys" in denied.body
                break
            assert time.monotonic() < deadline, "validating webhook never called"
            time.sleep(0.2)
    finally:
        admission.delete_validating_webhook_configuration(name)
        admission.delete_mutating_webhook_configuration(name)


def test_validating_admission_policy(api_client: client.ApiClient, namespace: str) -> None:
    admission = client.AdmissionregistrationV1Api(api_client)
    name = f"elasticgpu-test-{namespace}"
    policy = {
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}
                ]
            },
            "validations": [{"expression": "!has(object.data) || size(object.data) < 2", "message": "too many keys"}],
        },
    }
    binding = {
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        },
    }
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding)
    core = client.CoreV1Api(api_client)
    try:
        deadline = time.monotonic() + 30
        attempt = 0
        while True:  # policies reach the admission plugin through informers
            attempt += 1
            try:
                core.create_namespaced_config_map(
                    namespace,
                    client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"big-{attempt}"), data={"a": "1", "b": "2"}),
                )
            except ApiException as denied:
                assert denied.status == 422, denied.body
                assert "too many keys" in denied.body
                break
            assert time.monotonic() < deadline, "ValidatingAdmissionPolicy never enforced"
            time.sleep(0.2)
        core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="small")))
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)
