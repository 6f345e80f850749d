"""The real-cluster tier: the same fixtures as the rest of the suite (`api_client`,
`crds_installed`, `namespace`, ...), but `kube_cluster` is Kubernetes' own control plane
(tests/realcluster/control_plane.py: kube-apiserver with Node,RBAC authorization, NodeRestriction,
ValidatingAdmissionPolicy and bound service-account tokens; kube-controller-manager; kube-scheduler).

Every test here is marked `realcluster` and skips, naming the command, when testcluster/build.sh
has not built the binary (a cold build takes tens of minutes; the normal suite does not build it).

`box` is another cluster of the same components with a pod network, inside a network namespace
the test makes (elasticgpu/testbed/box.py, through tests/realcluster/box.py): pods without hostNetwork,
kube-proxy, `kubectl exec`.
`box_api_client` is its admin's client.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client, config

from elasticgpu.testbed import processes
from tests.conftest import crd_documents
from tests.kube_cluster import TestCluster, find_kubectl, server_side_apply, wait_established
from tests.realcluster import control_plane
from tests.realcluster.box import Box


@pytest.fixture(scope="session")
def real_control_plane() -> Iterator[control_plane.ControlPlane]:
    """The running control plane (started once per session), or a skip when it is not built."""
    try:
        control_plane.find_k8s_binary()
        control_plane.find_etcd()
    except control_plane.ControlPlaneUnavailable as e:
        pytest.skip(str(e))
    try:
        with control_plane.running_control_plane() as plane:
            yield plane
    except processes.DemoError as e:  # built but not starting: a failure, not a skip
        pytest.fail(f"the real control plane did not start: {e}", pytrace=False)


@pytest.fixture(scope="session")
def kube_cluster(real_control_plane: control_plane.ControlPlane) -> TestCluster:
    """The suite's cluster fixture, on the real control plane (admin: system:masters)."""
    cert, key = real_control_plane.pki.client(control_plane.ADMIN)
    return TestCluster(
        kubeconfig=real_control_plane.kubeconfig,
        server=real_control_plane.server,
        ca_file=real_control_plane.pki.ca_file,
        client_cert_file=cert,
        client_key_file=key,
        log_dir=real_control_plane.directory,
        kubectl=find_kubectl(),
    )


@pytest.fixture(scope="session")
def api_client(kube_cluster: TestCluster) -> Iterator[client.ApiClient]:
    """The admin's client of the real control plane. Overridden here, not only `kube_cluster`: the
    suite's session-scoped `api_client` is cached once per run, so in a run that starts with the
    fixture server's tests it would still point there."""
    api = config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def crds_installed(api_client: client.ApiClient) -> list[str]:
    """crds/*.yaml applied on the real control plane and Established (the suite's is cached per run)."""
    names = []
    for doc in crd_documents():
        name = doc["metadata"]["name"]
        server_side_apply(api_client, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", doc)
        names.append(name)
    wait_established(api_client, names)
    return names


@pytest.fixture(scope="session")
def kubelet_node(real_control_plane: control_plane.ControlPlane) -> Iterator[str]:
    """One node: the test containerd and Kubernetes' kubelet on it, Ready; yields the node's name.
    Skips when the test runtime is not built (tests/containerd_runtime.py)."""
    from tests.containerd_runtime import RuntimeUnavailable, running_containerd
    from tests.realcluster import kubelet

    node = "realcluster-node-a"
    try:
        runtime_context = running_containerd()
        runtime = runtime_context.__enter__()
    except RuntimeUnavailable as e:
        pytest.skip(str(e))
    try:
        kubelet.give_network_config(runtime.directory / "cni" / "conf")
        with kubelet.running_kubelet(real_control_plane, node, runtime.endpoint) as running:
            core = client.CoreV1Api(config.new_client_from_config(config_file=str(real_control_plane.kubeconfig)))

            def ready() -> bool:
                conditions = core.read_node(node).status.conditions or []
                return any(c.type == "Ready" and c.status == "True" for c in conditions)

            try:
                processes.wait_until(ready, f"Node {node} Ready", timeout_s=kubelet.START_TIMEOUT_S,
                                     children=[running.child])  # fmt: skip
            except processes.DemoError as e:
                pytest.fail(f"kubelet did not make its node Ready: {e}\n{running.child.tail(40)}", pytrace=False)
            yield node
    finally:
        runtime_context.__exit__(None, None, None)


@pytest.fixture(scope="session")
def box() -> Iterator[Box]:
    """The box (tests/realcluster/box.py: a `Box`), made once per session and removed at its end;
    skips naming what to build when a part is not built, fails when it is built but does not come up."""
    from tests.realcluster import box as boxes

    try:
        context = boxes.running_box()
        running = context.__enter__()
    except (boxes.BoxUnavailable, control_plane.ControlPlaneUnavailable) as e:
        pytest.skip(str(e))
    except (boxes.BoxError, processes.DemoError) as e:
        pytest.fail(f"the box did not come up: {e}", pytrace=False)
    try:
        yield running
    finally:
        context.__exit__(None, None, None)


@pytest.fixture(scope="session")
def box_api_client(box: Box) -> Iterator[client.ApiClient]:
    """The box's admin client (system:masters), through its forwarder."""
    api = config.new_client_from_config(config_file=str(box.kubeconfig))
    try:
        yield api
    finally:
        api.close()
