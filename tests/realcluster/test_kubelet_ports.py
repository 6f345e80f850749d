"""Kubernetes' kubelet on the host (elasticgpu/testbed/kubelet.py) comes up when a port it was given
was taken before it bound it, both ways kubelet meets one: its healthz port taken, it logs the bind error
and stays up (trying again every 5 s, healthz never served); its HTTPS port taken, it exits. Each time
it starts again on fresh ports (elasticgpu/testbed/free_ports.py). Before, it was started once and not
waited for: the tests found out at their wait for the Node Ready (180 s), or never (healthz)."""

from __future__ import annotations

import contextlib
import socket

import pytest
from kubernetes import client, config

from elasticgpu.testbed import free_ports
from tests.realcluster import control_plane

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(600)]

NODE = "realcluster-node-ports"


def test_kubelet_starts_again_when_its_healthz_then_its_https_port_was_taken(
    real_control_plane: control_plane.ControlPlane,
) -> None:
    from tests.containerd_runtime import RuntimeUnavailable, running_containerd
    from tests.realcluster import kubelet

    asked: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as held:
        taken = int(held.getsockname()[1])
        # Attempt 1: healthz taken (kubelet stays up); attempt 2: its HTTPS port taken (it exits); 3: free.
        plan = {"kubelet-healthz": [taken], "kubelet": [0, taken]}

        def choose(name: str) -> int:
            asked.append(name)
            handed = plan[name].pop(0) if plan[name] else 0
            return handed or free_ports.free_port()

        try:
            runtime_context = running_containerd()
            runtime = runtime_context.__enter__()
        except RuntimeUnavailable as e:
            pytest.skip(str(e))
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(real_control_plane.kubeconfig)))
        try:
            kubelet.give_network_config(runtime.directory / "cni" / "conf")
            with kubelet.running_kubelet(real_control_plane, NODE, runtime.endpoint, choose_port=choose) as running:
                assert asked == ["kubelet", "kubelet-healthz"] * free_ports.PORT_ATTEMPTS
                assert taken not in (running.config["port"], running.config["healthzPort"])
                assert running.child.running()
                ours = [c for c in real_control_plane.children.started if c.name == f"kubelet {NODE}"]
                assert ours == [running.child]  # the two failed attempts forgotten
                assert running.child.log.read_text(errors="replace").lower().count("already in use") >= 2
        finally:
            runtime_context.__exit__(None, None, None)
            with contextlib.suppress(client.ApiException):
                core.delete_node(NODE)
