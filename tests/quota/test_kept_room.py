"""Room kept for a starved claim, against the API server (issue 33 item 6): room is kept only for a
claim that could bind if the room were free. A claim its namespace's quota can never admit keeps
no node from other tenants; one its quota could admit once its namespace's own claims go keeps
none while they hold it, and gets its room once they are gone. Each waiting claim says why."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import BindingSettings, ControllerSettings, QuotaSettings, ResyncSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster, settle
from tests.binding.namespaces import fresh_namespaces
from tests.quota import quotas
from tests.quota.quota_controller import work_until

CORE = names.RESOURCE_CORE
RESERVE_AFTER_S = 1.0
"""The bounded wait before room is kept (300 s in production; seconds here)."""


@pytest.fixture
def tenants(api_client: client.ApiClient, kube: KubeApi, namespace: str) -> Iterator[tuple[str, str, str]]:
    """Three tenants' namespaces: a (fills the card), b (the big claim, under a quota), c (a small claim)."""
    made = [f"{namespace}-{suffix}" for suffix in "abc"]
    with fresh_namespaces(api_client, kube, made):
        yield made[0], made[1], made[2]


def _card(cluster: Cluster, count: int = 1) -> str:
    """`count` 80 GiB cards on one node, and a class that uses only them."""
    model = f"K{cluster.prefix}"
    for i in range(count):
        cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-{i}", node=f"{cluster.prefix}-n0", model=model, index=i))
    class_name = f"{cluster.prefix}-room"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    return class_name


def _controller(kube: KubeApi) -> Controller:
    # Cluster-wide (the tenants are three namespaces); quotas rechecked every second.
    settings = ControllerSettings(resync=ResyncSettings(orphan_grace_s=60.0),
                                  quota=QuotaSettings(recheck_s=1.0, refresh_s=0.0),
                                  binding=BindingSettings(group_reserve_after_s=RESERVE_AFTER_S))
    return Controller(kube, settings, namespace=None)


def _claim(kube: KubeApi, namespace: str, name: str, cores: int, class_name: str) -> None:
    body = o.claim(name, namespace, cores=cores, memory="10Gi", class_name=class_name)
    body["metadata"].pop("uid")
    kube.create_claim(body)


def _status(kube: KubeApi, namespace: str, name: str) -> dict[str, str]:
    status: dict[str, str] = kube.get_claim(namespace, name).get("status") or {}
    return status


def _past_the_bound(controller: Controller, kube: KubeApi, namespace: str, name: str) -> None:
    """Work the controller past the claim's bounded wait, until it has either kept room for the
    claim or said on it why it keeps none."""
    time.sleep(RESERVE_AFTER_S + 1.5)  # past the bound (and the condition's one-second timestamps)
    work_until(controller, lambda: bool(controller.claims.groups.kept_nodes())
               or "no room is kept" in _status(kube, namespace, name).get("message", ""))


@pytest.mark.timeout(180)
def test_a_claim_its_quota_can_never_admit_keeps_no_room_from_other_tenants(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient, tenants: tuple[str, str, str]) -> None:
    """The issue's reproduction: tenant b has a 10-core quota and one 100-core claim; 60 cores of
    the card are held by tenant a; tenant c's 30-core claim binds beside the 40 free cores."""
    ns_a, ns_b, ns_c = tenants
    class_name = _card(cluster)
    quotas.create(api_client, ns_b, quotas.quota("tenant", {CORE: 10}))
    controller = _controller(kube)
    try:
        _claim(kube, ns_a, "a1", 60, class_name)
        settle(controller)
        _claim(kube, ns_b, "big", 100, class_name)
        settle(controller)
        assert _status(kube, ns_b, "big").get("reason") == "NoCapacity"
        _past_the_bound(controller, kube, ns_b, "big")

        _claim(kube, ns_c, "small", 30, class_name)
        settle(controller)
        small = _status(kube, ns_c, "small")
        assert small.get("phase") == "Bound", f"tenant c's claim waits beside 40 free cores: {small}"
        assert not controller.claims.groups.kept_nodes()
        big = _status(kube, ns_b, "big")
        assert big.get("phase") == "Pending" and big.get("reason") == "NoCapacity", big
        # It says why no room is kept, naming the quota, its limit and what the claim asks.
        message = big.get("message", "")
        assert "no room is kept" in message and "ElasticGPUQuota tenant" in message, message
        assert "limit 10" in message and "100" in message and "never" in message, message
    finally:
        controller.close()


@pytest.mark.timeout(180)
def test_a_group_its_quota_can_never_admit_keeps_no_room_either(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient, tenants: tuple[str, str, str]) -> None:
    """The same for a claim group: two whole cards under a 100-core quota never bind, so the node
    is not kept from tenant c; every member says why."""
    ns_a, ns_b, ns_c = tenants
    class_name = _card(cluster, 2)
    quotas.create(api_client, ns_b, quotas.quota("tenant", {CORE: 100}))
    controller = _controller(kube)
    try:
        _claim(kube, ns_a, "a1", 60, class_name)
        settle(controller)
        for i in range(2):
            body = o.claim(f"w{i}", ns_b, cards=1, class_name=class_name)
            body["metadata"].pop("uid")
            body["metadata"]["labels"] = {names.LABEL_GROUP: "train"}
            body["metadata"]["annotations"] = {names.ANNOTATION_GROUP_MIN_MEMBERS: "2"}
            kube.create_claim(body)
        settle(controller)
        assert _status(kube, ns_b, "w0").get("reason") == "GroupDoesNotFit"
        _past_the_bound(controller, kube, ns_b, "w0")

        _claim(kube, ns_c, "small", 30, class_name)
        settle(controller)
        assert _status(kube, ns_c, "small").get("phase") == "Bound", _status(kube, ns_c, "small")
        assert not controller.claims.groups.kept_nodes()
        for name in ("w0", "w1"):
            message = _status(kube, ns_b, name).get("message", "")
            assert "no room is kept" in message and "never admit the group" in message, message
            assert "asks for 200" in message, message
    finally:
        controller.close()


@pytest.mark.timeout(180)
def test_a_claim_its_quota_admits_once_its_namespace_frees_room_keeps_room_only_then(
        cluster: Cluster, kube: KubeApi, api_client: client.ApiClient, tenants: tuple[str, str, str]) -> None:
    """Tenant b's quota (100 cores) could admit its 100-core claim, but b's own 60-core claim
    holds 60 of it: no room is kept while it does (c's claim binds). Once b's own claim is
    deleted the quota admits it: room is kept, c's next claim waits, and b's claim binds when
    the card frees."""
    ns_a, ns_b, ns_c = tenants
    del ns_a
    class_name = _card(cluster)
    quotas.create(api_client, ns_b, quotas.quota("tenant", {CORE: 100}))
    controller = _controller(kube)
    try:
        _claim(kube, ns_b, "b1", 60, class_name)
        settle(controller)
        _claim(kube, ns_b, "big", 100, class_name)
        settle(controller)
        _past_the_bound(controller, kube, ns_b, "big")
        message = _status(kube, ns_b, "big").get("message", "")
        assert "no room is kept" in message and "used 60" in message and "once" in message, message

        _claim(kube, ns_c, "c1", 30, class_name)
        settle(controller)
        assert _status(kube, ns_c, "c1").get("phase") == "Bound"
        assert not controller.claims.groups.kept_nodes()

        kube.delete_claim(ns_b, "b1")  # b's quota now admits its big claim: its room is kept
        work_until(controller, lambda: bool(controller.claims.groups.kept_nodes()))
        _claim(kube, ns_c, "c2", 30, class_name)
        settle(controller)
        c2 = _status(kube, ns_c, "c2")
        assert c2.get("phase") == "Pending" and f"kept for claim {ns_b}/big" in c2.get("message", ""), c2

        kube.delete_claim(ns_c, "c1")
        work_until(controller, lambda: _status(kube, ns_b, "big").get("phase") == "Bound")
    finally:
        controller.close()
