"""Inventory: keeps this node's GPU objects and Node labels true to what discovery sees.

For each card the agent owns:
- the object's labels (`elasticgpu.io/node=<node>`, which its watch selects on) and its spec
  (index, uuid, model, memory, nodeName, numa, links, pcieRoot, nics, mig), by server-side apply, written only
  when they differ from what the watch last delivered;
- in status: `capacity` (`{gpu-core: 100, gpu-memory: 80Gi}`, api.printing.gpu_capacity), `isolation` (the
  modes the node can provide: MPS, HAMiCore; docs/isolation.md), `health`,
  `usage` and the conditions `Heartbeat`, `Healthy` and `ApplicationXid` (the controller owns
  `allocations`, `allocatable`, `allocatableSummary` and its own conditions; the agent keeps
  those as they are, except that it fills in the whole card's `allocatable` and
  `allocatableSummary`, `100%/80Gi`, on a card whose status has no allocations and no summary
  yet, so that ALLOCATABLE is never blank). One status write per card per heartbeat interval in steady
  state; a change of health, capacity or a large change of usage is written at once.

The node's own conditions, on each of its cards (`node_conditions`, made by running.py; the controller does
not read them, `kubectl egpu doctor` and `handover` do): `GpuAllocatorConflict`, `FailOpenWindow`, `NodeHook`
(elasticgpu.api.node_handover).

Conditions the controller reads:
- `Heartbeat` (True, reason `AgentHeartbeat`): its `lastTransitionTime` is the time of the last
  heartbeat, renewed every `heartbeat_interval_s` while the agent sees the card (as a Lease's
  renewTime). A GPU whose heartbeat is older than a grace period has lost its agent; a GPU
  without this condition was written by hand or another tool and is taken as it is.
- `Healthy`: True (`NoFatalXid`, `Recovered`) or False (`Xid<code>`, `Vanished`), mirrored by
  `status.health` (Healthy / Unhealthy).

With the ledger, inventory also runs `holders.RunningClaimsPublisher` (its own thread): the
claims whose containers run on each card, in `status.runningClaims`, written on every change of
the ledger's open rows (the controller keeps a reservation while its claim is listed there).

A card whose object already exists for another node (its name is the card's uuid, and another
node's agent created it first, by mistake or on purpose) is not taken over: the node-scope policy
refuses that, and only an admin can tell which node really has the card. The agent writes nothing
there (issue 44: a report on another node's object let one node's token set every node's cards
aside): it posts a Warning Event `DuplicateUUID` about its own Node that names the object and the
other node, publishes its other cards as usual, and says so in its log.

A card that discovery no longer reports is marked Unhealthy with reason `Vanished`; its object is
never deleted by the agent (reservations may point at it, and a card that comes back is Healthy
again). Each object names the node's Node as its owner (an ownerReference with the Node's uid):
when the Node is deleted, the cluster's garbage collector deletes its GPU objects, as it does for
what a Node owns (the controller does it too where no garbage collector runs; issue 23).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from elasticgpu.agent import errors, holders
from elasticgpu.agent.discovery import Card, DiscoveryBackend, Snapshot
from elasticgpu.agent.health import CardHealth, HealthTracker
from elasticgpu.agent.kube import AgentKube
from elasticgpu.agent.ledger.store import LedgerStore
from elasticgpu.agent.settings import InventorySettings
from elasticgpu.api import names, node_handover, printing, timestamps

logger = logging.getLogger(__name__)

HEARTBEAT = "Heartbeat"
DUPLICATE_UUID = "DuplicateUUID"
"""The condition an agent writes on another node's GPU object whose card it sees too (the one write the
node-scope policy lets it make there); the controller takes no new reservation on such a card."""
REASON_SEEN_ON_ANOTHER_NODE = "SeenOnAnotherNode"
HEALTHY = "Healthy"
APPLICATION_XID = "ApplicationXid"
AGENT_CONDITIONS = (HEARTBEAT, HEALTHY, APPLICATION_XID, *node_handover.NODE_CONDITIONS)
NodeCondition = tuple[str, str, str, str]
"""A condition of the node that each of its GPUs carries: (type, status, reason, message)."""
VANISHED = "Vanished"

LABEL_PRESENT = "nvidia.com/gpu.present"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_MEMORY = "nvidia.com/gpu.memory"
NODE_LABELS = (LABEL_PRESENT, LABEL_COUNT, LABEL_PRODUCT, LABEL_MEMORY)


def rfc3339(seconds: float) -> str:
    """Seconds since the epoch as RFC 3339 in UTC, whole seconds (what metav1.Time keeps)."""
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


parse_rfc3339 = timestamps.epoch_seconds
"""RFC 3339 text as seconds since the epoch; None when absent or unreadable."""


def label_value(text: str) -> str:
    """`text` as a valid label value, GPU Feature Discovery style (`NVIDIA A100-SXM4-80GB` -> `NVIDIA-A100-...`)."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip())[:63]
    return value.strip("-._") or "unknown"


def node_labels(cards: tuple[Card, ...]) -> dict[str, str | None]:
    """GFD-style node labels for the cards (None: remove the label; a node without cards carries none)."""
    if not cards:
        return dict.fromkeys(NODE_LABELS)
    first = min(cards, key=lambda card: card.index)
    return {
        LABEL_PRESENT: "true",
        LABEL_COUNT: str(len(cards)),
        LABEL_PRODUCT: label_value(first.model),
        LABEL_MEMORY: str(first.memory_mib),
    }


def node_owner(node: dict[str, Any]) -> dict[str, Any] | None:
    """The ownerReference to a Node object (None when it has no uid). Not `blockOwnerDeletion`: that
    needs the right to set finalizers on the Node, and nothing must keep a Node from being deleted."""
    meta = node.get("metadata") or {}
    if not meta.get("uid") or not meta.get("name"):
        return None
    return {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta["uid"]}


def default_card_owner(node: dict[str, Any]) -> str | None:
    """The spec.owner a new GPU object of this Node gets: its label `elasticgpu.io/gpu-owner` when that is
    ElasticGPU or DRA; None (the CRD's default, ElasticGPU) when absent or anything else."""
    value = ((node.get("metadata") or {}).get("labels") or {}).get(names.LABEL_GPU_OWNER)
    return value if value in names.OWNERS else None


def agent_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """The part of a GPU object's spec the agent writes: all of it but `owner` (the platform team's)."""
    return {k: v for k, v in (obj.get("spec") or {}).items() if k != "owner"}


def owned_by(obj: dict[str, Any], owner: dict[str, Any] | None) -> bool:
    """True when `obj` already names `owner` among its ownerReferences (or there is no owner to name)."""
    if owner is None:
        return True
    return any(ref.get("uid") == owner["uid"] and ref.get("kind") == "Node"
               for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def gpu_spec(card: Card, node_name: str) -> dict[str, Any]:
    """The GPU object's spec for a card (camelCase, as the CRD spells it)."""
    spec: dict[str, Any] = {
        "index": card.index, "uuid": card.uuid, "model": card.model, "memory": card.memory_mib,
        "nodeName": node_name, "links": list(card.links), "mig": card.mig_enabled,
    }
    if card.numa is not None:
        spec["numa"] = card.numa
    if card.pcie_root:
        spec["pcieRoot"] = card.pcie_root
    if card.nics:
        spec["nics"] = list(card.nics)
    return spec


@dataclass(frozen=True)
class GpuUsage:
    """What a card's processes use, as the usage loop last measured it."""

    memory_mib: int
    sm_percent: int
    measured_at: float


def _condition(type_: str, status: str, reason: str, message: str, previous: dict[str, Any] | None,
               now: float) -> dict[str, Any]:
    # lastTransitionTime moves only when the status changes (metav1.Condition's rule)...
    unchanged = previous is not None and previous.get("status") == status
    when = previous.get("lastTransitionTime") if unchanged and previous else None
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": when or rfc3339(now)}


def desired_status(
    obj: dict[str, Any],
    *,
    card: Card | None,
    health: CardHealth,
    usage: GpuUsage | None,
    node_name: str,
    now: float,
    isolation: list[str] | None = None,
    node_conditions: list[NodeCondition] | None = None,
) -> dict[str, Any]:
    """The status fields the agent owns, for a card that is present (`card`) or vanished (None).
    `node_conditions`: the node's own (node_handover.NODE_CONDITIONS), written on each of its cards.

    The Heartbeat condition carries `now`; the caller decides whether it is time to write it.
    """
    status = obj.get("status") or {}
    previous = {c.get("type"): c for c in status.get("conditions") or []}
    conditions = [c for c in status.get("conditions") or [] if c.get("type") not in AGENT_CONDITIONS]
    result: dict[str, Any] = {}
    if card is None:
        vanished = _condition(HEALTHY, "False", VANISHED, "", previous.get(HEALTHY), now)
        if previous.get(HEALTHY, {}).get("reason") != VANISHED:
            vanished["lastTransitionTime"] = rfc3339(now)
        vanished["message"] = (
            f"the driver of node {node_name} no longer reports this card (since {vanished['lastTransitionTime']});"
            " no new reservations; the object is kept while reservations may point at it"
        )
        conditions.append(vanished)
        if HEARTBEAT in previous:
            conditions.append(previous[HEARTBEAT])  # no heartbeat for a card we do not see: it ages
        result["health"] = "Unhealthy"
    else:
        beat = {"type": HEARTBEAT, "status": "True", "reason": "AgentHeartbeat",
                "message": f"the agent of node {node_name} sees this card", "lastTransitionTime": rfc3339(now)}
        conditions.append(beat)
        conditions.append(_condition(HEALTHY, "True" if health.healthy else "False", health.reason, health.message,
                                     previous.get(HEALTHY), now))
        result["health"] = "Healthy" if health.healthy else "Unhealthy"
        # `80Gi`, not 81920: the MEMORY column of `kubectl get pgpu` prints this value as it is.
        result["capacity"] = printing.gpu_capacity(card.memory_mib)
        # The isolation modes this node's agent can provide (the allocator binds a class's slices only here).
        result["isolation"] = sorted(isolation or [])
        if not status.get("allocations") and not status.get("allocatableSummary"):
            # A card nothing was ever reserved on offers all of itself: without this its ALLOCATABLE
            # column stays blank until the controller's first reservation. Only while the status
            # holds neither: the write's resourceVersion precondition keeps it from ever covering
            # a summary the controller wrote meanwhile, and from then on the controller keeps it.
            result["allocatable"] = printing.gpu_capacity(card.memory_mib)
            result["allocatableSummary"] = printing.allocatable_summary(names.CORES_PER_CARD, card.memory_mib)
        if usage is not None:
            result["usage"] = {"memoryUsed": usage.memory_mib, "coresUsed": usage.sm_percent,
                               "updateTime": rfc3339(usage.measured_at)}
    if health.last_application is not None:
        event = health.last_application
        seen = rfc3339(event.timestamp)
        conditions.append({
            "type": APPLICATION_XID, "status": "True", "reason": f"Xid{event.xid}", "lastTransitionTime": seen,
            "message": f"application XID {event.xid} at {seen}: an application's error, recorded, not fatal for"
            " the card",
        })
    for type_, cond_status, reason, message in node_conditions or []:
        conditions.append(_condition(type_, cond_status, reason, message, previous.get(type_), now))
    result["conditions"] = sorted(conditions, key=lambda c: str(c.get("type")))
    return result


def _comparable(status: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The status as compared for "did anything change": only `keys`, without the heartbeat's time."""
    result = {key: status.get(key) for key in keys if key != "conditions"}
    if "conditions" in keys:
        conditions = [
            {k: v for k, v in c.items() if not (c.get("type") == HEARTBEAT and k == "lastTransitionTime")}
            for c in status.get("conditions") or []
        ]
        result["conditions"] = sorted(conditions, key=lambda c: str(c.get("type")))
    return result


def heartbeat_age(obj: dict[str, Any], now: float) -> float | None:
    """Seconds since the object's last heartbeat; None when it has none."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == HEARTBEAT:
            beat = parse_rfc3339(condition.get("lastTransitionTime"))
            return None if beat is None else now - beat
    return None


def _allocations(obj: dict[str, Any] | None) -> Any:
    return ((obj or {}).get("status") or {}).get("allocations")


def _rv(obj: dict[str, Any]) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


class Inventory:
    """The loop that keeps the node's GPU objects and labels true. `run` blocks until `stop` is set."""

    def __init__(
        self,
        *,
        kube: AgentKube,
        backend: DiscoveryBackend,
        health: HealthTracker,
        settings: InventorySettings,
        watch_timeout_s: int = 60,
        clock: Callable[[], float] = time.time,
        ledger: LedgerStore | None = None,
        isolation: Callable[[], list[str]] = list,
        node_conditions: Callable[[], list[NodeCondition]] = list,
    ) -> None:
        """`ledger`: publish the running claims of its open rows (None: no `status.runningClaims`);
        `isolation`: the isolation modes the node can provide now (MPS, HAMiCore), in each card's status;
        `node_conditions`: the node's conditions now (another allocator, the toolkit, the node hook), on each card."""
        self._isolation = isolation
        self._node_conditions = node_conditions
        self._kube = kube
        self._backend = backend
        self._health = health
        self._settings = settings
        self._watch_timeout_s = watch_timeout_s
        self._clock = clock
        self._node = kube.node_name
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Any]] = {}  # this node's GPU objects, by name (watch + write answers)
        self._synced = threading.Event()  # the first list arrived
        self._usage: dict[str, GpuUsage] = {}
        self._urgent: set[str] = set()  # cards whose usage changed enough to be written at once
        self._labels_written: dict[str, str | None] | None = None
        self._labels_checked = 0.0  # when the Node's labels were last read back
        self._restored: set[str] = set()  # cards whose health was read back from their object after a start
        self._owner: dict[str, Any] | None = None  # the ownerReference to our Node (read again before each apply)
        self._card_owner: str | None = None  # spec.owner of a new card's object: the Node's elasticgpu.io/gpu-owner
        self._duplicates_said: set[tuple[str, str]] = set()  # (card uuid, other node) whose Event was written
        self._owner_read = False
        self.wake = threading.Event()
        """Set to write at once (a fatal XID, a large change of usage) instead of at the next interval."""
        self.snapshot = Snapshot()
        """The cards of the last discovery."""
        self.status_writes = 0
        """GPU status writes made (for the benchmark and metrics)."""
        self.holders = (
            holders.RunningClaimsPublisher(kube=kube, ledger=ledger, objects=self.objects, remember=self._remember)
            if ledger is not None else None
        )  # fmt: skip
        """The publisher of `status.runningClaims` (None without a ledger)."""

    @property
    def events_namespace(self) -> str:
        """Namespace of the Events about this node's GPU objects (cluster scoped)."""
        return self._settings.events_namespace

    # What other loops tell inventory -------------------------------------------------------------

    def set_gpu_usage(self, uuid: str, usage: GpuUsage, *, urgent: bool) -> None:
        """The usage loop's newest measurement of a card; `urgent` writes it at once."""
        with self._lock:
            self._usage[uuid] = usage
            if urgent:
                self._urgent.add(uuid)
        if urgent:
            self.wake.set()

    def objects(self) -> dict[str, dict[str, Any]]:
        """This node's GPU objects as last seen (a copy of the mapping, the objects shared)."""
        with self._lock:
            return dict(self._objects)

    # The watch -------------------------------------------------------------------------------------

    def _remember(self, obj: dict[str, Any]) -> None:
        name = obj.get("metadata", {}).get("name")
        if not name:
            return
        with self._lock:
            known = self._objects.get(name)
            if known is None or _rv(obj) >= _rv(known):
                self._objects[name] = obj

    def watch(self, stop: threading.Event) -> None:
        """List, then watch this node's GPU objects (label selector) until `stop`; relist on 410. Never dies."""
        resource_version = ""
        failures = 0
        while not stop.is_set():
            try:
                if not resource_version:
                    items, resource_version = self._kube.list_gpus()
                    with self._lock:
                        self._objects = {o["metadata"]["name"]: o for o in items}
                    self._synced.set()
                for event in self._kube.watch_gpus(resource_version, timeout_s=self._watch_timeout_s):
                    if stop.is_set():
                        return
                    new_rv = event.object.get("metadata", {}).get("resourceVersion")
                    if new_rv:
                        resource_version = str(new_rv)
                    if event.type == "DELETED":
                        with self._lock:
                            self._objects.pop(event.object.get("metadata", {}).get("name", ""), None)
                        self.wake.set()  # someone deleted a card of ours: publish it again
                    elif event.type in ("ADDED", "MODIFIED"):
                        before = self.objects().get(event.object.get("metadata", {}).get("name", ""))
                        self._remember(event.object)
                        if self.holders is not None and _allocations(before) != _allocations(event.object):
                            self.holders.wake.set()  # a resize: the claims' limits files follow at once
                failures = 0
            except errors.KubeConflict:
                resource_version = ""  # 410 Gone: our version is too old; list again
            except Exception as e:
                failures += 1
                logger.warning("watch of node %s's GPU objects failed (%s); retrying", self._node, e)
                stop.wait(min(30.0, 0.2 * 2**failures))

    # Reconciling -----------------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Reconcile now, then every `rediscover_interval_s` or when woken, until `stop`. Never dies."""
        watcher = threading.Thread(target=self.watch, args=(stop,), name="inventory-watch", daemon=True)
        watcher.start()
        publisher = None
        if self.holders is not None:
            publisher = threading.Thread(target=self.holders.run, args=(stop,), kwargs={"ready": self._synced},
                                         name="running-claims", daemon=True)  # fmt: skip
            publisher.start()
        self._synced.wait(timeout=self._settings.rediscover_interval_s)
        failures = 0
        while not stop.is_set():
            self.wake.clear()
            try:
                self.reconcile()
                failures = 0
                delay = self._settings.rediscover_interval_s
            except Exception as e:
                failures += 1
                logger.warning("inventory of node %s failed (%s); retrying", self._node, e,
                               exc_info=not isinstance(e, errors.KubeError))
                delay = min(self._settings.rediscover_interval_s, 0.5 * 2**failures)
            if self.wake.wait(delay):
                stop.wait(0.05)  # let a burst of wake-ups (several XIDs) collapse into one pass
        watcher.join(timeout=1)
        if self.holders is not None and publisher is not None:
            self.holders.wake.set()  # it may be waiting for the ledger: let it see the stop
            publisher.join(timeout=1)

    def reconcile(self) -> None:
        """One pass: discover, publish specs, write due statuses, label the node."""
        snapshot = self._backend.snapshot()
        self.snapshot = snapshot
        now = self._clock()
        present = {names.gpu_object_name(card.uuid): card for card in snapshot.cards}
        labels = {names.LABEL_NODE: self._node}
        for name, card in present.items():
            obj = self.objects().get(name)
            spec = gpu_spec(card, self._node)
            if not self._owner_read:
                self._read_owner()
            if obj is None or agent_spec(obj) != spec or (obj.get("metadata", {}).get("labels") or {}).get(
                names.LABEL_NODE
            ) != self._node or not owned_by(obj, self._owner):
                self._read_owner()  # an apply is rare: the Node may have been registered again (another uid)
                try:
                    if obj is None and self._card_owner is not None:
                        self._create_with_owner(name, labels=labels, spec=spec)
                    obj = self._kube.apply_gpu(name, labels=labels, spec=spec, owner=self._owner)
                except errors.KubeError as e:
                    if e.status == 403 and self._report_duplicate(name, card, now):
                        continue  # another node holds this card's object: reported there; the others go on
                    raise
                self._remember(obj)
                logger.info("published card %s (%s) as GPU %s", card.index, card.model, name)
                if self.holders is not None:
                    self.holders.wake.set()  # a new object: its running claims too
            if card.uuid not in self._restored:
                self._restore_health(card.uuid, obj)
            self._write_status(name, card, now)
        for name, obj in self.objects().items():
            if name not in present and (obj.get("spec") or {}).get("nodeName") == self._node:
                self._write_status(name, None, now)
        desired_labels = node_labels(snapshot.cards)
        if self._labels_written is not None and now - self._labels_checked >= self._settings.node_labels_check_s:
            # Someone (an admin, another labeller) may have changed them: compare with the Node itself.
            self._labels_checked = now
            actual = (self._kube.read_node().get("metadata") or {}).get("labels") or {}
            if any(actual.get(key) != value for key, value in desired_labels.items()):
                self._labels_written = None
        if desired_labels != self._labels_written:
            self._kube.patch_node_labels(desired_labels)
            self._labels_written = desired_labels
            self._labels_checked = now

    def _report_duplicate(self, name: str, card: Card, now: float) -> bool:
        """When GPU object `name` (of our `card`) belongs to another node: say so on our own Node (a Warning Event
        DuplicateUUID, once per card per process: the policy lets an agent write nothing on another node's
        object, issue 44) and return True; False when it does not (the refusal is another)."""
        try:
            obj = self._kube.read_gpu(name)
        except errors.KubeNotFound:
            return False
        other = str((obj.get("spec") or {}).get("nodeName") or "")
        if not other or other == self._node:
            return False
        if (card.uuid, other) in self._duplicates_said:
            return True
        message = (f"node {self._node}: its driver reports card {card.uuid} (index {card.index}) too, while GPU object"
                   f" {name} says node {other}; a uuid is one card: find the node that really has it (nvidia-smi -L"
                   f" on both) and, if it is not {other}, delete that object (kubectl delete pgpu {name}): the agent"
                   f" of {self._node} publishes it again; until then this node does not serve that card")
        logger.warning("card %s of node %s: its GPU object %s belongs to node %s (%s)", card.uuid, self._node, name,
                       other, DUPLICATE_UUID)
        try:
            self._kube.create_event(
                namespace=self._settings.events_namespace,
                involved={"apiVersion": "v1", "kind": "Node", "name": self._node,
                          "uid": (self._owner or {}).get("uid")},
                type_="Warning", reason=DUPLICATE_UUID, message=message, now=rfc3339(now))
        except errors.KubeError as e:
            logger.warning("Event about Node %s not written: %s", self._node, e)
            return True  # said next time
        self._duplicates_said.add((card.uuid, other))
        return True

    def _create_with_owner(self, name: str, *, labels: dict[str, str], spec: dict[str, Any]) -> None:
        """Create a new card's object with the Node's default owner; one that exists keeps its own."""
        try:
            self._kube.create_gpu(name, labels=labels, spec={**spec, "owner": self._card_owner}, owner=self._owner)
        except errors.KubeError as e:
            if e.status != 409:
                raise
            return  # it exists (our view lagged): its spec.owner is the platform team's, kept as it is
        logger.info("card %s: created with owner %s (label %s of Node %s)", name, self._card_owner,
                    names.LABEL_GPU_OWNER, self._node)

    def _read_owner(self) -> None:
        """Read our Node's uid for the GPU objects' ownerReference; without it (the Node cannot be read) the
        objects are written without one, said once: the controller still collects them by spec.nodeName.
        The Node's label elasticgpu.io/gpu-owner, read with it, is the owner a new card's object gets."""
        self._owner_read = True
        try:
            node = self._kube.read_node()
            self._owner = node_owner(node)
            self._card_owner = default_card_owner(node)
        except errors.KubeError as e:
            if self._owner is None:
                logger.warning("Node %s cannot be read (%s): its GPU objects get no ownerReference to it",
                               self._node, e)

    def _restore_health(self, uuid: str, obj: dict[str, Any]) -> None:
        """After a start: a card the previous agent marked Unhealthy for an XID stays so for the rest of its quiet
        period (read from the `Healthy` condition), instead of being called Healthy by a tracker that forgot."""
        self._restored.add(uuid)
        for condition in (obj.get("status") or {}).get("conditions") or []:
            reason = str(condition.get("reason", ""))
            if condition.get("type") == HEALTHY and condition.get("status") == "False" and reason[3:].isdigit() \
                    and reason.startswith("Xid"):
                since = parse_rfc3339(condition.get("lastTransitionTime"))
                if since is not None:
                    self._health.restore(uuid, xid=int(reason[3:]), timestamp=since)
                    logger.info("card %s: Unhealthy since %s (%s) before this start; kept until it is quiet",
                                uuid, condition.get("lastTransitionTime"), reason)

    def _announce(self, obj: dict[str, Any], *, before: dict[str, Any], after: dict[str, Any]) -> None:
        """An Event when the card's health changed (`kubectl describe pgpu` shows why), never one per write."""
        old = next((c for c in before.get("conditions") or [] if c.get("type") == HEALTHY), None)
        new = next((c for c in after.get("conditions") or [] if c.get("type") == HEALTHY), None)
        same = old is not None and new is not None and (old.get("status"), old.get("reason")) == (
            new["status"], new["reason"])
        if new is None or same:
            return
        if old is None and new["status"] == "True":
            return  # a new card, healthy: nothing to tell
        metadata = obj.get("metadata") or {}
        try:
            self._kube.create_event(
                namespace=self._settings.events_namespace,
                involved={"apiVersion": names.API_VERSION, "kind": names.KIND_GPU, "name": metadata.get("name"),
                          "uid": metadata.get("uid")},
                type_="Normal" if new["status"] == "True" else "Warning",
                reason="CardHealthy" if new["status"] == "True" else f"Card{new['reason']}",
                message=str(new.get("message", "")), now=rfc3339(self._clock()),
            )
        except errors.KubeError as e:
            logger.warning("Event about GPU %s not written: %s", metadata.get("name"), e)

    def _write_status(self, name: str, card: Card | None, now: float) -> None:
        try:
            modes = self._isolation()
        except Exception:  # a check of the node's files failed: offer nothing rather than too much
            logger.exception("could not tell which isolation modes this node provides")
            modes = []
        try:
            node_conditions = self._node_conditions()
        except Exception:  # a check of the node failed: its conditions are left out of this write
            logger.exception("could not read this node's conditions")
            node_conditions = []
        uuid = card.uuid if card is not None else str((self.objects().get(name, {}).get("spec") or {}).get("uuid", ""))
        for attempt in range(5):
            obj = self.objects().get(name)
            if obj is None:
                return
            with self._lock:
                usage = self._usage.get(uuid) if card is not None else None
                usage_due = uuid in self._urgent
            desired = desired_status(obj, card=card, health=self._health.health(uuid), usage=usage,
                                     node_name=self._node, now=now, isolation=modes,
                                     node_conditions=node_conditions)
            current = obj.get("status") or {}
            keys = tuple(key for key in desired if key != "usage")
            changed = _comparable(desired, keys) != _comparable(current, keys)
            age = heartbeat_age(obj, now)
            beat_due = card is not None and (age is None or age >= self._settings.heartbeat_interval_s)
            if not (changed or beat_due or usage_due):
                return
            try:
                answer = self._kube.patch_gpu_status(
                    name, resource_version=str(obj["metadata"]["resourceVersion"]), status=desired
                )
            except errors.KubeConflict:
                # Someone (the controller reserving) wrote the card since we saw it: read it and recompute.
                try:
                    self._remember(self._kube.read_gpu(name))
                except errors.KubeNotFound:
                    with self._lock:
                        self._objects.pop(name, None)
                    return
                time.sleep(0.01 * (attempt + 1))
                continue
            except errors.KubeNotFound:
                with self._lock:
                    self._objects.pop(name, None)
                return
            self.status_writes += 1
            with self._lock:
                self._urgent.discard(uuid)
            self._remember(answer)
            self._announce(answer, before=current, after=desired)
            return
        logger.info("GPU %s: status still conflicting after 5 tries; next pass retries", name)
