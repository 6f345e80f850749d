"""A translated pod's one `CardsAssigned` Event, posted as its gate is lifted (`cards_assigned`).

Posted before the lift: a crash between the two repeats the post on the next sync, where the
Event's fixed name (from the pod's uid) makes it a 409 that `create_event` drops; after the lift
the pod is no longer synced, so the Event is never lost to a restart and never doubled.
"""

from __future__ import annotations

from elasticgpu.api import pod_claims
from elasticgpu.controller.decisions import binder, cards_assigned
from elasticgpu.controller.flow.machinery.events import NORMAL, EventRecorder
from elasticgpu.controller.picture.picture import Body, Picture


def post(events: EventRecorder, picture: Picture, pod: Body, used: pod_claims.PodClaims, node: str) -> None:
    """Post the Event on `pod` (with kind and apiVersion) from its claims as the picture holds them."""
    meta = pod["metadata"]
    namespace = meta.get("namespace", "")
    containers = []
    with picture.lock:
        for container, claim_name in used.claims_by_container(meta.get("name", "")).items():
            claim = picture.claim(namespace, claim_name)
            egpu = picture.egpu(claim.spec.elastic_gpu_name or "") if claim is not None else None
            uuids = []
            for card in binder.cards_of(egpu) if egpu is not None else []:
                gpu = picture.ledger.gpu(card)
                uuids.append(gpu.spec.uuid if gpu is not None else card)  # GPU objects are named by uuid
            containers.append(cards_assigned.ContainerCards(
                container=container, claim=claim_name, uuids=tuple(uuids),
                capacity=dict(claim.status.capacity) if claim is not None else {}))
    events.record(pod, type_=NORMAL, reason=cards_assigned.REASON_CARDS_ASSIGNED,
                  message=cards_assigned.message(node, containers), event_name=cards_assigned.event_name(pod))
