"""The real control plane comes up when a component's port was taken between choosing it and binding it
(a full suite failed so once: a benchmark starting its processes took kube-controller-manager's port).
Every component is handed, first, a port this test holds: each starts again on a fresh one
(elasticgpu/testbed/free_ports.py), and `ControlPlane.ports` names the ones in use."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from elasticgpu.testbed import free_ports, real_cluster
from tests import spawning

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(600)]


def test_every_component_starts_again_when_its_first_port_was_taken() -> None:
    try:
        real_cluster.find_k8s_binary()
        real_cluster.find_etcd()
    except real_cluster.ControlPlaneUnavailable as e:
        pytest.skip(str(e))
    asked: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as held:
        taken = int(held.getsockname()[1])

        def choose(name: str) -> int:  # the held port at each port's first choice, then free ones
            asked.append(name)
            return taken if asked.count(name) == 1 else free_ports.free_port()

        with real_cluster.running_control_plane(spawn=spawning.spawn, choose_port=choose) as plane:
            names = ["etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
            assert sorted(plane.ports) == sorted(names)
            assert taken not in plane.ports.values()
            assert sorted(asked) == sorted(names * 2)  # each chosen twice: taken, then free
            for component in real_cluster.COMPONENTS:
                log = plane.log(component).read_text(errors="replace")
                assert "address already in use" in log.lower(), f"{component} never met the taken port:\n{log[-2000:]}"
            assert plane.server == f"https://127.0.0.1:{plane.ports['kube-apiserver']}"
            with urllib.request.urlopen(f"{plane.server}/readyz", timeout=10, context=plane.ssl_context()) as answer:
                assert answer.status == 200
