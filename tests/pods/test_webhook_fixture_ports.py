"""The pod tests' webhook launcher (tests/pods/conftest.py `start_webhook`): a port chosen free may
be taken by another process on the shared machine before the webhook, a second or more of Python
start later on a loaded box, binds it. The webhook then exits at once saying so; the launcher
starts it again on a fresh port instead of failing the test that wanted a webhook."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest
from kubernetes import client

from elasticgpu.api import names
from tests.kube_cluster import TestCluster
from tests.pods import conftest as pods
from tests.pods.conftest import pod_body

pytestmark = pytest.mark.timeout(300)


def test_a_webhook_whose_port_was_taken_meanwhile_starts_again_on_a_fresh_one(
    kube_cluster: TestCluster, api_client: client.ApiClient, namespace: str, pod_update_policies: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if kube_cluster.external:
        pytest.skip("the API server must reach a webhook on 127.0.0.1: local test server only")
    really_free = pods.free_port
    with socket.create_server(("127.0.0.1", 0)) as held, tempfile.TemporaryDirectory() as logs:
        taken = int(held.getsockname()[1])
        chosen: list[int] = []

        def first_the_taken_one() -> int:
            # What the race looks like from here: the first port "found free" is someone else's by
            # the time the webhook binds it (held, listening: SO_REUSEADDR cannot bind it either).
            chosen.append(really_free() if chosen else taken)
            return chosen[-1]

        monkeypatch.setattr(pods, "free_port", first_the_taken_one)
        webhook = pods.start_webhook(kube_cluster, api_client, namespace=namespace, log_dir=Path(logs))
        try:
            assert chosen[0] == taken and webhook.port == chosen[-1] != taken, chosen
            assert "already in use" in (Path(logs) / f"webhook-{taken}.log").read_text()
            claimed = {f"{names.ANNOTATION_CLAIM_PREFIX}main": "c"}
            pod = client.CoreV1Api(api_client).create_namespaced_pod(namespace, pod_body("p", annotations=claimed))
            assert pod.spec.scheduling_gates  # the webhook on the fresh port is the one the API server calls
        finally:
            webhook.stop()
            pods.remove_configuration(api_client, webhook.configuration_name)
