"""The CRI hook's view of claims, read from the real API server by name (never a list), cached briefly;
ready while the API server answers; an ElasticGPU that does not point back makes its claim Lost."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from elasticgpu.agent import errors, kube
from elasticgpu.agent.discovery import Card
from elasticgpu.agent.injecting import claim_view
from elasticgpu.agent.injecting.injection import ClaimUser
from elasticgpu.api import names
from tests.binding import objects as o
from tests.kube_cluster import TestCluster, kube_request

NODE = "view-node"
CARD = Card(index=0, uuid="GPU-AAAA0000-0000-0000-0000-000000000001", model="T", memory_mib=81920, minor=0,
            device_path="/dev/nvidia0")
GROUP = f"/apis/{names.GROUP}/{names.VERSION}"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def agent_kube(kube_cluster: TestCluster, crds_installed: list[str]) -> Iterator[kube.AgentKube]:
    api = kube.load_api_client(str(kube_cluster.kubeconfig), None)
    agent = kube.AgentKube(api, node_name=NODE, field_manager="test-agent", timeout_s=5)
    yield agent
    agent.close()


@pytest.fixture
def egpus(api_client: client.ApiClient) -> Iterator[list[str]]:
    """ElasticGPUs a test made (cluster scoped), deleted after it."""
    made: list[str] = []
    yield made
    for name in made:
        kube_request(api_client, "DELETE", f"{GROUP}/{names.PLURAL_ELASTIC_GPU}/{name}")


def create(api: client.ApiClient, path: str, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    made = kube_request(api, "POST", path, body=body)
    assert made.status == 201, made.body
    name = made.json()["metadata"]["name"]
    patched = kube_request(api, "PATCH", f"{path}/{name}/status", body={"status": status},
                           headers={"Content-Type": "application/merge-patch+json"})
    assert patched.status == 200, patched.body
    return dict(patched.json())


def bound_pair(api: client.ApiClient, namespace: str, egpus: list[str], *, claim_ref: dict[str, Any] | None = None,
               capacity: dict[str, Any] | None = None) -> tuple[str, str]:
    """A Bound claim and its ElasticGPU (a slice of CARD on NODE), as the controller leaves them."""
    suffix = uuid.uuid4().hex[:8]
    claim_name, egpu_name = f"c-{suffix}", f"egpu-{suffix}"
    capacity = capacity or {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"}
    claim = create(api, f"{GROUP}/namespaces/{namespace}/{names.PLURAL_CLAIM}",
                   o.claim(claim_name, namespace, egpu=egpu_name),
                   {"phase": "Bound", "nodeName": NODE, "gpus": ["GPU-STALE"], "capacity": capacity,
                    "users": [{"name": "trainer", "uid": "pod-uid-1"}]})
    ref = claim_ref or {"namespace": namespace, "name": claim_name, "uid": claim["metadata"]["uid"]}
    egpus.append(egpu_name)
    create(api, f"{GROUP}/{names.PLURAL_ELASTIC_GPU}",
           o.share_egpu(egpu_name, names.gpu_object_name(CARD.uuid), cores=30, memory="10Gi", claim_ref=ref),
           {"phase": "Bound", "nodeName": NODE, "gpus": [CARD.uuid], "capacity": capacity})
    return claim_name, egpu_name


def view_of(agent_kube: kube.AgentKube, clock: Clock, **kwargs: Any) -> claim_view.ClaimView:
    return claim_view.ClaimView(kube=agent_kube, node_name=NODE, cards=lambda: [CARD], ttl_s=5, ready_window_s=60,
                                clock=clock, **kwargs)


def test_a_bound_claim_is_read_by_name_with_its_elastic_gpu_and_cached(
    api_client: client.ApiClient, namespace: str, egpus: list[str], agent_kube: kube.AgentKube
) -> None:
    claim_name, egpu_name = bound_pair(api_client, namespace, egpus)
    clock = Clock()
    view = view_of(agent_kube, clock)
    info = view.claim(namespace, claim_name)
    assert info is not None
    # The cards come from the ElasticGPU (the truth), not the claim's stale mirror.
    assert (info.phase, info.node_name, info.elastic_gpu, info.gpus) == ("Bound", NODE, egpu_name, (CARD.uuid,))
    assert (info.cores, info.memory_mib, info.users) == (30, 10240, (ClaimUser("trainer", "pod-uid-1"),))
    assert view.reads == 2  # the claim and its ElasticGPU, nothing listed

    clock.now += 4  # the other containers of the pod, a moment later: no read
    assert view.claim(namespace, claim_name) == info and view.reads == 2
    clock.now += 2  # past the TTL: read again
    assert view.claim(namespace, claim_name) == info and view.reads == 4

    assert view.claim(namespace, "nobody") is None  # no such claim: refused by injection with the fix
    assert view.card(CARD.uuid.lower()) == claim_view.injection.CardInfo(uuid=CARD.uuid, index=0, memory_mib=81920)
    assert view.card("GPU-OTHER") is None


def test_an_elastic_gpu_that_does_not_point_back_makes_the_claim_lost(
    api_client: client.ApiClient, namespace: str, egpus: list[str], agent_kube: kube.AgentKube
) -> None:
    claim_name, _ = bound_pair(api_client, namespace, egpus, claim_ref={"namespace": namespace, "name": "another"})
    view = view_of(agent_kube, Clock())
    info = view.claim(namespace, claim_name)
    assert info is not None and info.phase == "Lost"

    gone, egpu_name = bound_pair(api_client, namespace, egpus)
    kube_request(api_client, "DELETE", f"{GROUP}/{names.PLURAL_ELASTIC_GPU}/{egpu_name}")
    info = view.claim(namespace, gone)
    assert info is not None and info.phase == "Lost"


@pytest.mark.parametrize(
    ("capacity", "cards", "physical", "expected"),
    [
        ({names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"}, 1, False, (30, 10240)),
        ({names.RESOURCE_MEMORY: "4Gi"}, 1, False, (0, 4096)),  # memory only: no compute reserved
        ({names.RESOURCE_CORE: 200, names.RESOURCE_NVIDIA_GPU: 2, names.RESOURCE_MEMORY: "160Gi"}, 2, False, (100, 0)),
        ({names.RESOURCE_CORE: 100}, 1, True, (100, 0)),  # an admin's physicalGPU ElasticGPU
        ({names.RESOURCE_CORE: 100, names.RESOURCE_MEMORY: "80Gi"}, 1, False, (100, 0)),
    ],
)
def test_limits_per_card(capacity: dict[str, Any], cards: int, physical: bool, expected: tuple[int, int]) -> None:
    assert claim_view.limits(capacity, cards=cards, physical=physical) == expected


def test_ready_while_the_api_server_answers(agent_kube: kube.AgentKube) -> None:
    spec_problem: list[str | None] = ["the CDI spec of this node's cards is not written yet"]
    view = claim_view.ClaimView(kube=agent_kube, node_name=NODE, cards=lambda: [CARD], ready_window_s=60,
                                probe_interval_s=0, not_ready=lambda: spec_problem[0])
    assert agent_kube.answered_at is None
    # Never asked yet: one probe (GET /version), answered; then only the spec is missing.
    assert view.not_ready_reason() == "the CDI spec of this node's cards is not written yet"
    assert agent_kube.answered_at is not None
    spec_problem[0] = None
    assert view.not_ready_reason() is None
    # Silent for two minutes (the agent's loops in backoff), but the server is back: the probe says so.
    agent_kube.answered_at = time.monotonic() - 120
    assert view.not_ready_reason() is None


def test_an_unreachable_api_server_raises_and_says_why(agent_kube: kube.AgentKube) -> None:
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    agent_kube._api.configuration.host = f"https://127.0.0.1:{port}"  # nothing listens there
    view = claim_view.ClaimView(kube=agent_kube, node_name=NODE, cards=lambda: [CARD], ready_window_s=60,
                                probe_interval_s=60)
    reason = view.not_ready_reason()
    assert reason is not None and reason.startswith(
        "it has not reached the API server since it started (probe the API server: ")
    with pytest.raises(errors.KubeUnavailable, match="read claim ns/c: the API server did not answer"):
        view.claim("ns", "c")
    agent_kube.answered_at = time.monotonic() - 120  # it answered two minutes ago, then went away
    reason = view.not_ready_reason()  # no probe: the last was less than probe_interval_s ago
    assert reason is not None and reason.startswith("the API server has not answered it for 120 s (read claim ns/c")


def test_a_mig_claims_partition_is_read_from_its_status() -> None:
    claim = {"metadata": {"namespace": "ns", "name": "c", "uid": "u"}, "spec": {"elasticGPUName": "egpu-u"},
             "status": {"phase": "Bound", "gpus": ["GPU-1"], "capacity": {"elasticgpu.io/gpu-core": 42},
                        "partition": {"profile": "3g.40gb", "cores": 42, "memory": 40960, "start": 4}}}
    egpu = {"spec": {"claimRef": {"namespace": "ns", "name": "c", "uid": "u"}}, "status": {"gpus": ["GPU-1"]}}
    assert claim_view.claim_info(claim, egpu).partition == ("3g.40gb", 4)
    claim["status"].pop("partition")
    assert claim_view.claim_info(claim, egpu).partition is None


def test_the_isolation_mode_is_the_claim_s_status_and_none_when_absent() -> None:
    claim: dict[str, Any] = {"metadata": {"namespace": "ns", "name": "c"}, "spec": {},
                             "status": {"phase": "Pending", "isolation": "MPS"}}
    assert claim_view.claim_info(claim, None).isolation == "MPS"
    del claim["status"]["isolation"]  # bound before the field existed: advisory, as it was then
    assert claim_view.claim_info(claim, None).isolation == "None"


def test_privileged_use_is_allowed_only_by_the_bound_claim_s_status_never_by_what_its_owner_writes() -> None:
    """Issue 33.4: status.allowPrivileged is the controller's copy of the class; a tenant's spec field, label or
    annotation of the same name counts for nothing, and neither does the status of a claim that is not Bound."""
    claim: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u", "labels": {"allowPrivileged": "true"},
                     "annotations": {"elasticgpu.io/allowPrivileged": "true"}},
        "spec": {"elasticGPUName": "egpu-u", "allowPrivileged": True},
        "status": {"phase": "Bound", "gpus": ["GPU-1"], "capacity": {"elasticgpu.io/gpu-core": 30}},
    }
    egpu = {"spec": {"claimRef": {"namespace": "ns", "name": "c", "uid": "u"}}, "status": {"gpus": ["GPU-1"]}}
    assert claim_view.claim_info(claim, egpu).allow_privileged is False
    claim["status"]["allowPrivileged"] = True
    assert claim_view.claim_info(claim, egpu).allow_privileged is True
    assert claim_view.claim_info(claim, None).allow_privileged is False  # its ElasticGPU gone: Lost
    claim["status"]["allowPrivileged"] = "true"  # not what the controller writes (a boolean)
    assert claim_view.claim_info(claim, egpu).allow_privileged is False
