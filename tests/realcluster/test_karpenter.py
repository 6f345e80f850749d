"""A real node autoscaler (issue 47 item 3): Karpenter with its KWOK provider (testkarpenter/, the
upstream main built from the Go module proxy) against the real control plane of this tier, with a
GPU NodePool scaled to zero. The controller runs in the test's process with node autoscaling on;
Karpenter reads the placeholder pods through the real kube-scheduler's Unschedulable verdict,
launches a NodeClaim whose Node the KWOK provider makes, and the test plays the new node's side (it
reports the Node Ready and its simulated agent publishes its 8 GPU objects, as the demo's simulated
nodes do). Scenarios:

- a claim on the empty pool binds on the new node (scale from zero), one NodeClaim;
- ten claims of one card ask for the room that is missing, not ten nodes;
- a node whose cards hold Bound claims carries karpenter.sh/do-not-disrupt, and Karpenter looks at
  it and refuses (its DisruptionBlocked Event names the annotation); once the claims are deleted,
  Karpenter removes the empty nodes;
- no placeholder is left behind, none Terminating on a node without a kubelet.
It prints `FIGURE` lines (claim -> Bound on a new node, nodes asked for vs needed) for bench/README.md.

Also here, without Karpenter: a placeholder that a drain evicted with a grace period on a node without a
kubelet (the real API server keeps it Terminating) is replaced, not kept as its claims' ask.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.controller.decisions import node_protection, node_requests
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import AutoscaleSettings, ControllerSettings
from tests import spawning
from tests.binding import objects as o
from tests.binding.conftest import Cluster, cluster, kube  # noqa: F401  # fixtures
from tests.kube_cluster import TestCluster, server_side_apply, wait_established

pytestmark = [
    pytest.mark.realcluster,
    # Opt-in: Karpenter's cold build is about an hour on 2 cores (testkarpenter/README.md).
    pytest.mark.skipif(os.environ.get("ELASTICGPU_KARPENTER_TESTS") != "1",
                       reason="opt-in (ELASTICGPU_KARPENTER_TESTS=1; builds Karpenter: testkarpenter/build.sh)"),
]

REPO = Path(__file__).resolve().parents[2]
CARDS_PER_NODE = 8
NODEPOOL_LABEL = "karpenter.sh/nodepool"


def _karpenter_build() -> dict[str, str]:
    """current.env of testkarpenter/build.sh, or a skip that says how to get it."""
    reason = os.environ.get("ELASTICGPU_KARPENTER_UNAVAILABLE")
    if reason:
        pytest.skip(reason)
    env_file = Path(os.environ.get("ELASTICGPU_CACHE", Path.home() / ".cache" / "elasticgpu")) / "testkarpenter" / (
        "current.env")
    if not env_file.is_file():
        pytest.skip("Karpenter is not built: run bash testkarpenter/build.sh (scripts/test.sh does)")
    found = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    if not Path(found.get("ELASTICGPU_KARPENTER_BIN", "")).is_file():
        pytest.skip(f"{env_file} names no binary: run bash testkarpenter/build.sh")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def karpenter(kube_cluster: TestCluster, api_client: client.ApiClient, tmp_path: Path) -> Iterator[None]:
    """Karpenter's CRDs applied and Karpenter running (admin identity), stopped at the end."""
    build = _karpenter_build()
    crds = [doc for f in sorted(Path(build["ELASTICGPU_KARPENTER_CRDS"]).glob("*.yaml"))
            for doc in yaml.safe_load_all(f.read_text()) if doc]
    for doc in crds:
        server_side_apply(api_client, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                      f"{doc['metadata']['name']}", doc)
    wait_established(api_client, [d["metadata"]["name"] for d in crds], timeout=60.0)
    log = (tmp_path / "karpenter.log").open("w")
    env = {**os.environ, "KUBECONFIG": str(kube_cluster.kubeconfig), "DISABLE_LEADER_ELECTION": "true",
           "SYSTEM_NAMESPACE": "kube-system", "INSTANCE_TYPES_FILE_PATH": str(REPO / "testkarpenter" /
                                                                               "instance-types.json"),
           "METRICS_PORT": str(_free_port()), "HEALTH_PROBE_PORT": str(_free_port()),
           "BATCH_IDLE_DURATION": "1s", "BATCH_MAX_DURATION": "5s", "LOG_LEVEL": "debug"}
    proc = spawning.spawn([build["ELASTICGPU_KARPENTER_BIN"]], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
        print((tmp_path / "karpenter.log").read_text()[-6000:])


class SimulatedNodes:
    """The new nodes' side: Ready (with heartbeats), and the agent's GPU objects (8 cards)."""

    def __init__(self, api: KubeApi, core: client.CoreV1Api, *, pool: str, model: str) -> None:
        self.kube, self.core, self.pool, self.model = api, core, pool, model
        self.seen: set[str] = set()

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            try:
                self._beat()
            except Exception as err:  # the next beat tries again; the test's deadlines say what failed
                print(f"simulated nodes: {err}")

    def _beat(self) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for node in self.core.list_node(label_selector=f"{NODEPOOL_LABEL}={self.pool}").items:
            name = node.metadata.name
            self.core.patch_node_status(name, {"status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "simulated",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
            if name in self.seen:
                continue
            owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}
            for index in range(CARDS_PER_NODE):
                body = o.gpu(f"gpu-{name}-{index}", node=name, model=self.model, index=index)
                body["metadata"]["ownerReferences"] = [owner]
                with contextlib.suppress(Exception):
                    self.kube.create_gpu(body)
            self.seen.add(name)


def _until(check: Callable[[], bool], what: str | Callable[[], str], *, timeout_s: float) -> None:
    """Wait for `check`; `what` (a callable: read at the timeout, to say what was seen then)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what() if callable(what) else what}")
        time.sleep(0.5)


def _custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.mark.timeout(1500)  # its steps' own deadlines (about 20 minutes in all) say which one failed
def test_karpenter_scales_a_gpu_pool_from_zero_for_claims_and_back(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient, karpenter: None) -> None:  # noqa: F811
    core, custom = client.CoreV1Api(api_client), _custom(api_client)
    pool, model = f"{cluster.prefix}-gpu", f"T{cluster.prefix}"
    custom.create_cluster_custom_object("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses", {
        "apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": pool}})
    custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", {
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": pool},
        "spec": {
            "template": {
                "metadata": {"labels": {"pool": pool}},
                "spec": {
                    "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                      "values": ["gpu-8x-a100"]}],
                    # Only the placeholders (which tolerate every taint) may bring nodes of this pool.
                    "taints": [{"key": "elasticgpu.io/test-pool", "value": pool, "effect": "NoSchedule"}],
                    "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": pool},
                    "expireAfter": "Never",
                },
            },
            "limits": {"nvidia.com/gpu": "24"},
            "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"},
        }})
    parameters = {"gpuModel": model, "nodeSelector": f"pool={pool}"}
    cluster.klass(o.klass(f"{pool}-share", parameters=parameters))
    cluster.klass(o.klass(f"{pool}-whole", provisioner=names.PROVISIONER_PHYSICAL, parameters=parameters))
    settings = ControllerSettings(autoscale=AutoscaleSettings(enabled=True, protect_nodes=True,
                                                              namespace=cluster.namespace, interval_s=1.0))
    controller = Controller(kube, settings, namespace=cluster.namespace)
    stop = threading.Event()
    threads = controller.informer.start(stop, timeout_s=5, listed=controller.rebuild())
    nodes = SimulatedNodes(kube, core, pool=pool, model=model)
    for target in (controller.run_worker, controller.node_autoscaling.run, nodes.run):
        threads.append(threading.Thread(target=target, args=(stop,), daemon=True))
        threads[-1].start()

    def nodeclaims() -> list[dict[str, Any]]:
        found = custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims",
                                                  label_selector=f"{NODEPOOL_LABEL}={pool}")
        return list(found["items"])

    def pool_nodes() -> list[client.V1Node]:
        return list(core.list_node(label_selector=f"{NODEPOOL_LABEL}={pool}").items)

    def bound(name: str) -> dict[str, Any] | None:
        claim = cluster.get_claim(name)
        return claim if (claim.get("status") or {}).get("phase") == "Bound" else None

    def placeholders() -> list[str]:
        return [f"{p['metadata']['name']} (node {p['spec'].get('nodeName')}, deleting "
                f"{p['metadata'].get('deletionTimestamp')})"
                for p in kube.list_labelled_pods(cluster.namespace, placeholder_label)]

    def blocked(node: str) -> list[str]:
        return [e.get("message") or "" for e in kube.list_events("default")
                if e.get("reason") == "DisruptionBlocked" and (e.get("involvedObject") or {}).get("name") == node]

    placeholder_label = f"{node_requests.LABEL_NODE_REQUEST}=true"
    try:
        # Scale from zero: one claim, one NodeClaim, bound on the new node.
        start = time.monotonic()
        cluster.claim(o.claim("first", cores=30, memory="10Gi", class_name=f"{pool}-share"))
        _until(lambda: bound("first") is not None, "the first claim to bind on a node Karpenter added",
               timeout_s=240)
        print(f"FIGURE scale from zero: claim -> Bound on the new node {time.monotonic() - start:.1f}s")
        first = bound("first")
        assert first is not None
        [node] = pool_nodes()
        assert first["status"]["nodeName"] == node.metadata.name
        assert len(nodeclaims()) == 1
        # Its placeholder goes once the claim bound: none left, none Terminating on a kubelet-less node.
        _until(lambda: not placeholders(), lambda: f"the placeholder to go once its claim bound: {placeholders()}",
               timeout_s=30)

        # Ten claims of one card: seven fit the first node's free cards, three need one more node.
        start = time.monotonic()
        for i in range(10):
            cluster.claim(o.claim(f"card-{i}", cards=1, cores=None, memory=None, class_name=f"{pool}-whole"))
        _until(lambda: all(bound(f"card-{i}") for i in range(10)),
               lambda: f"ten one-card claims to bind (placeholders: {placeholders()})", timeout_s=300)
        on_new = [c for c in (bound(f"card-{i}") for i in range(10))
                  if c is not None and c["status"]["nodeName"] != node.metadata.name]
        print(f"FIGURE ten one-card claims: all Bound {time.monotonic() - start:.1f}s, {len(on_new)} on the new node;"
              f" NodeClaims {len(nodeclaims())} (needed 2: 11 cards, 8 a node); placeholders made"
              f" {controller.node_autoscaling.asked}")
        assert len(on_new) == 3
        assert len(nodeclaims()) == 2, [c["metadata"]["name"] for c in nodeclaims()]
        _until(lambda: not placeholders(), lambda: f"the placeholders to go once their claims bound: {placeholders()}",
               timeout_s=30)

        # Nodes holding Bound claims are protected: Karpenter looks at them, refuses, and they stay.
        _until(lambda: all((n.metadata.annotations or {}).get("karpenter.sh/do-not-disrupt") == "true"
                           for n in pool_nodes()), "the pool's nodes to carry karpenter.sh/do-not-disrupt",
               timeout_s=60)
        names_ = [n.metadata.name for n in pool_nodes()]
        # Karpenter evaluates every node each 10 s and says why it may not disrupt one, an Event per node
        # and reason at most every 2 minutes (a new node's first says "not initialized" or "nominated").
        _until(lambda: all(any("do-not-disrupt" in m for m in blocked(n)) for n in names_),
               lambda: f"Karpenter's DisruptionBlocked Event naming do-not-disrupt on {names_} (seen: "
                       f"{ {n: blocked(n) for n in names_} })", timeout_s=200)
        assert sorted(n.metadata.name for n in pool_nodes()) == sorted(names_)
        assert all(bound(n) for n in ("first", *(f"card-{i}" for i in range(10))))

        # Claims deleted: the protection goes, and Karpenter removes the empty nodes.
        for name in ("first", *(f"card-{i}" for i in range(10))):
            kube.delete_claim(cluster.namespace, name)
        _until(lambda: not any(set(n.metadata.annotations or {}) & set(node_protection.PROTECTING)
                               for n in pool_nodes()), "the protection to go once no claim holds a card",
               timeout_s=120)
        start = time.monotonic()
        _until(lambda: not pool_nodes() and not nodeclaims(), "Karpenter to remove the empty nodes", timeout_s=420)
        print(f"FIGURE claims deleted -> both nodes removed {time.monotonic() - start:.1f}s")
    finally:
        stop.set()
        controller.close()
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", pool)
        _until(lambda: not nodeclaims(), "the NodePool's NodeClaims to go", timeout_s=120)
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses", pool)
