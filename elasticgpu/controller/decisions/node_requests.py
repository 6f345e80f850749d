"""Asking the node autoscaler for GPU nodes: which placeholder pods should exist for the claims
that wait for capacity, and what each waiting claim's `NodeRequested` condition says.

Why placeholder pods (docs/autoscaling.md): Cluster Autoscaler and Karpenter both add a node when
a pod is unschedulable for want of a resource that a node pool's template offers. Our pods ask no
GPU resource (they wait behind a scheduling gate, which autoscalers skip by design), so for the
claims that wait `NoCapacity` the controller keeps pods that ask what a GPU node template offers
(`nvidia.com/gpu: N`, with the class's node selector). `ProvisioningRequest` is read by Cluster
Autoscaler only; NodeClaims by Karpenter only; a placeholder pod is read by both.

The set of placeholders is a function of the claims that wait now (level-based), never of how
often a claim was retried: the same waiting claims always give the same placeholder names, so a
resync creates nothing new and a claim asks for one node however long it waits.

- a claim of whole cards: one placeholder asking its `cards` (they must be on one node), named
  from the claim's uid;
- shares of one card: packed first-fit, in the order the claims were made, into cards of 100
  cores (and, where the class's cards are known, of their memory); one placeholder per card,
  named from the uid of the first claim packed into it;
- the WaitForFirstConsumer claims of one pod that no node can hold: one placeholder asking all
  their cards (a share counts one card), since they must meet on one node; named from the first
  claim's uid;
- every placeholder keeps off the nodes whose cards the controller knows when it is made (they
  could not take its claims), by a label of ours on those nodes (`placeholder_pod`); a node whose
  agent has not published its cards yet may take it: it may be the node coming for it.

Pure: takes plain values, returns plain values.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from elasticgpu.api import GpuRequest, names

CONDITION_NODE_REQUESTED = "NodeRequested"
"""A claim's condition while a node was asked for it (type and reason)."""
REASON_NODE_REQUESTED = "NodeRequested"
REASON_NODE_NOT_PROVISIONED = "NodeNotProvisioned"
"""The NodeRequested condition's reason (and a Warning Event) when no node came within the wait."""
LABEL_NODE_REQUEST = "elasticgpu.io/node-request"
"""On placeholder pods ("true"): the controller lists and deletes only pods with it."""
ANNOTATION_FOR_CLAIMS = "elasticgpu.io/for-claims"
"""On placeholder pods: the claims (namespace/name, comma-separated) the node is asked for."""
NAME_PREFIX = "egpu-node-request-"
LABEL_NODE_ID = "elasticgpu.io/node-id"
"""On Nodes whose cards the controller knows (`node_id` of the name): what placeholders keep off."""
_LABEL_VALUE = re.compile(r"(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
"""A label value the API server takes."""


@dataclass(frozen=True)
class Waiter:
    """A claim that waits for capacity a new node could give."""

    namespace: str
    name: str
    uid: str
    class_name: str
    request: GpuRequest
    node_selector: tuple[tuple[str, str], ...] = ()
    card_memory_mib: int | None = None
    """The memory of the class's cards where some are known (None: pack shares by cores alone)."""
    created: str = ""
    pod: str = ""
    """For a WaitForFirstConsumer claim: its pod (namespace/name), whose claims must meet on one
    node; "" for a claim placed on its own."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Ask:
    """One placeholder pod: `cards` of the node resource on one node with `node_selector`, for `claims`."""

    name: str
    class_name: str
    cards: int
    node_selector: tuple[tuple[str, str], ...]
    claims: tuple[str, ...]


@dataclass
class _Card:
    first_uid: str
    cores: int = 0
    memory_mib: int = 0
    claims: list[str] = field(default_factory=list)


def _name(uid: str) -> str:
    # A uid is unique and a DNS label already; hashed only to keep names short and lowercase.
    return NAME_PREFIX + hashlib.sha256(uid.encode()).hexdigest()[:16]


def _share_size(waiter: Waiter) -> tuple[int, int]:
    """(cores, memory MiB) a share takes on a card: memory-only shares take no cores; memory in
    proportion to cores where the claim gives none and the card's size is known."""
    request = waiter.request
    memory = request.memory_mib
    if memory is None and waiter.card_memory_mib:
        memory = request.memory_on(waiter.card_memory_mib)
    return request.cores, memory or 0


def asks(waiters: Iterable[Waiter]) -> list[Ask]:
    """The placeholders the waiting claims need (see the module docstring), sorted by name."""
    found: list[Ask] = []
    groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[Waiter]] = {}
    pods: dict[str, list[Waiter]] = {}
    for waiter in sorted(waiters, key=lambda w: (w.created, w.uid)):
        if waiter.pod:
            pods.setdefault(waiter.pod, []).append(waiter)
        elif waiter.request.cards:
            found.append(Ask(name=_name(waiter.uid), class_name=waiter.class_name, cards=waiter.request.cards,
                             node_selector=waiter.node_selector, claims=(waiter.key,)))
        else:
            groups.setdefault((waiter.class_name, waiter.node_selector), []).append(waiter)
    for members in pods.values():
        first = members[0]
        found.append(Ask(name=_name(first.uid), class_name=first.class_name,
                         cards=sum(max(1, m.request.cards) for m in members),
                         node_selector=tuple(sorted({kv for m in members for kv in m.node_selector})),
                         claims=tuple(m.key for m in members)))
    for (class_name, selector), shares in groups.items():
        cards: list[_Card] = []
        for waiter in shares:
            cores, memory = _share_size(waiter)
            limit = waiter.card_memory_mib
            card = next((c for c in cards if c.cores + cores <= names.CORES_PER_CARD
                         and (not limit or c.memory_mib + memory <= limit)), None)
            if card is None:
                card = _Card(first_uid=waiter.uid)
                cards.append(card)
            card.cores += cores
            card.memory_mib += memory
            card.claims.append(waiter.key)
        found += [Ask(name=_name(c.first_uid), class_name=class_name, cards=1, node_selector=selector,
                      claims=tuple(c.claims)) for c in cards]
    return sorted(found, key=lambda a: a.name)


def node_id(name: str) -> str:
    """The value of `LABEL_NODE_ID` for node `name`: the name where it is a label value (at most 63
    characters), else a hash of it (KWOK's node names run to 69)."""
    return name if _LABEL_VALUE.fullmatch(name) else "h-" + hashlib.sha256(name.encode()).hexdigest()[:32]


def placeholder_pod(ask: Ask, *, namespace: str, resource: str, image: str, priority_class: str = "",
                    avoid: tuple[str, ...] = ()) -> dict[str, object]:
    """The pod for `ask`: asks `resource: cards` with the class's node selector, tolerates every
    taint (GPU pools are usually tainted), and may be evicted at any time (it holds nothing).
    `avoid`: the `LABEL_NODE_ID` of the nodes whose cards the controller knows now (they could not
    take the claims); claims do not consume `resource`, so the scheduler would see their cards free
    and place the pod there instead of asking for a node. A label of ours, not `metadata.name`
    (matchFields) or `kubernetes.io/hostname`: Karpenter ignores a pod that uses either ("matchFields
    is not supported", "using label kubernetes.io/hostname is not allowed"), and a new node, without
    the label, satisfies NotIn for both kube-scheduler and Karpenter."""
    spec: dict[str, object] = {
        "containers": [{
            "name": "pause", "image": image,
            "resources": {"requests": {resource: str(ask.cards)}, "limits": {resource: str(ask.cards)}},
            "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 65535,
                                "capabilities": {"drop": ["ALL"]}},
        }],
        "tolerations": [{"operator": "Exists"}],
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "restartPolicy": "Always",
    }
    if ask.node_selector:
        spec["nodeSelector"] = dict(ask.node_selector)
    if avoid:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": LABEL_NODE_ID, "operator": "NotIn", "values": sorted(set(avoid))}]}]}}}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": ask.name, "namespace": namespace,
            "labels": {LABEL_NODE_REQUEST: "true", names.LABEL_CLASS: ask.class_name},
            "annotations": {
                ANNOTATION_FOR_CLAIMS: ",".join(ask.claims),
                # It holds nothing: never a reason to keep a node (Cluster Autoscaler reads it).
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
            },
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class PlaceholderState:
    """What the API server says of one placeholder pod."""

    name: str
    created: str
    node: str = ""
    """The node it landed on ("" while unscheduled)."""
    unschedulable: str = ""
    """The scheduler's message while it cannot be placed ("" when none)."""


def condition_for(ask: Ask, state: PlaceholderState | None, *, resource: str, namespace: str,
                  waited_s: float, give_up_s: float) -> tuple[str, str]:
    """(reason, message) of the NodeRequested condition of `ask`'s claims."""
    what = f"{resource}: {ask.cards}" + (
        f" on a node with {', '.join(f'{k}={v}' for k, v in ask.node_selector)}" if ask.node_selector else "")
    asked = f"asked the node autoscaler for a node: placeholder pod {namespace}/{ask.name} asks {what}"
    if state is not None and state.node:
        return REASON_NODE_REQUESTED, f"{asked}; node {state.node} came for it; waiting for its agent's GPUs"
    if waited_s >= give_up_s:
        said = f"; the scheduler says: {state.unschedulable}" if state is not None and state.unschedulable else ""
        return REASON_NODE_NOT_PROVISIONED, (
            f"{asked}; no node came in {waited_s:.0f}s: the node pool may be at its limit, the instance type"
            f" unavailable, or no pool offers {resource} with this node selector{said}; the request stays open")
    return REASON_NODE_REQUESTED, asked


def by_claim(found: Sequence[Ask]) -> Mapping[str, Ask]:
    """Each claim's placeholder."""
    return {claim: ask for ask in found for claim in ask.claims}
