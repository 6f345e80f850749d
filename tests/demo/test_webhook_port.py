"""The demo's webhook (elasticgpu/testbed/components.py `start_webhook`) comes up when the port it chose
was taken before it bound it: it starts again on a fresh one (elasticgpu/testbed/free_ports.py). Before,
it was started once and not waited for: a taken port was found by the demo's wait for the webhook's
gating, a minute later, as the webhook's exit."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from elasticgpu.testbed import components, free_ports, processes
from tests.kube_cluster import TestCluster
from tests.pods.conftest import remove_configuration
from tests.spawning import spawn

pytestmark = pytest.mark.timeout(180)


def test_the_webhook_starts_again_on_a_fresh_port_when_its_first_was_taken(
    kube_cluster: TestCluster, api_client: client.ApiClient, tmp_path: Path
) -> None:
    if kube_cluster.external:
        pytest.skip("the API server must reach a webhook on 127.0.0.1: local test server only")
    configuration = f"elasticgpu-port-{uuid.uuid4().hex[:8]}"
    children = processes.Children(spawn=spawn)
    asked: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as held:
        taken = int(held.getsockname()[1])

        def choose(name: str) -> int:
            asked.append(name)
            return taken if len(asked) == 1 else free_ports.free_port()

        try:
            webhook, port = components.start_webhook(
                children, kubeconfig=kube_cluster.kubeconfig, namespace="default", configuration=configuration,
                log_dir=tmp_path, choose_port=choose,
            )  # fmt: skip
            assert port != taken and asked == ["webhook", "webhook"]
            assert webhook.running() and children.started == [webhook]
            assert "already in use" in (tmp_path / "webhook.log").read_text().lower()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
        finally:
            children.stop_all()
            remove_configuration(api_client, configuration)
