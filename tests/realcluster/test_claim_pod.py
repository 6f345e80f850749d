"""A pod that uses a claim, on Kubernetes' own control plane and kubelet, with the product running
as the chart runs it: the controller and the webhook each with its ServiceAccount's token and the
chart's RBAC (deploy/controller.yaml, deploy/webhook.yaml; the controller's leader election on a
Lease in elasticgpu-system), the agent of a GPU node with its Node-bound token in front of
containerd (tests/realcluster/test_agent_node.py's `gpu_node`).

The real API server calls the webhook, which gates the pod; the controller binds the claim and
lifts the gate with the claim's node as required affinity; the real scheduler places the pod; the
real kubelet starts it through the agent's CRI proxy."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.testbed import local_cluster, processes
from tests.kube_cluster import TestCluster, kube_request
from tests.realcluster import install
from tests.realcluster.control_plane import ControlPlane
from tests.realcluster.test_agent_node import GpuNode
from tests.realcluster.test_agent_node import gpu_node as gpu_node  # the module fixture, shared

pytestmark = pytest.mark.realcluster

SYSTEM = "elasticgpu-system"
CONFIGURATION = "elasticgpu-pods"  # the name the chart's RBAC lets the webhook manage (resourceNames)
WITHIN_S = 120.0
CUSTOM = f"/apis/{names.GROUP}/{names.VERSION}"


def _elasticgpu(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "elasticgpu", *arguments]


@pytest.fixture(scope="module")
def product(kube_cluster: TestCluster, real_control_plane: ControlPlane, api_client: client.ApiClient,
            crds_installed: list[str]) -> Iterator[None]:  # fmt: skip
    """Controller and webhook as processes, with the chart's identities and RBAC."""
    for manifest in ("controller.yaml", "webhook.yaml"):
        install.apply_file(api_client, install.DEPLOY / manifest, install.IDENTITY_KINDS)
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="egpr-", dir="/tmp")))
        controller_config = install.service_account_kubeconfig(kube_cluster, "elasticgpu-controller", SYSTEM, home)
        webhook_config = install.service_account_kubeconfig(kube_cluster, "elasticgpu-webhook", SYSTEM, home)
        children = real_control_plane.children
        controller = children.start("controller", _elasticgpu(
            "controller", "--kubeconfig", str(controller_config), "--health-probe-bind-address", "0",
            "--metrics-bind-address", "0"), log=home / "controller.log",
            env={"POD_NAMESPACE": SYSTEM, "ELASTICGPU_RESYNC_INTERVAL_S": "10"})  # fmt: skip
        stack.callback(controller.stop)
        port = local_cluster.free_port()
        webhook = children.start("webhook", _elasticgpu(
            "webhook", "--kubeconfig", str(webhook_config), "--namespace", SYSTEM,
            "--configuration-name", CONFIGURATION, "--url", f"https://127.0.0.1:{port}",
            "--listen-host", "127.0.0.1", "--port", str(port), "--health-probe-bind-address", "0",
            "--metrics-bind-address", "0"), log=home / "webhook.log")  # fmt: skip
        stack.callback(webhook.stop)
        configuration = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{CONFIGURATION}"
        stack.callback(kube_request, api_client, "DELETE", configuration)

        def lease() -> bool:
            answer = kube_request(api_client, "GET", f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM}/leases")
            return answer.status == 200 and bool(answer.json()["items"])

        processes.wait_until(lease, f"the controller's leader Lease in {SYSTEM}", timeout_s=WITHIN_S,
                             children=[controller, webhook])  # fmt: skip
        yield
        for child in (controller, webhook):
            refused = [line for line in child.log.read_text(errors="replace").splitlines() if " 403" in line]
            assert not refused, f"{child.name} was refused under the chart's RBAC:\n" + "\n".join(refused[:10])


def _pod(name: str, claim: str, image: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {names.claim_annotation("main"): claim}},
        "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": image, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]}]},
    }  # fmt: skip


def _container_env(endpoint: str, namespace: str, pod: str) -> dict[str, str]:
    """The environment of the pod's container `main` in its OCI spec (CRI ContainerStatus, verbose)."""
    import json

    import grpc

    from elasticgpu.agent.cri import api

    with grpc.insecure_channel(endpoint) as channel:
        stub = api.services.RuntimeServiceStub(channel)
        wanted = {"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": pod,
                  "io.kubernetes.container.name": "main"}  # fmt: skip
        found = stub.ListContainers(api.pb.ListContainersRequest(
            filter=api.pb.ContainerFilter(label_selector=wanted)), timeout=10).containers  # fmt: skip
        assert found, f"no container of {namespace}/{pod} in the node's runtime"
        status = stub.ContainerStatus(api.pb.ContainerStatusRequest(container_id=found[0].id, verbose=True), timeout=10)
    spec = json.loads(status.info["info"])["runtimeSpec"]
    return dict(item.split("=", 1) for item in spec["process"]["env"])


def container_exec(endpoint: str, namespace: str, pod: str, command: list[str]) -> str:
    """Run `command` inside the pod's running container `main` through the runtime (CRI ExecSync, as
    `kubectl exec` ends up doing: the API server cannot reach kubelet here); its stdout. What the
    process inside sees, not what the container was created with."""
    import grpc

    from elasticgpu.agent.cri import api

    with grpc.insecure_channel(endpoint) as channel:
        stub = api.services.RuntimeServiceStub(channel)
        wanted = {"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": pod,
                  "io.kubernetes.container.name": "main"}  # fmt: skip
        found = stub.ListContainers(api.pb.ListContainersRequest(filter=api.pb.ContainerFilter(
            label_selector=wanted, state=api.pb.ContainerStateValue(state=api.pb.CONTAINER_RUNNING))),
            timeout=10).containers  # fmt: skip
        assert len(found) == 1, f"running containers of {namespace}/{pod}: {found}"
        done = stub.ExecSync(api.pb.ExecSyncRequest(container_id=found[0].id, cmd=command, timeout=10), timeout=20)
    assert done.exit_code == 0, f"{command} in {namespace}/{pod}: {done.exit_code} {done.stderr.decode()}"
    return str(done.stdout.decode())


def container_env(endpoint: str, namespace: str, pod: str) -> dict[str, str]:
    """The environment the process in the pod's container `main` sees (`env`, run inside it)."""
    lines = container_exec(endpoint, namespace, pod, ["env"]).splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_a_pod_with_a_claim_is_gated_then_scheduled_to_the_claims_node_and_started(
    api_client: client.ApiClient,
    product: None,
    gpu_node: GpuNode,
    kubelet_node: str,  # a second Ready node (without cards) the scheduler could pick without the affinity
    namespace: str,
) -> None:
    core = client.CoreV1Api(api_client)
    tag = uuid.uuid4().hex[:8]
    klass = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": f"real-{tag}"},
             "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": "A100"},
             "reclaimPolicy": "Delete", "bindingMode": "Immediate"}  # fmt: skip
    assert kube_request(api_client, "POST", f"{CUSTOM}/{names.PLURAL_CLASS}", body=klass).status == 201
    claim = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "metadata": {"name": "slice"},
             "spec": {"elasticGPUClassName": klass["metadata"]["name"],
                      "resources": {"requests": {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"}}}}  # fmt: skip
    claims = f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
    answer = kube_request(api_client, "POST", claims, body=claim)
    assert answer.status == 201, answer.body
    # The webhook gates the pod at creation (the real API server calls it; no retry hides a miss).
    deadline = time.monotonic() + WITHIN_S
    while True:
        created = kube_request(api_client, "POST", f"/api/v1/namespaces/{namespace}/pods", body=_pod("probe", "slice",
                               gpu_node.image), query=[("dryRun", "All")]).json()  # fmt: skip
        if any(g.get("name") == names.SCHEDULING_GATE for g in created["spec"].get("schedulingGates") or []):
            break
        assert time.monotonic() < deadline, f"the API server does not call the webhook: {created}"
        time.sleep(0.5)
    created = core.create_namespaced_pod(namespace, _pod("user", "slice", gpu_node.image))
    assert [g.name for g in created.spec.scheduling_gates or []] == [names.SCHEDULING_GATE]
    assert created.spec.node_name is None
    deadline = time.monotonic() + WITHIN_S
    while (pod := core.read_namespaced_pod("user", namespace)).status.phase != "Running":
        assert time.monotonic() < deadline, f"pod not Running: {pod.spec.node_name} {pod.status}"
        time.sleep(0.5)
    bound = kube_request(api_client, "GET", f"{claims}/slice").json()
    assert bound["status"]["phase"] == "Bound", bound["status"]
    assert bound["status"]["nodeName"] == gpu_node.name
    assert pod.spec.node_name == gpu_node.name  # placed by kube-scheduler, from the affinity the gate lift wrote
    assert not pod.spec.scheduling_gates
    # What the container was created with, as containerd holds it (the OCI spec after CDI).
    env = _container_env(gpu_node.runtime_endpoint, namespace, "user")
    assert env.get("NVIDIA_VISIBLE_DEVICES") == ",".join(bound["status"]["gpus"]), env
    # What the process inside sees (issue 24 item 2): exactly its card, and its slice's limits in
    # the limits file the agent mounts at /run/elasticgpu (docs/resize-node.md).
    inside = container_env(gpu_node.runtime_endpoint, namespace, "user")
    assert inside.get("NVIDIA_VISIBLE_DEVICES") == bound["status"]["gpus"][0], inside
    assert len(bound["status"]["gpus"]) == 1
    limits_file = inside.get("ELASTICGPU_LIMITS_FILE")
    assert limits_file == "/run/elasticgpu/limits.json", inside
    limits = json.loads(container_exec(gpu_node.runtime_endpoint, namespace, "user", ["cat", limits_file]))
    assert (limits["claim"], limits["cores"], limits["memoryMiB"]) == (f"{namespace}/slice", 30, 10240), limits
    shell = container_exec(gpu_node.runtime_endpoint, namespace, "user", ["cat", "/run/elasticgpu/limits.env"])
    assert {"ELASTICGPU_CORES=30", "ELASTICGPU_MEMORY_MIB=10240"} <= set(shell.splitlines()), shell
    core.delete_namespaced_pod("user", namespace)
    kube_request(api_client, "DELETE", f"{claims}/slice")
    kube_request(api_client, "DELETE", f"{CUSTOM}/{names.PLURAL_CLASS}/{klass['metadata']['name']}")


def test_an_inline_claim_and_its_elasticgpu_go_with_the_pod(
    api_client: client.ApiClient,
    product: None,
    gpu_node: GpuNode,
    namespace: str,
) -> None:
    """The claim made for a pod's inline request is owned by the pod: once the pod is gone the claim
    goes (the real garbage collector follows the ownerReference; the controller also deletes claims
    of pods that are gone, whichever is first), the real kubelet stops the containers through the
    agent, and the controller releases and deletes the ElasticGPU (reclaim Delete): nothing is left."""
    core = client.CoreV1Api(api_client)
    tag = uuid.uuid4().hex[:8]
    klass = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": f"inline-{tag}"},
             "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": "A100"},
             "reclaimPolicy": "Delete", "bindingMode": "Immediate"}  # fmt: skip
    assert kube_request(api_client, "POST", f"{CUSTOM}/{names.PLURAL_CLASS}", body=klass).status == 201
    body = _pod("inline", "", gpu_node.image)
    body["metadata"]["annotations"] = {
        names.inline_request_annotation("main"): f"gpu-core=20,gpu-memory=8Gi,class={klass['metadata']['name']}"
    }
    pod = core.create_namespaced_pod(namespace, body)
    claims = f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
    egpus = [("labelSelector", f"{names.LABEL_CLAIM_NAMESPACE}={namespace}")]
    deadline = time.monotonic() + WITHIN_S
    while core.read_namespaced_pod("inline", namespace).status.phase != "Running":
        assert time.monotonic() < deadline, "the pod with an inline request is not Running"
        time.sleep(0.5)
    made = kube_request(api_client, "GET", claims).json()["items"]
    assert [ref["uid"] for c in made for ref in c["metadata"].get("ownerReferences") or []] == [pod.metadata.uid]
    bound = kube_request(api_client, "GET", f"{CUSTOM}/{names.PLURAL_ELASTIC_GPU}", query=egpus).json()["items"]
    assert [e["status"]["phase"] for e in bound] == ["Bound"]
    core.delete_namespaced_pod("inline", namespace)
    deadline = time.monotonic() + WITHIN_S
    while True:
        left_claims = kube_request(api_client, "GET", claims).json()["items"]
        left = kube_request(api_client, "GET", f"{CUSTOM}/{names.PLURAL_ELASTIC_GPU}", query=egpus).json()["items"]
        if not left_claims and not left:
            break
        assert time.monotonic() < deadline, (
            f"after the pod: claims {[c['metadata']['name'] for c in left_claims]}, "
            f"ElasticGPUs {[(e['metadata']['name'], e.get('status')) for e in left]}"
        )
        time.sleep(1)
    kube_request(api_client, "DELETE", f"{CUSTOM}/{names.PLURAL_CLASS}/{klass['metadata']['name']}")


def _wait_for_collector_to_know_claims(api_client: client.ApiClient, namespace: str) -> None:
    """Wait until the garbage collector watches ElasticGPUClaims: it learns a CRD's resource only at
    its next discovery (kube-controller-manager: every 30 s), and until then it sees no dependent of
    that kind, so a foreground delete of their owner does not wait (the pod went first in 2 runs of 3
    when this test ran 20 s after the CRDs were applied). The same holds on any cluster right after
    the CRDs are installed. Probe by behaviour: a claim owned by a deleted ConfigMap must go."""
    core = client.CoreV1Api(api_client)
    claims = f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "gc-probe"}})
    probe = _claim_body("gc-probe", "gc-probe-no-such-class", 1, "1Mi")  # stays Pending: nothing else touches it
    probe["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "gc-probe",
                                             "uid": owner.metadata.uid}]  # fmt: skip
    assert kube_request(api_client, "POST", claims, body=probe).status == 201
    core.delete_namespaced_config_map("gc-probe", namespace)
    deadline = time.monotonic() + 90.0  # three discovery periods
    while kube_request(api_client, "GET", f"{claims}/gc-probe").status != 404:
        assert time.monotonic() < deadline, "the garbage collector does not delete an orphaned ElasticGPUClaim"
        time.sleep(0.5)


@pytest.mark.parametrize("grace", [None, 0], ids=["graceful", "forced"])
def test_foreground_deletion_of_a_pod_removes_its_inline_claim_first(
    api_client: client.ApiClient,
    product: None,
    gpu_node: GpuNode,
    namespace: str,
    grace: int | None,
) -> None:
    """Issue 28.1 on the real garbage collector (tests/pods/test_inline_foreground.py skips without
    one): the inline claim blocks its owner's deletion (`blockOwnerDeletion`, as a generic ephemeral
    volume's claim), so with `propagationPolicy: Foreground` the pod object is never gone while its
    claim is there; and nothing is left: kubelet shuts the pod down (grace 0), the controller lets the
    claim go (a shut-down pod uses nothing, no cycle), the collector then lets the pod go, and the
    controller deletes the ElasticGPU.

    `forced` (grace 0, as `kubectl delete --force --grace-period=0`) is the case only
    blockOwnerDeletion orders: the pod is shut down at once and would be gone at once, while its
    claim waits for the controller. (With `graceful`, kubelet's final delete comes seconds after the
    containers stopped, and the controller has released the claim by then even without it.)"""
    core = client.CoreV1Api(api_client)
    _wait_for_collector_to_know_claims(api_client, namespace)
    tag = uuid.uuid4().hex[:8]
    klass = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": f"fg-{tag}"},
             "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": "A100"},
             "reclaimPolicy": "Delete", "bindingMode": "Immediate"}  # fmt: skip
    assert kube_request(api_client, "POST", f"{CUSTOM}/{names.PLURAL_CLASS}", body=klass).status == 201
    body = _pod("fg", "", gpu_node.image)
    body["metadata"]["annotations"] = {
        names.inline_request_annotation("main"): f"gpu-core=10,gpu-memory=4Gi,class={klass['metadata']['name']}"
    }
    core.create_namespaced_pod(namespace, body)
    claims = f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
    egpus = [("labelSelector", f"{names.LABEL_CLAIM_NAMESPACE}={namespace}")]
    deadline = time.monotonic() + WITHIN_S
    while core.read_namespaced_pod("fg", namespace).status.phase != "Running":
        assert time.monotonic() < deadline, "the pod with an inline request is not Running"
        time.sleep(0.5)
    (claim,) = kube_request(api_client, "GET", claims).json()["items"]
    assert [r["blockOwnerDeletion"] for r in claim["metadata"]["ownerReferences"]] == [True]
    core.delete_namespaced_pod("fg", namespace, propagation_policy="Foreground", grace_period_seconds=grace)
    pods = f"/api/v1/namespaces/{namespace}/pods/fg"
    claim_path = f"{claims}/{claim['metadata']['name']}"
    seen_waiting = False  # the pod object kept by the collector (finalizer foregroundDeletion) for its claim
    deadline = time.monotonic() + WITHIN_S
    while True:
        # The pod first, then the claim: with the claim gone first (as it must be), a pod read as
        # gone means the claim was gone before that read, so the later read finds no claim either;
        # a claim read after its pod was gone is the pod gone first. (The other order races: the
        # collector may let the pod go in the milliseconds between the two reads.)
        pod = kube_request(api_client, "GET", pods)
        now = kube_request(api_client, "GET", claim_path)
        claim_there = now.status == 200
        assert not (claim_there and pod.status == 404), (
            f"the pod object went before its inline claim: the claim is {now.json()['metadata']}"
        )
        if pod.status == 200 and "foregroundDeletion" in (pod.json()["metadata"].get("finalizers") or []):
            seen_waiting = True
        if not claim_there and pod.status == 404:
            break
        assert time.monotonic() < deadline, (
            f"after a foreground delete: claim there {claim_there}, pod {pod.status} "
            f"{pod.json()['metadata'] if pod.status == 200 else ''}"
        )
        time.sleep(0.1)
    assert seen_waiting, "the garbage collector never held the pod (foregroundDeletion) for its claim"
    deadline = time.monotonic() + WITHIN_S
    while left := kube_request(api_client, "GET", f"{CUSTOM}/{names.PLURAL_ELASTIC_GPU}", query=egpus).json()["items"]:
        assert time.monotonic() < deadline, (
            f"ElasticGPUs left: {[(e['metadata']['name'], e.get('status')) for e in left]}"
        )
        time.sleep(1)
    kube_request(api_client, "DELETE", f"{CUSTOM}/{names.PLURAL_CLASS}/{klass['metadata']['name']}")


def _claim_body(name: str, klass: str, cores: int, memory: str) -> dict[str, Any]:
    requests = {names.RESOURCE_CORE: cores, names.RESOURCE_MEMORY: memory}
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "metadata": {"name": name},
            "spec": {"elasticGPUClassName": klass, "resources": {"requests": requests}}}  # fmt: skip


def _wait_status(api_client: client.ApiClient, path: str, done: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + WITHIN_S
    while True:
        status: dict[str, Any] = kube_request(api_client, "GET", path).json().get("status") or {}
        if done(status):
            return status
        assert time.monotonic() < deadline, f"{what}: {status}"
        time.sleep(0.5)


def test_a_quota_holds_a_claim_over_it_and_a_resize_within_it_under_the_charts_rbac(
    api_client: client.ApiClient,
    product: None,
    gpu_node: GpuNode,
    namespace: str,
) -> None:
    """An ElasticGPUQuota read and charged by the controller with the chart's RBAC (no 403: the
    `product` fixture checks its log): a claim within binds, one over stays Pending QuotaExceeded;
    a claim of an allowClaimResize class grows in place within the quota, and the held claim binds
    once room is freed."""
    tag = uuid.uuid4().hex[:8]
    klass = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS, "metadata": {"name": f"quota-{tag}"},
             "provisioner": names.PROVISIONER_GPUSHARE, "parameters": {"gpuModel": "A100"},
             "reclaimPolicy": "Delete", "bindingMode": "Immediate", "allowClaimResize": True}  # fmt: skip
    class_name = klass["metadata"]["name"]
    assert kube_request(api_client, "POST", f"{CUSTOM}/{names.PLURAL_CLASS}", body=klass).status == 201
    quota = {"apiVersion": names.API_VERSION, "kind": names.KIND_QUOTA, "metadata": {"name": "team"},
             "spec": {"hard": {names.RESOURCE_CORE: 50}}}  # fmt: skip
    answer = kube_request(api_client, "POST", f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_QUOTA}", body=quota)
    assert answer.status == 201, answer.body
    # The claims follow at once: the controller's quota watch may deliver the quota after the first
    # claim, and the bind must still charge it (docs/quota.md: a live list when the watch is behind).
    claims = f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
    assert kube_request(api_client, "POST", claims, body=_claim_body("within", class_name, 20, "4Gi")).status == 201
    _wait_status(api_client, f"{claims}/within", lambda s: s.get("phase") == "Bound", "the claim within the quota")
    assert kube_request(api_client, "POST", claims, body=_claim_body("over", class_name, 40, "4Gi")).status == 201
    held = _wait_status(api_client, f"{claims}/over", lambda s: s.get("reason") == "QuotaExceeded",
                        "the claim over the quota")  # fmt: skip
    assert held["phase"] == "Pending", held
    # Grow `within` from 20 to 30 cores: 30 <= 50, in place on its card.
    grow = {"spec": {"resources": {"requests": {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "4Gi"}}}}
    answer = kube_request(api_client, "PATCH", f"{claims}/within", body=grow,
                          headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
    assert answer.status == 200, answer.body
    grown = _wait_status(api_client, f"{claims}/within", lambda s: int((s.get("capacity") or {}).get(
        names.RESOURCE_CORE, 0)) == 30, "the resize")  # fmt: skip
    assert grown["phase"] == "Bound", grown
    used = _wait_status(api_client, f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_QUOTA}/team",
                        lambda s: (s.get("used") or {}).get(names.RESOURCE_CORE) == 30, "the quota's use")  # fmt: skip
    assert [(c["claim"], c["cores"]) for c in used["charges"]] == [("within", 30)], used
    assert kube_request(api_client, "GET", f"{claims}/over").json()["status"]["phase"] == "Pending"
    kube_request(api_client, "DELETE", f"{claims}/within")
    _wait_status(api_client, f"{claims}/over", lambda s: s.get("phase") == "Bound", "the held claim after room freed")
    kube_request(api_client, "DELETE", f"{claims}/over")
    kube_request(api_client, "DELETE", f"{CUSTOM}/{names.PLURAL_CLASS}/{class_name}")


WORKLOADS = Path(__file__).resolve().parents[2] / "examples" / "workloads"
LOOP = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]


def _runnable_here(doc: dict[str, Any], image: str) -> dict[str, Any]:
    """An example's object with only what this node cannot run swapped: the test image (no CUDA, no
    registry), a shell in place of nvidia-smi, the host's network (the node has no CNI). Annotations,
    claims, requests and workload shapes stay as the example has them."""
    spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"] if "template" in doc["spec"] \
        else None  # fmt: skip
    if spec is not None:
        finishes = doc["kind"] == "Job"
        spec.update({"hostNetwork": True, "terminationGracePeriodSeconds": 1})
        for container in spec["containers"]:
            container.update({"image": image, "imagePullPolicy": "Never",
                              "command": ["/bin/sh", "-c", "echo done"] if finishes else LOOP})  # fmt: skip
    return doc


def _create(api_client: client.ApiClient, namespace: str, doc: dict[str, Any]) -> None:
    kind = doc["kind"]
    path = {"ElasticGPUClaim": f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}",
            "Pod": f"/api/v1/namespaces/{namespace}/pods",
            "Deployment": f"/apis/apps/v1/namespaces/{namespace}/deployments",
            "Job": f"/apis/batch/v1/namespaces/{namespace}/jobs"}[kind]  # fmt: skip
    answer = kube_request(api_client, "POST", path, body=doc)
    assert answer.status == 201, f"{kind} {doc['metadata']['name']}: {answer.body}"


def _container_sees(endpoint: str, namespace: str, pod: str, container: str) -> str:
    """NVIDIA_VISIBLE_DEVICES as the container was created with it (its OCI spec, CRI ContainerStatus)."""
    import grpc

    from elasticgpu.agent.cri import api

    with grpc.insecure_channel(endpoint) as channel:
        stub = api.services.RuntimeServiceStub(channel)
        wanted = {"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": pod,
                  "io.kubernetes.container.name": container}  # fmt: skip
        found = stub.ListContainers(api.pb.ListContainersRequest(
            filter=api.pb.ContainerFilter(label_selector=wanted)), timeout=10).containers  # fmt: skip
        assert found, f"no container {container} of {namespace}/{pod} in the node's runtime"
        status = stub.ContainerStatus(api.pb.ContainerStatusRequest(container_id=found[0].id, verbose=True), timeout=10)
    spec = json.loads(status.info["info"])["runtimeSpec"]
    env = dict(item.split("=", 1) for item in spec["process"]["env"])
    return env.get("NVIDIA_VISIBLE_DEVICES", "")


@pytest.mark.parametrize("example", sorted(p.name for p in WORKLOADS.glob("*.yaml")))
def test_each_workload_example_runs_on_the_real_control_plane(
    api_client: client.ApiClient,
    product: None,
    gpu_node: GpuNode,
    namespace: str,
    example: str,
) -> None:
    """examples/workloads/ as a user applies them (issue 50): the real Deployment and Job controllers make
    the pods, the webhook gates them, the controller binds each claim (a replica's inline claim, a
    group's claims together) and lifts the gates, the scheduler and kubelet run them; each container is
    created with exactly its claim's cards. Then everything is deleted and nothing of it is left."""
    import yaml

    core = client.CoreV1Api(api_client)
    klass = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLASS,
             "metadata": {"name": f"examples-{uuid.uuid4().hex[:8]}",
                          "annotations": {names.ANNOTATION_DEFAULT_CLASS: "true"}},  # the examples name no class
             "provisioner": names.PROVISIONER_GPUSHARE, "reclaimPolicy": "Delete",
             "bindingMode": "Immediate"}  # fmt: skip
    assert kube_request(api_client, "POST", f"{CUSTOM}/{names.PLURAL_CLASS}", body=klass).status == 201
    claims = f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}"
    docs = [_runnable_here(d, gpu_node.image) for d in yaml.safe_load_all((WORKLOADS / example).read_text()) if d]
    try:
        for doc in docs:
            _create(api_client, namespace, doc)
        kinds = [d["kind"] for d in docs]
        replicas = sum(d["spec"].get("replicas", 1) for d in docs if d["kind"] == "Deployment")
        jobs = [d["metadata"]["name"] for d in docs if d["kind"] == "Job"]
        deadline = time.monotonic() + 2 * WITHIN_S  # a loaded 2-core machine: controllers, webhook, kubelet
        while True:
            pods = core.list_namespaced_pod(namespace).items
            running = [p for p in pods if p.status.phase == "Running"]
            done = {j: kube_request(api_client, "GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{j}").json()
                    .get("status", {}).get("succeeded", 0) for j in jobs}  # fmt: skip
            want_running = kinds.count("Pod") + replicas
            if len(running) == want_running and all(done.values()):
                break
            assert time.monotonic() < deadline, (
                f"{example}: running {[p.metadata.name for p in running]} of {want_running}, jobs {done}, pods "
                f"{[(p.metadata.name, p.status.phase, [g.name for g in p.spec.scheduling_gates or []]) for p in pods]}")
            time.sleep(1)
        bound = {c["metadata"]["name"]: c for c in kube_request(api_client, "GET", claims).json()["items"]}
        assert len(bound) == kinds.count("ElasticGPUClaim") + replicas, sorted(bound)
        phases = {n: c.get("status", {}).get("phase") for n, c in bound.items()}
        assert set(phases.values()) == {"Bound"}, phases
        assert {c["status"]["nodeName"] for c in bound.values()} == {gpu_node.name}
        for pod in running:  # each running container holds exactly its own claim's cards
            for container in pod.spec.containers:
                owned = [n for n, c in bound.items()
                         if any(r["uid"] == pod.metadata.uid for r in c["metadata"].get("ownerReferences") or [])]
                claim_name = (pod.metadata.annotations or {}).get(names.claim_annotation(container.name)) or owned[0]
                cards = ",".join(bound[claim_name]["status"]["gpus"])
                seen = _container_sees(gpu_node.runtime_endpoint, namespace, pod.metadata.name, container.name)
                assert seen == cards, f"{pod.metadata.name}/{container.name}: {claim_name} holds {cards}, sees {seen}"
    finally:
        for doc in reversed(docs):
            kind, name = doc["kind"], doc["metadata"]["name"]
            path = {"ElasticGPUClaim": f"{claims}/{name}", "Pod": f"/api/v1/namespaces/{namespace}/pods/{name}",
                    "Deployment": f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
                    "Job": f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"}[kind]  # fmt: skip
            kube_request(api_client, "DELETE", path, body={"propagationPolicy": "Background"})
        deadline = time.monotonic() + 2 * WITHIN_S
        while left := [c["metadata"]["name"] for c in kube_request(api_client, "GET", claims).json()["items"]]:
            assert time.monotonic() < deadline, f"{example}: claims left after the workloads went: {left}"
            time.sleep(1)
        kube_request(api_client, "DELETE", f"{CUSTOM}/{names.PLURAL_CLASS}/{klass['metadata']['name']}")
