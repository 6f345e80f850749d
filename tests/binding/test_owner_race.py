"""One owner per card, under races (issue 48.1): while cards move between our controller and DRA at
random, our claims come and go through two real controller processes (both watch engines), and a
simulated DRA scheduler writes ResourceClaim allocations as kube-scheduler does, honouring only the
cards our driver would publish (`open_to_dra` of the GPU it just read). No card is ever held by both
sides: replayed in resourceVersion order (one etcd orders every write), no moment has a card with a
reservation of ours in its GPU status and a ResourceClaim allocation naming it. At the end every move
completes, and the moves, our reservations and DRA's allocations all happened (the test can fail).

The scheduler acts on what it read: like a real one whose cache lags, it writes an allocation from a
read of up to `SCHEDULER_LAG_S` before, which the controller's unpublish grace (`GRACE_S`, set far
above it here, 10 s by default) must cover.

ResourceClaims are `resource.k8s.io/v1`. A server that does not serve them (the local test server)
gets a stand-in CRD of that name for the module (preserving unknown fields, status subresource), so the
controller lists and watches them by the same path as on a real cluster; on a cluster that serves the
API the real one is used."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticgpu.api import GPU, dra_names, names
from elasticgpu.api.gpu import effective_owner, open_to_dra
from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster
from tests.binding.processes import ControllerProcesses, eventually
from tests.kube_cluster import kube_request, server_side_apply, wait_established

CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
STAND_IN = "resourceclaims.resource.k8s.io"
GRACE_S = 4.0
"""The controller's unpublish grace in this test (ELASTICGPU_OWNER_UNPUBLISH_GRACE_S)."""
SCHEDULER_LAG_S = 1.0
"""The oldest read the simulated scheduler allocates from (a real one's cache lags by milliseconds)."""
CARDS = 6
RUN_S = 30.0
RUN_MAX_S = 90.0


@pytest.fixture(scope="module")
def resource_claims(api_client: Any, crds_installed: list[str]) -> Iterator[None]:
    """ResourceClaims served at CLAIMS_PATH: the server's own, or a stand-in CRD for this module."""
    if kube_request(api_client, "GET", CLAIMS_PATH).status == 200:
        yield
        return
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": STAND_IN, "annotations": {
            "api-approved.kubernetes.io": "unapproved, a test stand-in for a server without the DRA API"}},
        "spec": {"group": "resource.k8s.io", "scope": "Namespaced",
                 "names": {"plural": "resourceclaims", "singular": "resourceclaim", "kind": "ResourceClaim",
                           "listKind": "ResourceClaimList"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]},
    }
    server_side_apply(api_client, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{STAND_IN}", crd)
    wait_established(api_client, [STAND_IN])
    deadline = time.monotonic() + 30
    while kube_request(api_client, "GET", CLAIMS_PATH).status != 200:
        assert time.monotonic() < deadline, f"{CLAIMS_PATH} not served by the stand-in CRD"
        time.sleep(0.1)
    try:
        yield
    finally:
        kube_request(api_client, "DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{STAND_IN}")


class Recorder:
    """Every GPU and ResourceClaim event of the test's cards, by resourceVersion, from two watches."""

    def __init__(self, kube: KubeApi, pools: set[str]) -> None:
        self.kube = kube
        self.pools = pools
        self.events: list[tuple[int, str, str, Any]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._watch, args=(path, kind), daemon=True)
                        for kind, path in (("gpu", kube.collection_path("gpu")), ("claim", CLAIMS_PATH))]
        self.ready = [threading.Event(), threading.Event()]

    def start(self) -> None:
        for i, thread in enumerate(self.threads):
            thread.start()
            assert self.ready[i].wait(30), "the recorder's watches did not start"

    def _watch(self, path: str, kind: str) -> None:
        ready = self.ready[0 if kind == "gpu" else 1]
        items, version = self.kube.list_collection(path)
        for body in items:
            self._take(kind, "ADDED", body)
        ready.set()
        while not self.stop.is_set():
            try:
                for event in self.kube.watch(path, resource_version=version, timeout_s=5):
                    body = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        raise AssertionError(f"the recorder's watch of {kind} lost events: {body}")
                    version = str((body.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") != "BOOKMARK":
                        self._take(kind, str(event.get("type")), body)
            except errors.ApiUnavailable:
                continue  # reopened from the last version seen: nothing missed

    def _take(self, kind: str, event_type: str, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        rv = int(meta.get("resourceVersion") or 0)
        if kind == "gpu":
            spec = body.get("spec") or {}
            if spec.get("nodeName") not in self.pools:
                return
            card = (spec["nodeName"], int(spec["index"]))
            status = body.get("status") or {}
            ours = event_type != "DELETED" and bool(status.get("allocations"))
            value: Any = (card, ours, status.get("owner"))
        else:
            held = set() if event_type == "DELETED" else set(dra_names.allocated_cards(body))
            value = {c for c in held if c[0] in self.pools}
        with self.lock:
            self.events.append((rv, kind, f"{meta.get('namespace', '')}/{meta.get('name', '')}", value))

    def both_held(self) -> list[str]:
        """Every moment (resourceVersion) at which a card was held by both sides."""
        with self.lock:
            events = sorted(self.events, key=lambda e: e[0])
        ours: dict[tuple[str, int], bool] = {}
        dra: dict[str, set[tuple[str, int]]] = {}
        found = []
        for rv, kind, key, value in events:
            if kind == "gpu":
                card, held, _owner = value
                ours[card] = held
            else:
                dra[key] = value
            for claim, cards in dra.items():
                for card in cards:
                    if ours.get(card):
                        found.append(f"rv {rv}: card {card} reserved by us and allocated to ResourceClaim {claim}")
        return found

    def counts(self) -> dict[str, int]:
        """How often each side took a card and how often a card changed owner."""
        with self.lock:
            events = sorted(self.events, key=lambda e: e[0])
        owner: dict[tuple[str, int], Any] = {}
        ours: dict[tuple[str, int], bool] = {}
        counts = {"to DRA": 0, "to ElasticGPU": 0, "ours taken": 0, "DRA taken": 0}
        for _rv, kind, _key, value in events:
            if kind == "gpu":
                card, held, now = value
                before = owner.get(card)
                if card in owner and (before or "ElasticGPU") != (now or "ElasticGPU"):
                    counts["to DRA" if now == "DRA" else "to ElasticGPU"] += 1
                if held and not ours.get(card):
                    counts["ours taken"] += 1
                owner[card], ours[card] = now, held
            elif value:
                counts["DRA taken"] += 1
        return counts


class DraScheduler:
    """Allocates whole cards to ResourceClaims as kube-scheduler would: only a card the driver publishes
    (`open_to_dra` of a fresh read), never a card one of its claims holds, from a read at most
    SCHEDULER_LAG_S old; deallocates (deletes, or clears the allocation) after a while."""

    def __init__(self, kube: KubeApi, api_client: Any, namespace: str, cards: list[str], seed: int) -> None:
        self.kube, self.api, self.namespace, self.cards = kube, api_client, namespace, cards
        self.random = random.Random(seed)
        self.held: dict[str, tuple[str, float]] = {}
        """claim name -> (GPU name, when to deallocate)."""

    def step(self) -> None:
        now = time.monotonic()
        for claim, (_gpu, until) in list(self.held.items()):
            if now >= until:
                self._deallocate(claim)
        gpu_name = self.random.choice(self.cards)
        if any(g == gpu_name for g, _ in self.held.values()):
            return
        name = f"rc-{uuid.uuid4().hex[:8]}"
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": dra_names.DRIVER_NAME, "allocationMode": "ExactCount", "count": 1}}]}}}
        response = kube_request(self.api, "POST", f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}"
                                                  "/resourceclaims", body=body)
        assert response.status == 201, response.body[:500]
        read_at = time.monotonic()
        gpu = GPU.model_validate(self.kube.get_gpu(gpu_name))
        if not open_to_dra(gpu) or time.monotonic() - read_at > SCHEDULER_LAG_S:
            self._delete(name)
            return
        allocation = {"devices": {"results": [{
            "request": "gpu", "driver": dra_names.DRIVER_NAME, "pool": dra_names.pool_name(gpu.spec.node_name),
            "device": dra_names.device_name(gpu.spec.index)}]}}
        response = kube_request(self.api, "PATCH", f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}"
                                                   f"/resourceclaims/{name}/status",
                                body={"status": {"allocation": allocation}},
                                headers={"Content-Type": "application/merge-patch+json"})
        assert response.status == 200, response.body[:500]
        self.held[name] = (gpu_name, time.monotonic() + self.random.uniform(0.5, 3 * GRACE_S))

    def _deallocate(self, name: str) -> None:
        del self.held[name]
        if self.random.random() < 0.5:
            self._delete(name)
            return
        kube_request(self.api, "PATCH", f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims"
                                        f"/{name}/status", body={"status": {"allocation": None}},
                     headers={"Content-Type": "application/merge-patch+json"})

    def _delete(self, name: str) -> None:
        kube_request(self.api, "DELETE", f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims/{name}")

    def release_all(self) -> None:
        for name in list(self.held):
            del self.held[name]
            self._delete(name)


def _set_owner(kube: KubeApi, api_client: Any, gpu_name: str, owner: str) -> None:
    """The platform team's move: a merge patch of spec.owner."""
    response = kube_request(api_client, "PATCH", f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_GPU}/{gpu_name}",
                            body={"spec": {"owner": owner}}, headers={"Content-Type": "application/merge-patch+json"})
    assert response.status == 200, response.body[:500]


def test_no_card_is_held_by_both_sides_while_moves_race_claims(
        cluster: Cluster, kube: KubeApi, kube_cluster: Any, api_client: Any, resource_claims: None,
        tmp_path: Path) -> None:
    seed = int(time.time())
    rng = random.Random(seed)
    model = f"O{cluster.prefix}"
    pools = {f"{cluster.prefix}-n0", f"{cluster.prefix}-n1"}
    gpu_names = [f"gpu-{cluster.prefix}-{i}" for i in range(CARDS)]
    for i, gpu_name in enumerate(gpu_names):
        cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-n{i % 2}", index=i // 2, model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    recorder = Recorder(kube, pools)
    recorder.start()
    scheduler = DraScheduler(kube, api_client, cluster.namespace, gpu_names, seed)
    procs = ControllerProcesses(kube_cluster.kubeconfig, None, tmp_path,
                                env={"ELASTICGPU_OWNER_UNPUBLISH_GRACE_S": str(GRACE_S)})
    ours: dict[str, float] = {}
    try:
        procs.start()
        procs.start(env={"ELASTICGPU_WATCH": "kopf"})
        started = time.monotonic()
        next_move = started
        while True:
            now = time.monotonic()
            counts = recorder.counts()
            enough = counts["to DRA"] >= 2 and counts["to ElasticGPU"] >= 2 and counts["DRA taken"] >= 3 \
                and counts["ours taken"] >= 3
            if now - started > RUN_MAX_S or (now - started > RUN_S and enough):
                break
            if now >= next_move:  # the platform team moves a card, either way
                _set_owner(kube, api_client, rng.choice(gpu_names), rng.choice(names.OWNERS))
                next_move = now + rng.uniform(0.5, 2.0)
            for name, until in list(ours.items()):  # our tenant lets claims go after a while
                if now >= until:
                    del ours[name]
                    with contextlib.suppress(errors.NotFound):
                        kube.delete_claim(cluster.namespace, name)
            if len(ours) < 8:
                name = f"c-{uuid.uuid4().hex[:8]}"
                cluster.claim(o.claim(name, cores=50, memory="1Gi", class_name=class_name))
                ours[name] = now + rng.uniform(1.0, 4.0)
            scheduler.step()
            time.sleep(0.1)
        assert all(p.poll() is None for p in procs.procs), procs.logs()
        counts = recorder.counts()
        assert counts["to DRA"] >= 1 and counts["to ElasticGPU"] >= 1, f"moves both ways (seed {seed}): {counts}"
        assert counts["DRA taken"] >= 1 and counts["ours taken"] >= 1, f"both sides took cards (seed {seed}): {counts}"

        # Everything lets go; every card is then asked to one owner or the other, and every move completes.
        scheduler.release_all()
        for name in list(ours):
            with contextlib.suppress(errors.NotFound):
                kube.delete_claim(cluster.namespace, name)
        final = {gpu_name: names.OWNERS[i % 2] for i, gpu_name in enumerate(gpu_names)}
        for gpu_name, owner in final.items():
            _set_owner(kube, api_client, gpu_name, owner)

        def moved() -> None:
            for gpu_name, owner in final.items():
                gpu = GPU.model_validate(kube.get_gpu(gpu_name))
                move = next((c for c in gpu.status.conditions if c.type == names.CONDITION_OWNER_MOVE), None)
                assert effective_owner(gpu) == owner, f"{gpu_name}: {effective_owner(gpu)}, asked {owner}: {move}"
                assert move is None or move.reason == names.REASON_OWNER_DONE, f"{gpu_name}: {move}"

        eventually(moved, deadline_s=120, explain=procs.logs)
    finally:
        recorder.stop.set()
        procs.close()
        with contextlib.suppress(Exception):
            scheduler.release_all()
    both = recorder.both_held()
    assert not both, f"seed {seed}, {counts}:\n" + "\n".join(both[:20])


def _status_patch(api_client: Any, gpu_name: str, status: dict[str, Any]) -> None:
    """A merge patch of the GPU's status, as its agent (preparedClaims) or the controller (owner) writes it."""
    path = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL_GPU}/{gpu_name}/status"
    response = kube_request(api_client, "PATCH", path, body={"status": status},
                            headers={"Content-Type": "application/merge-patch+json"})
    assert response.status == 200, response.body[:500]


def test_a_card_moving_back_waits_for_the_dra_claims_its_agent_holds(
        cluster: Cluster, kube: KubeApi, kube_cluster: Any, api_client: Any, resource_claims: None,
        tmp_path: Path) -> None:
    """Issue 48: a force-deleted DRA pod's claim can be deallocated while kubelet still stops its container. No
    ResourceClaim names the card and the grace is over, but its agent still lists the claim in
    `status.preparedClaims`: the move waits, saying so, and completes once the agent lets the claim go."""
    gpu_name = f"gpu-{cluster.prefix}-held"
    cluster.gpu(o.gpu(gpu_name, node=f"{cluster.prefix}-n0"))
    _set_owner(kube, api_client, gpu_name, names.OWNER_DRA)
    _status_patch(api_client, gpu_name, {"owner": names.OWNER_DRA, "preparedClaims": [
        {"namespace": "ml", "name": "job-0-gpu", "uid": "uid-job-0"}]})
    grace_s = 1.0
    procs = ControllerProcesses(kube_cluster.kubeconfig, None, tmp_path,
                                env={"ELASTICGPU_OWNER_UNPUBLISH_GRACE_S": str(grace_s)})
    try:
        procs.start()
        _set_owner(kube, api_client, gpu_name, names.OWNER_ELASTIC_GPU)

        def move() -> tuple[str, Any]:
            gpu = GPU.model_validate(kube.get_gpu(gpu_name))
            return effective_owner(gpu), next(
                (c for c in gpu.status.conditions if c.type == names.CONDITION_OWNER_MOVE), None)

        def waiting() -> None:
            owner, condition = move()
            assert owner == names.OWNER_DRA and condition is not None and condition.reason == \
                names.REASON_OWNER_WAITING and "ml/job-0-gpu" in condition.message, (owner, condition)

        eventually(waiting, deadline_s=30, explain=procs.logs)
        deadline = time.monotonic() + grace_s + 4.0  # the grace is long over: still DRA's
        while time.monotonic() < deadline:
            waiting()
            time.sleep(0.2)
        _, condition = move()
        assert condition is not None
        assert condition.message == ("moving from DRA to ElasticGPU: waiting for 1 ResourceClaim(s) its node's agent"
                                     " holds prepared or running on it to be let go: ml/job-0-gpu"), condition.message

        _status_patch(api_client, gpu_name, {"preparedClaims": []})  # kubelet unprepared it, its container is gone

        def moved() -> None:
            owner, condition = move()
            assert owner == names.OWNER_ELASTIC_GPU and condition is not None \
                and condition.reason == names.REASON_OWNER_DONE, (owner, condition)

        eventually(moved, deadline_s=30, explain=procs.logs)
        assert all(p.poll() is None for p in procs.procs), procs.logs()
    finally:
        procs.close()
