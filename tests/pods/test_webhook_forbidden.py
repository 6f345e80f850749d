"""A webhook whose ServiceAccount RBAC refuses (403) says which Role rule is missing, once, and keeps
trying until an admin grants it (issue 24: on the real cluster, a configuration name outside the
chart's resourceNames only retried a bare 403 warning for ever)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from kubernetes import client

from elasticgpu.controller.admission import Webhook, WebhookSettings, errors, publishing
from elasticgpu.controller.admission.publishing import AdmissionApi
from tests.faults.proxy import FaultPlan, fault_proxy
from tests.kube_cluster import TestCluster
from tests.pods.conftest import free_port, remove_configuration, wait_until

REFUSED = FaultPlan(seed=1, rates={"403": 1.0}, paths=(r"mutatingwebhookconfigurations",))


def test_a_refused_configuration_names_the_roles_rule_and_the_fix(
    kube_cluster: TestCluster, namespace: str, tmp_path: Path
) -> None:
    if kube_cluster.external:
        pytest.skip("the fault proxy stands in front of the local test server only")
    settings = WebhookSettings(namespace=namespace, configuration_name=f"custom-{namespace}")
    with fault_proxy(kube_cluster, REFUSED, directory=tmp_path) as (_proxy, kubeconfig):
        api = AdmissionApi(publishing.api_client(kubeconfig=str(kubeconfig)), settings=settings)
        try:
            with pytest.raises(errors.Forbidden) as refused:
                api.read_configuration()
        finally:
            api.close()
    message = str(refused.value)
    assert f"MutatingWebhookConfiguration custom-{namespace}: HTTP 403" in message
    chart = WebhookSettings()
    assert f"MutatingWebhookConfiguration {chart.configuration_name} (resourceNames" in message
    assert "--configuration-name" in message and "add yours to the Roles" in message


def test_the_webhook_says_the_refusal_once_and_serves_once_it_is_granted(
    kube_cluster: TestCluster, api_client: client.ApiClient, namespace: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if kube_cluster.external:
        pytest.skip("the fault proxy stands in front of the local test server only")
    port = free_port()
    settings = WebhookSettings(listen_host="127.0.0.1", port=port, url=f"https://127.0.0.1:{port}",
                               namespace=namespace, configuration_name=f"elasticgpu-pods-{namespace}")
    caplog.set_level(logging.WARNING, logger="elasticgpu.controller.admission.keeping")
    with fault_proxy(kube_cluster, REFUSED, directory=tmp_path) as (proxy, kubeconfig):
        api = AdmissionApi(publishing.api_client(kubeconfig=str(kubeconfig)), settings=settings)
        webhook = Webhook(api=api, settings=settings)
        webhook.start()
        try:
            wait_until(lambda: any("Forbidden" in r.getMessage() for r in caplog.records),
                       "the webhook to say the refusal", timeout=20)
            threading.Event().wait(3)  # several more refused passes (backoff from 1 s)
            said = [r.getMessage() for r in caplog.records if "Forbidden" in r.getMessage()]
            assert len(said) == 1, f"the same refusal is said once, not at every retry: {said}"
            assert "resourceNames" in said[0] and "--configuration-name" in said[0], said[0]
            proxy.set_plan(FaultPlan())  # an admin grants the rule: nothing is refused any more
            assert webhook.wait_ready(30), "the webhook did not recover once RBAC allowed it"
        finally:
            webhook.stop()
            remove_configuration(api_client, settings.configuration_name)
            api.close()

