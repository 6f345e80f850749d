"""Who held each card of one node, recorded from the real objects while a test moves cards between
our controller and DRA (tests/realcluster/test_dra_moves.py), and the checks over that record.

Two sources, each read as the cluster and the runtime saw it, never from the product's own state:

- the API: a watch of the node's GPU objects (`status.allocations`: our reservations; `spec.owner`,
  `status.owner`) and a watch of every ResourceClaim (`status.allocation` naming driver
  gpu.elasticgpu.io, pool = the node). Every event carries the object's resourceVersion, which on
  one etcd is its global modification revision: merged by it, the two watches give one order of
  every change, so "our reservation and a claim's allocation on one card at once" is decidable.
- the runtime: the running containers of the node as containerd holds them (CRI ContainerStatus,
  verbose: the OCI spec's NVIDIA_VISIBLE_DEVICES after CDI, and the CDI devices kubelet asked),
  sampled about every second: a sample with one card in a container of each side is a violation.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch

from elasticgpu.api import dra_names, names

DRA, OURS = "DRA", "ElasticGPU"
CDI_CARD = "elasticgpu.io/gpu="


@dataclass(frozen=True, order=True)
class Change:
    """One watch event, as the check needs it."""

    revision: int
    kind: str  # "gpu" or "claim"
    key: str  # GPU name, or namespace/name of the claim
    deleted: bool = field(compare=False)
    index: int | None = field(compare=False)  # the GPU's card index
    reservations: tuple[str, ...] = field(compare=False, default=())  # the GPU's status.allocations
    desired: str = field(compare=False, default=OURS)
    effective: str = field(compare=False, default=OURS)
    cards: frozenset[int] = field(compare=False, default=frozenset())  # the claim's cards in the node's pool


def _owner(section: Any) -> str:
    return DRA if isinstance(section, dict) and section.get("owner") == DRA else OURS


def gpu_change(body: dict[str, Any], deleted: bool) -> Change:
    status = body.get("status") or {}
    held = tuple(sorted(str(a.get("elasticGPU") or a.get("elasticGpu") or a) for a in status.get("allocations") or []))
    return Change(int(body["metadata"]["resourceVersion"]), "gpu", body["metadata"]["name"], deleted,
                  index=body["spec"].get("index"), reservations=() if deleted else held,
                  desired=_owner(body.get("spec")), effective=_owner(status))  # fmt: skip


def claim_change(body: dict[str, Any], node: str, deleted: bool) -> Change:
    cards = frozenset(i for pool, i in dra_names.allocated_cards(body) if pool == node)
    meta = body["metadata"]
    return Change(int(meta["resourceVersion"]), "claim", f"{meta['namespace']}/{meta['name']}", deleted,
                  index=None, cards=frozenset() if deleted else cards)  # fmt: skip


def violations(changes: list[Change]) -> list[str]:
    """What the merged record shows against one owner per card (empty: none). In revision order:
    a reservation of ours appears only on a card both of whose owners are ElasticGPU; a claim's
    allocation appears only on a card whose effective owner is DRA; and no card is ever held by a
    reservation of ours and a ResourceClaim's allocation at once."""
    found: list[str] = []
    ours: dict[int, tuple[str, ...]] = {}
    owners: dict[int, tuple[str, str]] = {}
    claims: dict[str, frozenset[int]] = {}
    for change in sorted(changes):
        if change.kind == "gpu" and change.index is not None:
            new = set(change.reservations) - set(ours.get(change.index, ()))
            if new and (change.desired, change.effective) != (OURS, OURS):
                found.append(f"rv {change.revision}: reservation(s) {sorted(new)} placed on card {change.index} "
                             f"whose owner is spec {change.desired} / status {change.effective}")  # fmt: skip
            ours[change.index] = change.reservations
            owners[change.index] = (change.desired, change.effective)
        elif change.kind == "claim":
            for card in change.cards - claims.get(change.key, frozenset()):
                effective = owners.get(card, (OURS, OURS))[1]
                if effective != DRA:
                    found.append(f"rv {change.revision}: ResourceClaim {change.key} allocated card {card} "
                                 f"whose effective owner is {effective}")  # fmt: skip
            claims[change.key] = change.cards
        for card, reservations in ours.items():
            holders = sorted(k for k, cards in claims.items() if card in cards)
            if reservations and holders:
                found.append(f"rv {change.revision}: card {card} held by ours {list(reservations)} and by "
                             f"ResourceClaim(s) {holders} at once")  # fmt: skip
    return found


class Recorder:
    """Watches and samples (see the module docstring) from `start()` until `stop()`; thread-safe."""

    def __init__(self, api: client.ApiClient, node: str, runtime_endpoint: str,
                 side_of: Callable[[str, str], str | None]) -> None:  # fmt: skip
        """`side_of(namespace, pod)` says which side a pod is on (DRA or OURS), None for a pod not of the test."""
        self.api, self.node, self.endpoint, self.side_of = api, node, runtime_endpoint, side_of
        self.changes: list[Change] = []
        self.samples = 0
        self.overlaps: list[str] = []  # a card in containers of both sides in one sample
        self.seen: dict[tuple[str, str], set[str]] = {}  # (namespace, pod) -> card uuids its containers had
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._env: dict[str, tuple[tuple[str, str], set[str]]] = {}  # container id -> (pod, uuids)

    def start(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        gpus = (custom.list_cluster_custom_object, {"group": names.GROUP, "version": names.VERSION,
                "plural": names.PLURAL_GPU, "label_selector": f"{names.LABEL_NODE}={self.node}"})  # fmt: skip
        claims = (custom.list_cluster_custom_object, {"group": "resource.k8s.io", "version": "v1",
                  "plural": "resourceclaims"})  # fmt: skip
        targets = {"gpus": lambda: self._watch("gpu", *gpus), "claims": lambda: self._watch("claim", *claims),
                   "containers": self._sample_loop}  # fmt: skip
        for name, target in targets.items():
            thread = threading.Thread(target=target, name=f"record-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in self._threads), "a recorder thread did not stop"

    def _take(self, kind: str, event_type: str, body: dict[str, Any]) -> None:
        deleted = event_type == "DELETED"
        change = gpu_change(body, deleted) if kind == "gpu" else claim_change(body, self.node, deleted)
        with self._lock:
            self.changes.append(change)

    def _watch(self, kind: str, list_call: Any, arguments: dict[str, Any]) -> None:
        """List, then watch from the list's revision; a broken watch goes on from the last revision
        seen (the record stays gapless), a 410 (compacted) lists again and says so in `errors`."""
        revision: str | None = None
        while not self._stop.is_set():
            try:
                if revision is None:
                    listed = list_call(**arguments)
                    for item in listed["items"]:
                        self._take(kind, "ADDED", item)
                    revision = listed["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(list_call, resource_version=revision, timeout_seconds=5,
                                              allow_watch_bookmarks=True, **arguments)  # fmt: skip
                for event in stream:
                    body = event["object"]
                    if event["type"] == "ERROR":
                        raise client.ApiException(status=body.get("code", 500), reason=body.get("message"))
                    revision = body["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._take(kind, event["type"], body)
                    if self._stop.is_set():
                        break
            except client.ApiException as e:
                if e.status == 410:
                    with self._lock:
                        self.errors.append(f"the {kind} watch was compacted at {revision}: listed again")
                    revision = None
                time.sleep(0.2)
            except Exception as e:  # a fault of the connection: go on from the last revision seen
                with self._lock:
                    self.errors.append(f"{kind} watch: {e!r}")
                time.sleep(0.2)

    def _sample_loop(self) -> None:
        while not self._stop.wait(0.7):
            try:
                self._sample()
            except Exception as e:  # the runtime busy: the next sample tries again
                with self._lock:
                    self.errors.append(f"container sample: {e!r}")

    def _sample(self) -> None:
        import grpc

        from elasticgpu.agent.cri import api

        holders: dict[str, set[tuple[str, tuple[str, str]]]] = {}
        with grpc.insecure_channel(self.endpoint) as channel:
            stub = api.services.RuntimeServiceStub(channel)
            running = stub.ListContainers(api.pb.ListContainersRequest(filter=api.pb.ContainerFilter(
                state=api.pb.ContainerStateValue(state=api.pb.CONTAINER_RUNNING))), timeout=10).containers  # fmt: skip
            for container in running:
                if container.id not in self._env:
                    status = stub.ContainerStatus(api.pb.ContainerStatusRequest(container_id=container.id,
                                                                                verbose=True), timeout=10)  # fmt: skip
                    pod = (container.labels.get("io.kubernetes.pod.namespace", ""),
                           container.labels.get("io.kubernetes.pod.name", ""))  # fmt: skip
                    self._env[container.id] = (pod, cards_of(json.loads(status.info["info"])))
                pod, uuids = self._env[container.id]
                side = self.side_of(*pod)
                if side is None:
                    continue
                for uuid in uuids:
                    if uuid.startswith("GPU-"):
                        holders.setdefault(uuid, set()).add((side, pod))
        with self._lock:
            self.samples += 1
            for (namespace, name), uuids in (self._env[c.id] for c in running):
                self.seen.setdefault((namespace, name), set()).update(uuids)
            for uuid, who in holders.items():
                if len({side for side, _ in who}) > 1:
                    self.overlaps.append(f"sample {self.samples}: card {uuid} in running containers of both "
                                         f"sides: {sorted(who)}")  # fmt: skip


def cards_of(info: dict[str, Any]) -> set[str]:
    """The cards a container has, from containerd's verbose info: NVIDIA_VISIBLE_DEVICES of its OCI spec
    (after CDI: uuids, or `void`, or `<unset>`) and our card CDI devices kubelet asked for it (uuids)."""
    env = dict(item.split("=", 1) for item in info.get("runtimeSpec", {}).get("process", {}).get("env", [])
               if "=" in item)  # fmt: skip
    # Every value, not only uuids: a container neutralised (`void`) or with none (`<unset>`) must show.
    visible = {u for u in env.get("NVIDIA_VISIBLE_DEVICES", "<unset>").split(",") if u}
    config = info.get("config") or {}
    devices = config.get("CDI_devices") or config.get("cdi_devices") or config.get("CDIDevices") or []
    asked = {str(d.get("name", "")).removeprefix(CDI_CARD) for d in devices
             if str(d.get("name", "")).startswith(CDI_CARD)}  # fmt: skip
    return visible | asked


@contextlib.contextmanager
def recording(api: client.ApiClient, node: str, endpoint: str,
              side_of: Callable[[str, str], str | None]) -> Iterator[Recorder]:  # fmt: skip
    recorder = Recorder(api, node, endpoint, side_of)
    recorder.start()
    try:
        yield recorder
    finally:
        recorder.stop()
