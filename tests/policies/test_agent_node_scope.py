"""Each node's agent writes only its own node's objects: deploy/policies/agent-node-scope.yaml.

Two agent identities are the deployed ServiceAccount with the node name a Node-bound token
carries (`authentication.kubernetes.io/node-name` in the user's extra info), made here by
impersonation: the test API server authenticates client certificates only, and impersonation
yields the same user info a bound token gives on a real cluster. The writes are the agent's own
(`elasticgpu.agent.kube.AgentKube` over a client that impersonates), so a request shape the
agent really sends is what the policies judge.

The first test shows that without the policies (RBAC alone, as deploy/agent.yaml grants it)
node A's agent can write node B's card: the refusals after it come from the policies.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from elasticgpu.agent import errors
from elasticgpu.agent import kube as agent_api
from elasticgpu.api import names
from tests.binding import objects as o
from tests.kube_cluster import TestCluster, kube_request, server_side_apply

POLICIES_FILE = Path(__file__).resolve().parents[2] / "deploy" / "policies" / "agent-node-scope.yaml"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
AGENT_USER = "system:serviceaccount:elasticgpu-system:elasticgpu-agent"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
GPUS = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_GPU}"
NOT_BOUND = "the elasticgpu agent writes with a token that names its node; this one names none"


def _documents() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(POLICIES_FILE.read_text()) if doc]


def _plural(doc: dict[str, Any]) -> str:
    return "validatingadmissionpolicies" if doc["kind"] == "ValidatingAdmissionPolicy" else (
        "validatingadmissionpolicybindings")  # fmt: skip


def _policies_installed(api: client.ApiClient) -> bool:
    return any(kube_request(api, "GET", f"{ADMISSION}/{_plural(d)}/{d['metadata']['name']}").status == 200
               for d in _documents())  # fmt: skip


@contextlib.contextmanager
def _agent(cluster: TestCluster, identity: str | None, node: str) -> Iterator[agent_api.AgentKube]:
    """The agent's API client for `node`, authenticated as the agent of node `identity`
    (None: a token of the ServiceAccount bound to no Node)."""
    api = agent_api.load_api_client(str(cluster.kubeconfig), None)
    api.set_default_header("Impersonate-User", AGENT_USER)
    if identity is not None:
        api.set_default_header("Impersonate-Extra-" + NODE_NAME_EXTRA.replace("/", "%2F"), identity)
    kube = agent_api.AgentKube(api, node_name=node, field_manager="elasticgpu-agent")
    try:
        yield kube
    finally:
        kube.close()


def _status(api: client.ApiClient, path: str, status: dict[str, Any]) -> None:
    answer = kube_request(api, "PATCH", path + "/status", body={"status": status},
                          headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
    assert answer.status == 200, answer.json()


class Scene:
    """Nodes A and B, a card and a Bound claim on each, made by an admin."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        tag = uuid.uuid4().hex[:8]
        self.nodes = {side: f"policy-{tag}-{side}" for side in "ab"}
        self.gpus = {side: f"gpu-{tag}-{side}" for side in "ab"}
        self.claims = {side: f"claim-{side}" for side in "ab"}
        core = client.CoreV1Api(api)
        for side in "ab":
            core.create_node({"metadata": {"name": self.nodes[side], "labels": {"team": "x"}}})
            body = o.gpu(self.gpus[side], node=self.nodes[side])
            body["metadata"]["labels"] = {names.LABEL_NODE: self.nodes[side]}
            assert kube_request(api, "POST", GPUS, body=body).status == 201
            allocation = {"elasticGPU": f"egpu-{side}", "cores": 10, "memory": 1024}
            _status(api, f"{GPUS}/{self.gpus[side]}", {"allocations": [allocation]})
            claim = o.claim(self.claims[side], namespace, cores=10, memory="1Gi")
            claim["metadata"].pop("uid", None)
            assert kube_request(api, "POST", self.claim_path(side, ""), body=claim).status == 201, side
            _status(api, self.claim_path(side), {
                "phase": "Bound", "nodeName": self.nodes[side], "gpus": [self.gpus[side].upper()],
                "conditions": [{"type": "Bound", "status": "True", "reason": "Bound", "message": "bound",
                                "lastTransitionTime": "2026-12-03T00:00:00Z"}],
            })  # fmt: skip

    def claim_path(self, side: str, name: str | None = None) -> str:
        base = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{self.namespace}/{names.PLURAL_CLAIM}"
        name = self.claims[side] if name is None else name
        return f"{base}/{name}" if name else base

    def gpu(self, side: str) -> dict[str, Any]:
        return dict(kube_request(self.api, "GET", f"{GPUS}/{self.gpus[side]}").json())

    def claim(self, side: str) -> dict[str, Any]:
        return dict(kube_request(self.api, "GET", self.claim_path(side)).json())

    def cleanup(self) -> None:
        core = client.CoreV1Api(self.api)
        for side in "ab":
            kube_request(self.api, "DELETE", f"{GPUS}/{self.gpus[side]}")
            with contextlib.suppress(client.ApiException):
                core.delete_node(self.nodes[side])


@pytest.fixture
def scene(api_client: client.ApiClient, namespace: str, crds_installed: list[str]) -> Iterator[Scene]:
    made = Scene(api_client, namespace)
    try:
        yield made
    finally:
        made.cleanup()


def _usage_of(kube: agent_api.AgentKube, gpu: str, used: int) -> Callable[[], object]:
    def write() -> object:
        version = kube.read_gpu(gpu)["metadata"]["resourceVersion"]
        return kube.patch_gpu_status(gpu, resource_version=version, status={"usage": {"memoryUsed": used}})

    return write


def test_without_the_policies_an_agent_writes_any_node(
    kube_cluster: TestCluster, api_client: client.ApiClient, scene: Scene
) -> None:
    assert not _policies_installed(api_client), "this test needs a cluster without the agent policies"
    with _agent(kube_cluster, scene.nodes["a"], scene.nodes["b"]) as intruder:
        _usage_of(intruder, scene.gpus["b"], 7)()
        intruder.patch_node_labels({"team": "stolen"})
    assert scene.gpu("b")["status"]["usage"] == {"memoryUsed": 7}


@pytest.fixture
def agent_policies(api_client: client.ApiClient, kube_cluster: TestCluster, namespace: str) -> Iterator[list[str]]:
    """deploy/policies/agent-node-scope.yaml applied as deployed; deleted afterwards. Waits until
    the API server enforces them (it reads policies and their bindings through informers, each on
    its own: the Node policy in force says nothing of the Events one, so both are probed)."""
    documents = _documents()
    for doc in documents:
        server_side_apply(api_client, f"{ADMISSION}/{_plural(doc)}/{doc['metadata']['name']}", doc)
    probe = f"probe-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api_client).create_node({"metadata": {"name": probe}})
    try:
        with _agent(kube_cluster, None, probe) as unbound:

            def refused(write: Callable[[], object]) -> bool:
                try:
                    write()
                except errors.KubeError as error:
                    return NOT_BOUND in str(error)
                return False

            def enforced() -> bool:
                # Its own reason: an Event written before the policy is in force is none the tests count.
                return refused(lambda: unbound.patch_node_labels({"nvidia.com/gpu.present": "true"})) and refused(
                    lambda: unbound.create_event(namespace=namespace, involved={"kind": "GPU", "name": probe},
                                                 type_="Normal", reason="PolicyProbe", message="probe",
                                                 now="2026-12-03T00:00:00Z"))

            _wait(enforced, "the agent policies in force")
        yield [d["metadata"]["name"] for d in documents if d["kind"] == "ValidatingAdmissionPolicy"]
    finally:
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(api_client).delete_node(probe)
        for doc in reversed(documents):
            kube_request(api_client, "DELETE", f"{ADMISSION}/{_plural(doc)}/{doc['metadata']['name']}")


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def _refused(write: Callable[[], object], *says: str) -> str:
    with pytest.raises(errors.KubeError) as caught:
        write()
    message = str(caught.value)
    assert caught.value.status == 403, message
    for text in says:
        assert text in message, message
    return message


def test_each_agent_writes_its_own_node(
    kube_cluster: TestCluster, scene: Scene, agent_policies: list[str]
) -> None:
    for side in "ab":
        node, gpu = scene.nodes[side], scene.gpus[side]
        with _agent(kube_cluster, node, node) as agent:
            _usage_of(agent, gpu, 100 if side == "a" else 200)()
            before = agent.read_gpu(gpu)
            agent.apply_gpu(gpu, labels={names.LABEL_NODE: node}, spec=before["spec"])
            agent.patch_node_labels({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "1"})
            claim = scene.claim(side)
            over = {"type": "OverLimit", "status": "True", "reason": "MemoryOverLimit", "message": "over",
                    "lastTransitionTime": "2026-12-03T00:00:00Z"}  # fmt: skip
            agent.patch_claim_status(scene.namespace, scene.claims[side],
                                     resource_version=claim["metadata"]["resourceVersion"],
                                     status={"usage": {"memoryUsed": 10},
                                             "conditions": [*claim["status"]["conditions"], over]})  # fmt: skip
        assert scene.gpu(side)["status"]["usage"] == {"memoryUsed": 100 if side == "a" else 200}
        assert scene.gpu(side)["status"]["allocations"][0]["elasticGPU"] == f"egpu-{side}"
        assert [c["type"] for c in scene.claim(side)["status"]["conditions"]] == ["Bound", "OverLimit"]


def test_an_agent_is_refused_another_nodes_objects(
    kube_cluster: TestCluster, scene: Scene, agent_policies: list[str]
) -> None:
    a, b = scene.nodes["a"], scene.nodes["b"]
    with _agent(kube_cluster, a, b) as intruder:
        _refused(_usage_of(intruder, scene.gpus["b"], 7), f"GPU {scene.gpus['b']}: spec.nodeName is {b}",
                 f"the agent of node {a} writes only the GPU objects of its own node", "agent-gpus.elasticgpu.io")
        # Taking node B's card over by writing node A into its spec.
        spec = {**scene.gpu("b")["spec"], "nodeName": a}
        _refused(lambda: intruder.apply_gpu(scene.gpus["b"], labels={names.LABEL_NODE: a}, spec=spec),
                 f"the agent of node {a} writes only the GPU objects of its own node")
        _refused(lambda: intruder.patch_node_labels({"nvidia.com/gpu.count": "8"}),
                 f"Node {b}: the agent of node {a} writes only its own Node", "agent-node.elasticgpu.io")
        claim = scene.claim("b")
        _refused(lambda: intruder.patch_claim_status(
            scene.namespace, scene.claims["b"], resource_version=claim["metadata"]["resourceVersion"],
            status={"usage": {"memoryUsed": 1}}),
            f"ElasticGPUClaim {scene.namespace}/{scene.claims['b']}: status.nodeName is {b}",
            f"the agent of node {a} writes the status only of claims bound to its node")  # fmt: skip
    assert "usage" not in scene.gpu("b").get("status", {})
    assert scene.gpu("b")["spec"]["nodeName"] == b


def test_an_agent_never_changes_allocations_nor_the_controllers_fields(
    kube_cluster: TestCluster, scene: Scene, agent_policies: list[str]
) -> None:
    a, gpu = scene.nodes["a"], scene.gpus["a"]
    with _agent(kube_cluster, a, a) as agent:
        mine = {"elasticGPU": "egpu-mine", "cores": 10, "memory": 1024, "exclusive": False}
        for allocations in ([], [{"elasticGPU": "egpu-a", "cores": 100, "memory": 1024}],
                            [{"elasticGPU": "egpu-a", "cores": 10, "memory": 1024, "exclusive": False}, mine]):

            def write(allocations: list[dict[str, Any]] = allocations) -> object:
                version = agent.read_gpu(gpu)["metadata"]["resourceVersion"]
                return agent.patch_gpu_status(gpu, resource_version=version, status={"allocations": allocations})

            _refused(write, f"GPU {gpu}: status.allocations: only the controller writes the reservations",
                     f"the agent of node {a} never changes them")
        claim = scene.claim("a")
        controllers = "writes only status.usage and the OverLimit condition"
        moved = f"status.nodeName is {a} (written as {scene.nodes['b']}): the agent of node {a} writes the status only"
        for status, says in (({"phase": "Lost"}, controllers), ({"conditions": []}, controllers),
                             ({"gpus": ["GPU-OTHER"]}, controllers), ({"nodeName": scene.nodes["b"]}, moved),
                             # Fields added since (resize, recommendations) are the controller's too.
                             ({"resizable": True}, controllers),
                             # The class's over-limit policy (issue 25): an agent never relaxes its own claims'.
                             ({"policing": {"overLimitAction": "Warn", "overLimitGraceSeconds": 60}}, controllers),
                             ({"allocatedResources": {"elasticgpu.io/gpu-core": 100}}, controllers)):
            _refused(lambda status=status: agent.patch_claim_status(
                scene.namespace, scene.claims["a"], resource_version=claim["metadata"]["resourceVersion"],
                status=status), says)  # fmt: skip
        # Its own Node: nothing but the GPU Feature Discovery labels.
        _refused(lambda: agent.patch_node_labels({"team": "mine"}),
                 f"Node {a}: metadata.labels[team]: the agent changes only the GPU Feature Discovery labels")
    assert scene.gpu("a")["status"]["allocations"] == [{"elasticGPU": "egpu-a", "cores": 10, "memory": 1024}]
    assert scene.claim("a")["status"]["phase"] == "Bound"


def test_an_agent_never_changes_who_owns_its_card(
    kube_cluster: TestCluster, scene: Scene, agent_policies: list[str], api_client: client.ApiClient
) -> None:
    """Issue 48: spec.owner is the platform team's, status.owner and OwnerMove the controller's. The agent's
    apply (which never carries spec.owner) keeps the platform team's value; a write that changes any is refused."""
    a, gpu = scene.nodes["a"], scene.gpus["a"]
    patched = kube_request(api_client, "PATCH", f"{GPUS}/{gpu}", body={"spec": {"owner": "DRA"}},
                           headers={"Content-Type": "application/merge-patch+json"})  # the platform team
    assert patched.status == 200, patched.json()
    _status(api_client, f"{GPUS}/{gpu}", {"allocations": None, "owner": "DRA", "conditions": [
        {"type": "OwnerMove", "status": "True", "reason": "Done", "message": "the card belongs to DRA",
         "lastTransitionTime": "2026-12-03T00:00:00Z"}]})  # the controller
    with _agent(kube_cluster, a, a) as agent:
        spec = {k: v for k, v in agent.read_gpu(gpu)["spec"].items() if k != "owner"}
        agent.apply_gpu(gpu, labels={names.LABEL_NODE: a}, spec={**spec, "model": "renamed"})
        assert scene.gpu("a")["spec"]["owner"] == "DRA", "the agent's apply keeps the platform team's owner"
        _refused(lambda: agent.apply_gpu(gpu, labels={names.LABEL_NODE: a}, spec={**spec, "owner": "ElasticGPU"}),
                 f"GPU {gpu}: spec.owner: the platform team sets who owns the card",
                 f"the agent of node {a} keeps it as it is")
        for status in ({"owner": "ElasticGPU"}, {"owner": None}, {"conditions": []}):

            def write(status: dict[str, Any] = status) -> object:
                version = agent.read_gpu(gpu)["metadata"]["resourceVersion"]
                return agent.patch_gpu_status(gpu, resource_version=version, status=status)

            _refused(write, "status.owner and the OwnerMove condition are the controller's",
                     f"the agent of node {a} never changes them")
    assert scene.gpu("a")["spec"]["model"] == "renamed"
    assert scene.gpu("a")["status"]["owner"] == "DRA"


def test_a_token_bound_to_no_node_writes_nothing(
    kube_cluster: TestCluster, scene: Scene, agent_policies: list[str]
) -> None:
    with _agent(kube_cluster, None, scene.nodes["a"]) as unbound:
        _refused(_usage_of(unbound, scene.gpus["a"], 1), f"GPU {scene.gpus['a']}: {NOT_BOUND}",
                 "deploy/agent-kubeconfig.sh NODE")
        _refused(lambda: unbound.patch_node_labels({"nvidia.com/gpu.count": "1"}), NOT_BOUND)
        # Reading stays allowed (RBAC decides reads; the policies judge writes only).
        assert unbound.read_gpu(scene.gpus["a"])["spec"]["nodeName"] == scene.nodes["a"]


def _event(kube: agent_api.AgentKube, namespace: str, gpu: str) -> Callable[[], object]:
    def write() -> object:
        kube.create_event(namespace=namespace, involved={"apiVersion": f"{names.GROUP}/{names.VERSION}", "kind": "GPU",
                                                         "name": gpu}, type_="Warning", reason="Probe",
                          message="probe", now="2026-12-03T00:00:00Z")  # fmt: skip
        return None

    return write


def test_an_agent_reports_events_from_its_own_node_only(
    kube_cluster: TestCluster, api_client: client.ApiClient, scene: Scene, agent_policies: list[str]
) -> None:
    """Events carry the node that saw them (source.host, reportingInstance): an agent's are its node's."""
    a, b = scene.nodes["a"], scene.nodes["b"]
    with _agent(kube_cluster, a, a) as agent:
        _event(agent, scene.namespace, scene.gpus["a"])()
    # The agent of A writing as B (its node_name is what the Event names as its source).
    with _agent(kube_cluster, a, b) as intruder:
        _refused(_event(intruder, scene.namespace, scene.gpus["b"]), "agent-events.elasticgpu.io",
                 f"source.host is {b}, reportingInstance is {b}: the agent of node {a} reports Events from its own"
                 " node only")  # fmt: skip
    with _agent(kube_cluster, None, a) as unbound:
        _refused(_event(unbound, scene.namespace, scene.gpus["a"]), NOT_BOUND, "deploy/agent-kubeconfig.sh NODE",
                 "agent.nodeHook=nri")  # fmt: skip
    events = client.CoreV1Api(api_client).list_namespaced_event(scene.namespace).items
    assert {(e.source.host, e.reporting_instance) for e in events if e.reason == "Probe"} == {(a, a)}


def test_a_card_squatted_by_another_node_is_reported_on_the_reporters_own_node(
    kube_cluster: TestCluster, api_client: client.ApiClient, scene: Scene, agent_policies: list[str], tmp_path: Path
) -> None:
    """Node A's agent creates the GPU object of a card of node B before B publishes it (issue 23, item 8).

    A name is a uuid: no policy can know which node really has the card, so A's create passes (its
    spec.nodeName is A, as the policy requires). B's agent then sees its card's object held by A: it may not
    take it over, nor write anything on it (issue 44: that one write let a node set every node's cards aside);
    it reports the conflict on its own Node (a Warning Event DuplicateUUID) and publishes its other cards. A's
    agent cannot point its object's owner at another Node."""
    import yaml as _yaml

    from elasticgpu.agent import discovery, health, inventory
    from elasticgpu.agent.discovery import simulated
    from elasticgpu.agent.settings import InventorySettings
    from tests.agent.objects import DESCRIPTION

    a, b = scene.nodes["a"], scene.nodes["b"]
    uuid_b = simulated.simulated_uuid(b, 0)
    squatted = names.gpu_object_name(uuid_b)
    spec = {"index": 0, "uuid": uuid_b, "model": "NVIDIA A100-SXM4-80GB", "memory": 81920, "nodeName": a}
    settings = InventorySettings()
    try:
        with _agent(kube_cluster, a, a) as squatter:
            squatter.apply_gpu(squatted, labels={names.LABEL_NODE: a}, spec=spec)
        simulation = tmp_path / "sim.yaml"
        simulation.write_text(_yaml.safe_dump(DESCRIPTION))
        backend = discovery.open_backend("simulated", node_name=b, simulation_file=simulation,
                                         device_dir=tmp_path / "devices", inject_dir=tmp_path / "inject")
        with _agent(kube_cluster, b, b) as agent_b:
            inv = inventory.Inventory(kube=agent_b, backend=backend, health=health.HealthTracker(recovery_quiet_s=300),
                                      settings=settings)
            inv.reconcile()  # its other card is published all the same
            inv.reconcile()  # said once, not once per pass
            backend.close()
        obj = kube_request(api_client, "GET", f"{GPUS}/{squatted}").json()
        assert obj["spec"]["nodeName"] == a, "B never takes A's object over"
        assert not [c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == "DuplicateUUID"]
        events = [e for e in client.CoreV1Api(api_client).list_namespaced_event(settings.events_namespace).items
                  if e.reason == "DuplicateUUID" and e.involved_object.name == b]
        assert len(events) == 1, events
        assert (events[0].involved_object.kind, events[0].type, events[0].source.host) == ("Node", "Warning", b)
        assert squatted in events[0].message and f"says node {a}" in events[0].message
        other = names.gpu_object_name(simulated.simulated_uuid(b, 1))
        assert kube_request(api_client, "GET", f"{GPUS}/{other}").json()["spec"]["nodeName"] == b
        with _agent(kube_cluster, a, a) as squatter:
            node_b = client.CoreV1Api(api_client).read_node(b).metadata
            _refused(lambda: squatter.apply_gpu(squatted, labels={names.LABEL_NODE: a}, spec=spec, owner={
                "apiVersion": "v1", "kind": "Node", "name": b, "uid": node_b.uid}), "ownerReferences")
        with _agent(kube_cluster, b, b) as agent_b:
            _refused(_usage_of(agent_b, squatted, 5), f"GPU {squatted}: spec.nodeName is {a}")
    finally:
        for name in (squatted, names.gpu_object_name(simulated.simulated_uuid(b, 1))):
            kube_request(api_client, "DELETE", f"{GPUS}/{name}")
        for event in client.CoreV1Api(api_client).list_namespaced_event(settings.events_namespace).items:
            if event.involved_object.name == b:
                with contextlib.suppress(client.ApiException):
                    client.CoreV1Api(api_client).delete_namespaced_event(event.metadata.name, settings.events_namespace)


def test_no_agent_marks_another_nodes_card_duplicate(
    kube_cluster: TestCluster, scene: Scene, agent_policies: list[str]
) -> None:
    """Issue 44: the agent of A wrote DuplicateUUID (message "node A: ...") on B's card, and on every other
    node's, and the controller set them all aside. Now no write of any kind passes on another node's GPU."""
    a, gpu = scene.nodes["a"], scene.gpus["b"]
    with _agent(kube_cluster, a, a) as intruder:
        version = intruder.read_gpu(gpu)["metadata"]["resourceVersion"]
        mark = {"type": "DuplicateUUID", "status": "True", "reason": "SeenOnAnotherNode",
                "message": f"node {a}: its driver reports this card too", "lastTransitionTime": "2026-12-03T00:00:00Z"}
        _refused(lambda: intruder.patch_gpu_status(gpu, resource_version=version, status={"conditions": [mark]}),
                 f"the agent of node {a} writes only the GPU objects of its own node")
    assert not (scene.gpu("b").get("status") or {}).get("conditions")


def test_an_agent_reports_events_only_about_what_it_serves(
    kube_cluster: TestCluster, api_client: client.ApiClient, scene: Scene, agent_policies: list[str]
) -> None:
    """Issue 44: an agent posted Warning Events about any object. Now: pods, claims (in their own namespace),
    GPUs and its own Node only."""
    a, b = scene.nodes["a"], scene.nodes["b"]

    def about(kind: str, name: str, namespace: str = "", api_version: str = "v1") -> Callable[[], object]:
        def write() -> object:
            involved = {"apiVersion": api_version, "kind": kind, "name": name}
            if namespace:
                involved["namespace"] = namespace
            agent.create_event(namespace=scene.namespace, involved=involved, type_="Warning", reason="Forged",
                               message="forged", now="2026-12-03T00:00:00Z")
            return None

        return write

    with _agent(kube_cluster, a, a) as agent:
        about("Pod", "mine", scene.namespace)()
        about("Node", a)()
        _refused(about("Node", b), f"about Node {b}", f"the agent of node {a} reports Events about its own Node")
        _refused(about("Deployment", "web", scene.namespace, "apps/v1"), "about Deployment web",
                 "only about pods, ElasticGPUClaims, GPUs and its own Node")
        _refused(about("Namespace", scene.namespace), "about Namespace")
        _refused(about("Pod", "elsewhere", "kube-system"), "about Pod kube-system/elsewhere",
                 "lives in that object's namespace")
    events = client.CoreV1Api(api_client).list_namespaced_event(scene.namespace).items
    assert sorted(e.involved_object.kind for e in events if e.reason == "Forged") == ["Node", "Pod"]
