"""Node autoscaling: the placeholder pods that ask Karpenter or Cluster Autoscaler for GPU nodes,
the claims' `NodeRequested` condition, and the annotations that keep a node holding claims.

One pass every `AutoscaleSettings.interval_s` (level-based: a pass decides from what the picture
and the API server hold now, so a crash or a lost write is repaired by the next one):

1. The claims that wait for capacity (`NoCapacity`; `GroupDoesNotFit` for a claim group;
   `FailedClaimPlacement` for the WaitForFirstConsumer claims of a pod no node can take) and
   the placeholders they need (`decisions/node_requests.py`); placeholders no claim needs any
   more are deleted (their claims bound or went away), missing ones created. A placeholder that
   landed on a node is kept until its claims bind: the node's agent publishes its cards a moment
   after the node joins, and deleting it earlier would ask for a second node.
2. Each waiting claim's `NodeRequested` condition says which placeholder asks, and the node that
   came; after `give_up_s` without a node, `NodeNotProvisioned` with a Warning Event.
3. Nodes whose cards hold a reservation carry the autoscalers' do-not-remove annotations; the
   others lose the ones the controller added (`decisions/node_protection.py`).
Every failure is logged and retried at the next pass; the loop never dies.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from elasticgpu.api import InvalidClassParameters, InvalidRequest, names, timestamps
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, capacity, groups, node_protection, node_requests, pod_gate
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.claim_status import condition
from elasticgpu.controller.flow.machinery.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.settings import AutoscaleSettings

logger = logging.getLogger(__name__)

WAITING_FOR_CAPACITY = frozenset({binder.REASON_NO_CAPACITY, groups.REASON_GROUP_DOES_NOT_FIT,
                                  pod_gate.REASON_FAILED_PLACEMENT})
"""The reasons of claims a new node could help (not NeverFits, a quota's no, an invalid class);
`FailedClaimPlacement`: a WaitForFirstConsumer claim whose pod no node can take with its claims."""


class NodeAutoscaling:
    """See the module docstring."""

    def __init__(self, *, kube: KubeApi, picture: Picture, events: EventRecorder,
                 settings: AutoscaleSettings) -> None:
        self.kube = kube
        self.picture = picture
        self.events = events
        self.settings = settings
        self.asked = 0
        """Placeholders created since start (the benchmark's 'nodes asked for')."""

    def run(self, stop: threading.Event) -> None:
        """A pass every `interval_s` until `stop` is set; a failed pass is logged and retried."""
        while not stop.is_set():
            try:
                self.pass_once()
            except Exception as err:  # never a dead thread: the next pass decides again
                logger.warning("node autoscaling pass failed, retrying in %gs: %s", self.settings.interval_s, err,
                               exc_info=not isinstance(err, errors.ElasticGPUError))
            stop.wait(self.settings.interval_s)

    def pass_once(self, *, now: float | None = None) -> None:
        """One pass (see the module docstring); `now`: seconds since the epoch (tests move it)."""
        # Protection first: a placeholder is deleted once its claims bound on its node, and a node
        # that lost it looks empty to a consolidating autoscaler until it carries do-not-disrupt.
        if self.settings.protect_nodes:
            self._protect_nodes()
        if self.settings.enabled:
            self._placeholders(time.time() if now is None else now)

    # -- placeholders ---------------------------------------------------------------------------

    def waiters(self) -> list[node_requests.Waiter]:
        """The claims that wait for capacity a node of their class could give."""
        view = self.picture.view()
        default = view.default_class()
        found = []
        for claim in self.picture.waiting_claim_models():
            if claim.status.reason not in WAITING_FOR_CAPACITY or claim.metadata.deletion_timestamp:
                continue
            class_name = claim.spec.class_name or (default.metadata.name or "" if default is not None else "")
            klass = view.classes.get(class_name)
            if klass is None or klass.provisioner not in names.OWN_PROVISIONERS:
                continue
            try:
                parameters = klass.parsed_parameters()
                request = claim.spec.gpu_request()[0]
            except (InvalidClassParameters, InvalidRequest):
                continue  # its own condition says so; no node would help
            with self.picture.lock:
                memory = capacity.card_memory(self.picture.ledger.inventory, models=parameters.gpu_model,
                                              node_selector=parameters.node_selector)
            pod = ""
            if claim.status.reason == pod_gate.REASON_FAILED_PLACEMENT:
                # Its pod's claims must meet on one node: one placeholder for all of them.
                users = sorted(self.picture.pods_using(claim.metadata.namespace or "", claim.metadata.name or ""))
                if not users:
                    continue
                pod = f"{claim.metadata.namespace}/{users[0]}"
            found.append(node_requests.Waiter(
                namespace=claim.metadata.namespace or "", name=claim.metadata.name or "",
                uid=claim.metadata.uid or "", class_name=class_name, request=request,
                node_selector=tuple(sorted(parameters.node_selector.items())), card_memory_mib=memory,
                created=claim.metadata.creation_timestamp or "", pod=pod))
        return found

    def _placeholders(self, now: float) -> None:
        settings = self.settings
        waiters = self.waiters()
        wanted = {ask.name: ask for ask in node_requests.asks(waiters)}
        existing = {p["metadata"]["name"]: p for p in self.kube.list_labelled_pods(
            settings.namespace, f"{node_requests.LABEL_NODE_REQUEST}=true")}
        for name, pod in list(existing.items()):
            ask = wanted.get(name)
            terminating = bool(pod["metadata"].get("deletionTimestamp"))
            if ask is not None and _asks_cards(pod, settings.resource) == ask.cards and not terminating:
                continue
            # Its claims bound or went away (or its packing changed): it must not make a node. Grace 0:
            # it holds nothing, and on a node without a kubelet (KWOK, a node that died) nobody else
            # would end it. One being deleted (a drain evicted it) asks nothing: made again below.
            with contextlib.suppress(errors.NotFound, errors.Conflict):
                self.kube.delete_pod(settings.namespace, name, uid=pod["metadata"].get("uid"), grace_period_s=0)
            del existing[name]
            logger.info("placeholder pod %s/%s deleted: %s", settings.namespace, name,
                        "it was being deleted" if terminating and ask is not None else "no claim waits for it")
        states: dict[str, node_requests.PlaceholderState] = {}
        for name, ask in wanted.items():
            found = existing.get(name)
            if found is None or _asks_cards(found, settings.resource) != ask.cards:
                try:
                    found = self._create(ask)
                except errors.ApiError as err:  # one refused pod must not hold back the others' asks
                    logger.warning("placeholder pod %s/%s not created, retrying next pass: %s", settings.namespace,
                                   name, err)
                    continue
                if found is None:
                    continue
            states[name] = _state(found)
        asked_for = node_requests.by_claim(list(wanted.values()))
        for waiter in waiters:
            ask = asked_for.get(waiter.key)
            if ask is not None and ask.name in states:
                self._say(waiter, ask, states[ask.name], now)

    def _create(self, ask: node_requests.Ask) -> Body | None:
        settings = self.settings
        with self.picture.lock:
            # The nodes whose cards are known could not take the claims (they wait for capacity); only
            # those the pod could land on (its node selector's), to keep its spec small. A node whose
            # agent has not published yet is not avoided: it may be the one coming for these claims,
            # and avoiding it would ask for another.
            published = {node.record.name for node in self.picture.ledger.inventory.nodes() if node.cards}
            labels = {name: ((body.get("metadata") or {}).get("labels") or {})
                      for name, body in self.picture.pods.nodes().items() if name in published}
        avoid = [name for name, node_labels in labels.items()
                 if all(node_labels.get(k) == v for k, v in ask.node_selector)]
        for name in avoid:  # the label the pod keeps off by (node_requests.placeholder_pod says why)
            wanted = node_requests.node_id(name)
            if labels[name].get(node_requests.LABEL_NODE_ID) != wanted:
                try:
                    answer = self.kube.patch_node(name, {"metadata": {"labels": {node_requests.LABEL_NODE_ID: wanted}}})
                except errors.NotFound:
                    continue  # gone: no pod lands there
                with self.picture.lock:
                    self.picture.pods.put_node(answer)
        body = node_requests.placeholder_pod(ask, namespace=settings.namespace, resource=settings.resource,
                                             image=settings.image, priority_class=settings.priority_class,
                                             avoid=tuple(node_requests.node_id(name) for name in avoid))
        try:
            created = self.kube.create_pod(settings.namespace, body)
        except errors.AlreadyExists:
            return None  # made by the other controller or a pass before a lost answer: the next pass reads it
        self.asked += 1
        logger.info("asked the node autoscaler for a node with %s: %s for claim(s) %s", settings.resource,
                    ask.cards, ", ".join(ask.claims))
        return created

    def _say(self, waiter: node_requests.Waiter, ask: node_requests.Ask,
             state: node_requests.PlaceholderState, now: float) -> None:
        """Write the claim's NodeRequested condition (and an Event when its reason changes)."""
        claim = self.picture.claim(waiter.namespace, waiter.name)
        if claim is None:
            return
        created = timestamps.parse(state.created)
        waited = max(0.0, now - created.timestamp()) if created is not None else 0.0
        reason, message = node_requests.condition_for(
            ask, state, resource=self.settings.resource, namespace=self.settings.namespace, waited_s=waited,
            give_up_s=self.settings.give_up_s)
        current = next((c for c in claim.status.conditions if c.type == node_requests.CONDITION_NODE_REQUESTED), None)
        if current is not None and current.reason == reason and current.message == message:
            return
        wanted = condition(node_requests.CONDITION_NODE_REQUESTED, reason, message, claim.status.conditions)
        kept = [c.to_dict() for c in claim.status.conditions if c.type != node_requests.CONDITION_NODE_REQUESTED]
        patch = {"metadata": {"resourceVersion": claim.metadata.resource_version},
                 "status": {"conditions": [*kept, wanted]}}
        try:
            answer = self.kube.patch_claim_status(waiter.namespace, waiter.name, patch)
        except (errors.NotFound, errors.Conflict):
            return  # bound, changed or gone meanwhile: the next pass decides from what it finds
        self.picture.put_claim(answer)
        if current is None or current.reason != reason:
            kind = WARNING if reason == node_requests.REASON_NODE_NOT_PROVISIONED else NORMAL
            self.events.record(self.picture.claim_body(waiter.namespace, waiter.name) or answer, type_=kind,
                               reason=reason, message=message)

    # -- protection ----------------------------------------------------------------------------

    def _protect_nodes(self) -> None:
        with self.picture.lock:
            held = {node.record.name for node in self.picture.ledger.inventory.nodes()
                    if any(card.holders for card in node.cards)}
            nodes = self.picture.pods.nodes()
        for name, body in nodes.items():
            annotations = (body.get("metadata") or {}).get("annotations") or {}
            patch = node_protection.patch(annotations, held=name in held)
            if patch is None:
                continue
            try:
                answer = self.kube.patch_node(name, {"metadata": patch})
            except errors.NotFound:
                continue
            with self.picture.lock:
                self.picture.pods.put_node(answer)
            logger.info("node %s: %s", name, "protected from scale-down: its GPUs hold claims" if name in held
                        else "no claim on its GPUs: scale-down protection removed")


def _asks_cards(pod: Body, resource: str) -> int:
    """How many of `resource` a placeholder pod asks (0 when it is not one of ours as expected)."""
    containers: list[Any] = (pod.get("spec") or {}).get("containers") or []
    try:
        return int(((containers[0].get("resources") or {}).get("requests") or {}).get(resource, 0))
    except (IndexError, ValueError, AttributeError):
        return 0


def _state(pod: Body) -> node_requests.PlaceholderState:
    """What the server says of a placeholder: where it landed, or why it cannot."""
    status = pod.get("status") or {}
    unschedulable = next((c.get("message") or "" for c in status.get("conditions") or []
                          if c.get("type") == "PodScheduled" and c.get("status") == "False"), "")
    created = (pod.get("metadata") or {}).get("creationTimestamp") or datetime.now(UTC).isoformat()
    return node_requests.PlaceholderState(name=pod["metadata"]["name"], created=created,
                                          node=(pod.get("spec") or {}).get("nodeName") or "",
                                          unschedulable=unschedulable)
