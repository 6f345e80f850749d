"""The webhook's process and certificate over time: down, restarted, renewed, repaired.

Each test starts its own `elasticgpu webhook` processes (fixture `webhook_factory`) against the
local API server, which calls them over HTTPS.
"""

from __future__ import annotations

import base64
import datetime
import json
import socket
import threading
import time
from collections.abc import Callable

import pytest
from cryptography import x509
from kubernetes import client
from kubernetes.client.rest import ApiException

from elasticgpu.api import names
from elasticgpu.controller.admission import Webhook, WebhookSettings, certificates, publishing
from elasticgpu.controller.admission.publishing import AdmissionApi
from tests.kube_cluster import TestCluster, kube_request
from tests.pods.conftest import (
    ADMISSION,
    CLAIMS_POLICY,
    WebhookProcess,
    free_port,
    pod_body,
    remove_configuration,
    wait_until,
)

CLAIMED = {f"{names.ANNOTATION_CLAIM_PREFIX}main": "c"}
Factory = Callable[..., WebhookProcess]


def _serial(pem: bytes) -> int:
    return int(x509.load_pem_x509_certificate(pem).serial_number)


def _cas(bundle: bytes) -> list[int]:
    return [int(cert.serial_number) for cert in x509.load_pem_x509_certificates(bundle)]


def test_pods_without_claims_are_admitted_while_the_webhook_is_down(
    webhook_factory: Factory, api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    webhook = webhook_factory(namespace)
    assert core.create_namespaced_pod(namespace, pod_body("before", annotations=CLAIMED)).spec.scheduling_gates
    webhook.stop()
    assert webhook.configuration() is not None  # still registered: the API server keeps calling for claims

    for name, notes in (("bare", None), ("plain", {"example.com/note": "x"})):
        pod = core.create_namespaced_pod(namespace, pod_body(name, annotations=notes))
        assert pod.metadata.name == name and not pod.spec.scheduling_gates
    # Updates of pods that use claims do not wait for us (the webhook is not called for updates):
    # the controller can still lift the gate.
    lifted = core.patch_namespaced_pod("before", namespace, [{"op": "remove", "path": "/spec/schedulingGates"}])
    assert not lifted.spec.scheduling_gates
    # ... and the label the controller watches still cannot be removed: the API server's own
    # policy guards it (issue 15 item 4: removing it while the webhook was down let the claim go).
    label = names.LABEL_USES_CLAIMS.replace("/", "~1")
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("before", namespace, [{"op": "remove", "path": f"/metadata/labels/{label}"}])
    assert caught.value.status == 422 and CLAIMS_POLICY in caught.value.body, caught.value.body
    # A pod that uses claims must never run ungated: failurePolicy Fail refuses it.
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(namespace, pod_body("claimed", annotations=CLAIMED))
    assert 'failed calling webhook "pods.elasticgpu.io"' in json.loads(caught.value.body)["message"]


def test_a_restarted_webhook_reuses_the_stored_certificate(
    webhook_factory: Factory, api_client: client.ApiClient, namespace: str
) -> None:
    first = webhook_factory(namespace)
    stored = first.secret()
    secret_version = client.CoreV1Api(api_client).read_namespaced_secret(first.secret_name, namespace).metadata
    bundle = first.ca_bundle()
    first.stop()

    second = webhook_factory(namespace, configuration_name=first.configuration_name)
    assert second.secret() == stored
    again = client.CoreV1Api(api_client).read_namespaced_secret(second.secret_name, namespace).metadata
    assert again.resource_version == secret_version.resource_version  # not even rewritten
    assert second.ca_bundle() == bundle
    assert _serial(stored["tls.crt"]) == int(
        x509.load_der_x509_certificate(second.served_certificate(bundle)).serial_number
    )
    pod = client.CoreV1Api(api_client).create_namespaced_pod(namespace, pod_body("p", annotations=CLAIMED))
    assert pod.spec.scheduling_gates


def test_the_certificate_is_renewed_before_expiry_without_refusing_a_pod(
    webhook_factory: Factory, api_client: client.ApiClient, namespace: str
) -> None:
    # Lifetime 40 s, renewed with 30 s left: the first renewal comes ~10 s after the start.
    webhook = webhook_factory(
        namespace,
        extra_args=("--validity-s", "40", "--renew-before-s", "30", "--check-interval-s", "1", "--swap-delay-s", "1"),
    )
    core = client.CoreV1Api(api_client)
    first = webhook.secret()
    first_ca, first_cert = _serial(first["ca.crt"]), _serial(first["tls.crt"])
    assert _cas(webhook.ca_bundle()) == [first_ca]

    # Pods keep coming while the certificate changes; none may be refused.
    created = 0
    deadline = time.monotonic() + 45
    while _serial(webhook.secret()["tls.crt"]) == first_cert:
        assert time.monotonic() < deadline, f"no renewal within 45 s:\n{webhook.log_tail()}"
        pod = core.create_namespaced_pod(namespace, pod_body(f"during-{created}", annotations=CLAIMED))
        assert pod.spec.scheduling_gates
        created += 1
        time.sleep(0.2)
    assert created > 10

    renewed = webhook.secret()
    assert renewed["ca-previous.crt"] == first["ca.crt"]
    # The bundle trusts the new CA and, until it expires, the old one.
    wait_until(lambda: _cas(webhook.ca_bundle()) == [_serial(renewed["ca.crt"]), first_ca], "caBundle with both CAs")
    served = wait_until(
        lambda: _served_serial(webhook) == _serial(renewed["tls.crt"]), "the renewed certificate to be served"
    )
    assert served
    for index in range(5):
        pod = core.create_namespaced_pod(namespace, pod_body(f"after-{index}", annotations=CLAIMED))
        assert pod.spec.scheduling_gates
    assert "webhook certificate renewed (stored certificate expires at" in webhook.log.read_text()


def _served_serial(webhook: WebhookProcess) -> int:
    der = webhook.served_certificate(webhook.ca_bundle())
    return int(x509.load_der_x509_certificate(der).serial_number)


def test_an_unusable_stored_certificate_is_replaced(
    webhook_factory: Factory, api_client: client.ApiClient, namespace: str
) -> None:
    # Someone left an expired certificate (for the wrong names) in the Secret.
    now = datetime.datetime.now(datetime.UTC)
    stale = certificates.generate(
        hosts=["elsewhere.example.com"], now=now - datetime.timedelta(days=2), validity_s=3600
    )
    core = client.CoreV1Api(api_client)
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "elasticgpu-webhook-tls"},
            "type": certificates.SECRET_TYPE,
            "data": stale.to_secret_data(),
        },
    )
    webhook = webhook_factory(namespace)
    stored = webhook.secret()
    assert _serial(stored["tls.crt"]) != stale.serial()
    assert "ca-previous.crt" not in stored  # an expired CA is not worth trusting
    assert core.create_namespaced_pod(namespace, pod_body("p", annotations=CLAIMED)).spec.scheduling_gates


def test_an_edited_ca_bundle_is_put_back(
    webhook_factory: Factory, api_client: client.ApiClient, namespace: str
) -> None:
    webhook = webhook_factory(namespace, extra_args=("--check-interval-s", "1"))
    good = webhook.ca_bundle()
    # Ready means the API server holds the caBundle; the webhook logs its write only once the
    # answer reaches it, which on a loaded box can come after the quiet window below began.
    wait_until(
        lambda: webhook.log.read_text().count("MutatingWebhookConfiguration") >= 1,
        "the first write to be logged",
        timeout=10,
    )
    time.sleep(2.5)  # passes that find everything in order write nothing
    assert webhook.log.read_text().count("MutatingWebhookConfiguration") == 1
    stored = webhook.configuration()
    assert stored is not None
    stored["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(b"not a CA").decode()
    path = f"{ADMISSION}/mutatingwebhookconfigurations/{webhook.configuration_name}"
    assert kube_request(api_client, "PUT", path, body=stored).status == 200
    wait_until(lambda: webhook.ca_bundle() == good, "the caBundle to be repaired", timeout=20)
    # The API server holds the repair before the webhook has its answer and logs the write.
    wait_until(
        lambda: webhook.log.read_text().count("MutatingWebhookConfiguration") >= 2,
        "the repair to be logged",
        timeout=10,
    )
    assert webhook.log.read_text().count("MutatingWebhookConfiguration") == 2
    # The API server reads webhook configurations through its own informer: for a moment after
    # the repair it may still call with the broken bundle (500, "unable to load root
    # certificates"), as a real kube-apiserver does. Pods are admitted again once it catches up.
    admitted: list[client.V1Pod] = []

    def admitted_again() -> bool:
        try:
            admitted.append(client.CoreV1Api(api_client).create_namespaced_pod(
                namespace, pod_body("p", annotations=CLAIMED)))
        except ApiException as e:
            if e.status == 500 and "failed calling webhook" in str(e.body):
                return False
            raise
        return True

    wait_until(admitted_again, "a claimed pod admitted with the repaired caBundle", timeout=20)
    assert admitted[0].spec.scheduling_gates


def test_two_replicas_starting_together_share_one_certificate(
    webhook_factory: Factory, api_client: client.ApiClient, namespace: str
) -> None:
    # No Secret yet: both generate one, one create wins (409 for the other), the loser adopts it.
    replicas = [webhook_factory(namespace, wait=False) for _ in range(2)]
    for replica in replicas:
        wait_until(replica.is_ready, f"replica on port {replica.port} to serve", timeout=60)
    stored = replicas[0].secret()
    for replica in replicas:
        assert replica.ca_bundle() == stored["ca.crt"]
        assert _served_serial(replica) == _serial(stored["tls.crt"])


def test_the_webhook_runs_as_a_component_inside_another_process(
    kube_cluster: TestCluster, api_client: client.ApiClient, namespace: str, pod_update_policies: list[str]
) -> None:
    """How the controller embeds it: `Webhook(...).start()` / `.stop()` in its own process."""
    if kube_cluster.external:
        pytest.skip("the API server must reach a webhook on 127.0.0.1: local test server only")
    port = free_port()
    settings = WebhookSettings(
        listen_host="127.0.0.1",
        port=port,
        url=f"https://127.0.0.1:{port}",
        namespace=namespace,
        configuration_name=f"elasticgpu-pods-{namespace}",
    )
    api = AdmissionApi(publishing.api_client(kubeconfig=str(kube_cluster.kubeconfig)), settings=settings)
    webhook = Webhook(api=api, settings=settings)
    threads_before = threading.active_count()
    webhook.start()
    try:
        assert webhook.wait_ready(30), "no certificate served within 30 s"
        core = client.CoreV1Api(api_client)
        assert core.create_namespaced_pod(namespace, pod_body("p", annotations=CLAIMED)).spec.scheduling_gates
    finally:
        webhook.stop()
        remove_configuration(api_client, settings.configuration_name)
        api.close()
    # Stopped for good: the port is free again and no thread of it is left (keep-alive included).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))
    wait_until(lambda: threading.active_count() <= threads_before, "the webhook's threads to end", timeout=10)
