"""The Event that tells a translated pod where its cards are: pure, no I/O.

A pod whose GPU resources the webhook translated (annotation `elasticgpu.io/translated`) was
written by someone who never named a claim; `kubectl describe pod` is where they look. When its
gate is lifted the pod sync posts one Normal Event `CardsAssigned` on it, naming per container
the claim, the card uuid(s), the size and the node. The Event's name derives from the pod's uid,
so a second post (a retry, a restart, the other controller) is refused by the API server (409)
and the pod has exactly one. A pod whose author wrote the annotations gets no Event: its cost
stays one write per pod (bench/translation.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elasticgpu.api import names

REASON_CARDS_ASSIGNED = "CardsAssigned"
_MAX_NAME = 253
"""An Event's name is a DNS-1123 subdomain."""


@dataclass(frozen=True)
class ContainerCards:
    """What one container of the pod got: its claim, its cards' uuids and the claim's size."""

    container: str
    claim: str
    uuids: tuple[str, ...]
    capacity: Mapping[str, Any]
    """The claim's `status.capacity` (what its bound ElasticGPU gives)."""


def is_translated(pod: Mapping[str, Any]) -> bool:
    """True when the webhook translated the pod's GPU resources (it carries the record)."""
    return bool(((pod.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_TRANSLATED))


def event_name(pod: Mapping[str, Any]) -> str:
    """The Event's name: one per pod incarnation (its uid), so a second create is a 409."""
    meta = pod.get("metadata") or {}
    suffix = f".cards-{meta.get('uid', '')}"
    # Cut to fit; a label may not end in '-' or '.' (a pod's name may hold both).
    return f"{str(meta.get('name', ''))[:_MAX_NAME - len(suffix)].rstrip('-.')}{suffix}"


def size_text(capacity: Mapping[str, Any]) -> str:
    """A claim's size for people: `1 card`, `2 cards`, `30% cores, 3000Mi memory`."""
    cards = capacity.get(names.RESOURCE_NVIDIA_GPU)
    if cards is not None:
        return f"{cards} card{'' if str(cards) == '1' else 's'}"
    parts = []
    if capacity.get(names.RESOURCE_CORE) is not None:
        parts.append(f"{capacity[names.RESOURCE_CORE]}% cores")
    if capacity.get(names.RESOURCE_MEMORY) is not None:
        parts.append(f"{capacity[names.RESOURCE_MEMORY]} memory")
    return ", ".join(parts) or "size unknown"


def message(node: str, containers: Sequence[ContainerCards]) -> str:
    """`on node N: container main: claim vllm-main, 1 card on GPU-...; container warm: ...`."""
    said = "; ".join(f"container {c.container}: claim {c.claim}, {size_text(c.capacity)}"
                     f" on {', '.join(c.uuids) or 'cards not known yet'}" for c in containers)
    return f"on node {node}: {said}"
