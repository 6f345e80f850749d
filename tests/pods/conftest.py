"""Fixtures of the pod tests: the ValidatingAdmissionPolicies that mirror kube-apiserver's pod
update rules and elasticgpu's own pod policy (deploy/policies/pod-claims-immutable.yaml, as a
cluster runs it), and the admission webhook as a real process (`elasticgpu webhook`) that the API
server calls over HTTPS."""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.testbed import free_ports
from tests.kube_cluster import REPO_ROOT, TestCluster, kube_request, server_side_apply

POLICIES_FILE = Path(__file__).with_name("pod_update_policies.yaml")
CLAIMS_POLICY_FILE = REPO_ROOT / "deploy" / "policies" / "pod-claims-immutable.yaml"
CLAIMS_POLICY = "pod-claims-immutable.elasticgpu.io"
UNGUARDED_LABEL = "elasticgpu-test/without-claims-policy"
"""A namespace with this label is left out of CLAIMS_POLICY's binding: the control group that
shows an update is refused by the policy and by nothing else."""
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
START_TIMEOUT_S = 60.0
PORT_ATTEMPTS = 3
"""Starts of one webhook on fresh ports when the port chosen was taken before it bound it."""


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0, interval: float = 0.1) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def fresh_namespace(api_client: client.ApiClient, prefix: str = "t") -> Iterator[str]:
    """A new namespace, deleted afterwards (for fixtures wider than one test)."""
    core = client.CoreV1Api(api_client)
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"elasticgpu-test": "1"}}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)


def pod_body(name: str, *, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A pod with containers `main` and `side` (the API server defaults the rest)."""
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    containers = [{"name": "main", "image": "busybox:1.36"}, {"name": "side", "image": "busybox:1.36"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": containers, **spec}}


# --- ValidatingAdmissionPolicies -------------------------------------------------------------


def _policy_documents() -> list[dict[str, Any]]:
    documents = [doc for doc in yaml.safe_load_all(POLICIES_FILE.read_text()) if doc]
    for doc in (doc for doc in yaml.safe_load_all(CLAIMS_POLICY_FILE.read_text()) if doc):
        if doc["kind"] == "ValidatingAdmissionPolicyBinding":
            # As deployed, except that a namespace labelled UNGUARDED_LABEL is left out.
            selector = {"matchExpressions": [{"key": UNGUARDED_LABEL, "operator": "DoesNotExist"}]}
            doc["spec"]["matchResources"] = {"namespaceSelector": selector}
        documents.append(doc)
    return documents


@pytest.fixture(scope="session")
def pod_update_policies(api_client: client.ApiClient) -> list[str]:
    """Installs tests/pods/pod_update_policies.yaml and waits until each policy refuses an update
    it is meant to refuse (policies take effect through the API server's informers)."""
    names = []
    for doc in _policy_documents():
        plural = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies"}.get(
            doc["kind"], "validatingadmissionpolicybindings"
        )
        server_side_apply(api_client, f"{ADMISSION}/{plural}/{doc['metadata']['name']}", doc)
        if doc["kind"] == "ValidatingAdmissionPolicy":
            names.append(doc["metadata"]["name"])
    core = client.CoreV1Api(api_client)
    probes = {
        "elasticgpu-test.pod-scheduling-gates": {"spec": {"schedulingGates": [{"name": "a"}, {"name": "b"}]}},
        "elasticgpu-test.pod-gated-placement": {"spec": {"nodeSelector": {"x": "2"}}},
        # Raising the deadline: the test server's own validation lets it through.
        "elasticgpu-test.pod-spec-immutable": {"spec": {"activeDeadlineSeconds": 200}},
        CLAIMS_POLICY: {"metadata": {"labels": {"elasticgpu.io/uses-claims": "true"}}},
    }
    attempts = itertools.count()
    with fresh_namespace(api_client, "vap-probe") as namespace:
        for policy, patch in probes.items():

            def refused(policy: str = policy, patch: dict[str, Any] = patch) -> bool:
                # A fresh probe each time: an update that went through changed the last one.
                probe = f"probe-{next(attempts)}"
                body = pod_body(
                    probe, schedulingGates=[{"name": "a"}], nodeSelector={"x": "1"}, activeDeadlineSeconds=100
                )
                core.create_namespaced_pod(namespace, body)
                try:
                    core.patch_namespaced_pod(probe, namespace, patch)
                except ApiException as error:
                    return error.status == 422 and policy in str(error.body)
                return False

            wait_until(refused, f"ValidatingAdmissionPolicy {policy} in force", interval=0.3)
    return names


# --- the webhook as a process ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class WebhookProcess:
    """One `elasticgpu webhook` process and where its objects are."""

    process: subprocess.Popen[bytes]
    api: client.ApiClient
    port: int
    namespace: str
    configuration_name: str
    secret_name: str
    log: Path

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s; the configuration and the Secret stay."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)

    def configuration(self) -> dict[str, Any] | None:
        response = kube_request(self.api, "GET", f"{ADMISSION}/mutatingwebhookconfigurations/{self.configuration_name}")
        return response.json() if response.status == 200 else None

    def ca_bundle(self) -> bytes:
        stored = self.configuration() or {}
        hooks = stored.get("webhooks") or [{}]
        return base64.b64decode(hooks[0].get("clientConfig", {}).get("caBundle") or "")

    def secret(self) -> dict[str, bytes]:
        secret = client.CoreV1Api(self.api).read_namespaced_secret(self.secret_name, self.namespace)
        return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}

    def served_certificate(self, ca_bundle: bytes) -> bytes:
        """DER of the certificate served now, verified against `ca_bundle` (raises if it does not verify)."""
        context = ssl.create_default_context(cadata=ca_bundle.decode())
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            return der

    def is_ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"webhook exited with {self.process.returncode}:\n{self.log_tail()}")
        bundle = self.ca_bundle()
        if not bundle:
            return False
        try:
            self.served_certificate(bundle)
        except (OSError, ssl.SSLError):
            return False
        return True


def start_webhook(
    cluster: TestCluster,
    api: client.ApiClient,
    *,
    namespace: str,
    log_dir: Path,
    configuration_name: str | None = None,
    extra_args: tuple[str, ...] = (),
    wait: bool = True,
) -> WebhookProcess:
    """Start `python -m elasticgpu webhook` for the local API server (which calls it at
    https://127.0.0.1:<port>) and wait until it serves a certificate its caBundle trusts.

    The port is free when chosen, not when the process (a second or more of Python start on a
    loaded box) binds it: another test or benchmark on the machine may take it meanwhile. A
    webhook that exits saying its port is in use is started again on a fresh one, up to
    PORT_ATTEMPTS times (as elasticgpu/testbed/free_ports.py does for the API server)."""
    name = configuration_name or f"elasticgpu-pods-{uuid.uuid4().hex[:8]}"
    for attempt in range(1, PORT_ATTEMPTS + 1):
        webhook = _launch_webhook(cluster, api, namespace=namespace, log_dir=log_dir, name=name,
                                  port=free_port(), extra_args=extra_args)
        if not wait:
            return webhook
        try:
            wait_until(webhook.is_ready, f"the webhook on port {webhook.port} to serve (log {webhook.log})",
                       timeout=START_TIMEOUT_S)
            return webhook
        except BaseException:
            webhook.stop()
            taken = webhook.process.returncode not in (None, 0) and free_ports.TAKEN in webhook.log_tail().lower()
            if attempt == PORT_ATTEMPTS or not taken:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _launch_webhook(
    cluster: TestCluster,
    api: client.ApiClient,
    *,
    namespace: str,
    log_dir: Path,
    name: str,
    port: int,
    extra_args: tuple[str, ...],
) -> WebhookProcess:
    log = log_dir / f"webhook-{port}.log"
    command = [
        sys.executable,
        "-m",
        "elasticgpu",
        "webhook",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--namespace",
        namespace,
        "--configuration-name",
        name,
        "--url",
        f"https://127.0.0.1:{port}",
        "--listen-host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra_args,
    ]
    with log.open("ab") as output:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT, env=os.environ)
    return WebhookProcess(process, api, port, namespace, name, "elasticgpu-webhook-tls", log)


def remove_configuration(api: client.ApiClient, name: str) -> None:
    """Delete a MutatingWebhookConfiguration (absent is fine). The API server drops it through
    an informer, within moments; later tests use webhooks of their own names."""
    kube_request(api, "DELETE", f"{ADMISSION}/mutatingwebhookconfigurations/{name}")


@pytest.fixture
def webhook_factory(
    kube_cluster: TestCluster, api_client: client.ApiClient, pod_update_policies: list[str]
) -> Iterator[Callable[..., WebhookProcess]]:
    """Starts webhooks for one test; stops them and deletes their configurations afterwards."""
    if kube_cluster.external:
        pytest.skip("the API server must reach a webhook on 127.0.0.1: local test server only")
    started: list[WebhookProcess] = []
    with tempfile.TemporaryDirectory(prefix="elasticgpu-webhook-test-") as directory:

        def start(namespace: str, **options: Any) -> WebhookProcess:
            webhook = start_webhook(kube_cluster, api_client, namespace=namespace, log_dir=Path(directory), **options)
            started.append(webhook)
            return webhook

        try:
            yield start
        finally:
            for webhook in started:
                webhook.stop()
                remove_configuration(api_client, webhook.configuration_name)
