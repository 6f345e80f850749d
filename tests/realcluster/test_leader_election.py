"""Two replicas of the controller elect their leader on a Lease of the real API server
(coordination.k8s.io), each with the chart's ServiceAccount and RBAC (deploy/controller.yaml lets it
create Leases and get/update only `elasticgpu-controller` in elasticgpu-system): exactly one holds
the Lease and binds; after the leader is killed (SIGKILL: no release), the standby takes the Lease
once it has expired (`LeaderSettings.lease_duration_s`, 15 s) and binds a new claim."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.controller.edge.leader import LeaderSettings
from elasticgpu.testbed import processes
from tests.kube_cluster import TestCluster, kube_request
from tests.realcluster import install
from tests.realcluster.control_plane import ControlPlane
from tests.realcluster.test_agent_node import GpuNode
from tests.realcluster.test_agent_node import gpu_node as gpu_node  # the module fixture, shared
from tests.realcluster.test_claim_pod import CUSTOM, SYSTEM, WITHIN_S, _claim_body, _elasticgpu, _wait_status

pytestmark = pytest.mark.realcluster

LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM}/leases/elasticgpu-controller"
TAKEOVER_S = LeaderSettings().lease_duration_s + 2 * LeaderSettings().retry_period_s * 1.2 + 5.0
"""From the kill: the Lease expires `lease_duration_s` after the leader's last renewal (at most the
kill), the standby retries every `retry_period_s` (+20 % jitter); 5 s for the API server and a
loaded machine."""


@pytest.fixture
def replicas(kube_cluster: TestCluster, real_control_plane: ControlPlane, api_client: client.ApiClient,
             crds_installed: list[str]) -> Iterator[list[processes.Child]]:  # fmt: skip
    """Two controller processes with the chart's identity and RBAC, leader election on (the chart's default)."""
    install.apply_file(api_client, install.DEPLOY / "controller.yaml", install.IDENTITY_KINDS)
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="egle-", dir="/tmp")))
        config = install.service_account_kubeconfig(kube_cluster, "elasticgpu-controller", SYSTEM, home)
        children = []
        for replica in ("a", "b"):
            child = real_control_plane.children.start(f"controller {replica}", _elasticgpu(
                "controller", "--kubeconfig", str(config), "--health-probe-bind-address", "0",
                "--metrics-bind-address", "0"), log=home / f"controller-{replica}.log",
                env={"POD_NAMESPACE": SYSTEM, "ELASTICGPU_RESYNC_INTERVAL_S": "10"})  # fmt: skip
            stack.callback(child.stop)
            children.append(child)
        yield children
        for child in children:
            refused = [line for line in child.log.read_text(errors="replace").splitlines() if " 403" in line]
            assert not refused, f"{child.name} was refused under the chart's RBAC:\n" + "\n".join(refused[:10])


def _holder(api_client: client.ApiClient) -> str:
    answer = kube_request(api_client, "GET", LEASE)
    return str((answer.json().get("spec") or {}).get("holderIdentity") or "") if answer.status == 200 else ""


def _leading(children: list[processes.Child], holder: str) -> list[processes.Child]:
    """The replicas whose log says they lead under the Lease's holder identity (identities carry a
    random suffix: only the holder's own log names it as leading)."""
    return [c for c in children if holder and f"leading: Lease {SYSTEM}/elasticgpu-controller" in
            c.log.read_text(errors="replace") and f"by {holder}" in c.log.read_text(errors="replace")]  # fmt: skip


def test_one_replica_leads_and_the_standby_takes_over_after_a_kill(
    api_client: client.ApiClient, replicas: list[processes.Child], gpu_node: GpuNode, namespace: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    klass: dict[str, Any] = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS,
                             "metadata": {"name": f"le-{tag}"}, "provisioner": names.PROVISIONER_GPUSHARE,
                             "parameters": {"gpuModel": "A100"}, "reclaimPolicy": "Delete",
                             "bindingMode": "Immediate"}  # fmt: skip
    assert kube_request(api_client, "POST", f"{CUSTOM}/{names.PLURAL_CLASS}", body=klass).status == 201
    claims = f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
    # A Lease a stopped replica of an earlier test released (holder "") is not anyone's.
    deadline = time.monotonic() + WITHIN_S
    while not (leaders := _leading(replicas, holder := _holder(api_client))):
        assert time.monotonic() < deadline, f"no replica leads (holder {holder!r}):\n" + "\n".join(
            c.tail(10) for c in replicas
        )
        assert all(c.running() for c in replicas), "\n".join(c.tail(10) for c in replicas)
        time.sleep(0.5)
    assert len(leaders) == 1, f"both replicas lead under {holder}"
    (leader,) = leaders
    (standby,) = [c for c in replicas if c is not leader]
    assert kube_request(api_client, "POST", claims, body=_claim_body("first", klass["metadata"]["name"], 10,
                                                                       "2Gi")).status == 201  # fmt: skip
    _wait_status(api_client, f"{claims}/first", lambda s: s.get("phase") == "Bound", "a claim bound by the leader")
    os.killpg(leader.process.pid, signal.SIGKILL)  # no release: the standby must wait for the Lease to expire
    killed = time.monotonic()
    leader.process.wait(timeout=30)
    assert kube_request(api_client, "POST", claims, body=_claim_body("second", klass["metadata"]["name"], 10,
                                                                       "2Gi")).status == 201  # fmt: skip
    while _holder(api_client) in ("", holder):
        assert time.monotonic() - killed < TAKEOVER_S, (
            f"the standby did not take the Lease within {TAKEOVER_S:.0f} s of the leader's kill:\n{standby.tail(10)}"
        )
        time.sleep(0.2)
    took = time.monotonic() - killed
    assert _leading([standby], _holder(api_client)) == [standby], standby.tail(10)
    _wait_status(api_client, f"{claims}/second", lambda s: s.get("phase") == "Bound", "a claim bound by the new leader")
    # Not before the old leader's Lease expired: the standby respected it (a standby that grabbed a
    # held Lease would take over at once).
    assert took > LeaderSettings().lease_duration_s - LeaderSettings().retry_period_s * 1.2 - 1, took
    for claim in ("first", "second"):
        kube_request(api_client, "DELETE", f"{claims}/{claim}")
    kube_request(api_client, "DELETE", f"{CUSTOM}/{names.PLURAL_CLASS}/{klass['metadata']['name']}")
