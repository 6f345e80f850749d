"""The pure part of a translated pod's `CardsAssigned` Event (no server): its fixed name and its message."""

from __future__ import annotations

import re
import uuid

from hypothesis import example, given
from hypothesis import strategies as st

from elasticgpu.api import names
from elasticgpu.controller.decisions import cards_assigned

LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"^{LABEL}(\.{LABEL})*$")
"""Kubernetes' own rule for object names (IsDNS1123Subdomain)."""
POD_NAMES = st.from_regex(r"\A[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z").filter(lambda n: DNS_SUBDOMAIN.match(n))


@given(name=POD_NAMES, uid=st.uuids())
@example(name="a" * 209 + "-" + "b" * 40, uid=uuid.UUID(int=7))  # cut right after a '-'
def test_the_event_name_is_one_per_pod_and_a_valid_name(name: str, uid: object) -> None:
    """Fixed for one pod incarnation (a second create is a 409), different for the next one of the same name,
    and always a valid Event name, however long the pod's."""
    pod = {"metadata": {"name": name, "uid": str(uid)}}
    first = cards_assigned.event_name(pod)
    assert first == cards_assigned.event_name({"metadata": {"name": name, "uid": str(uid)}})
    assert len(first) <= 253 and DNS_SUBDOMAIN.match(first), first
    assert first.endswith(f".cards-{uid}")
    assert cards_assigned.event_name({"metadata": {"name": name, "uid": f"{uid}0"}}) != first


def test_only_translated_pods_get_it() -> None:
    assert cards_assigned.is_translated({"metadata": {"annotations": {names.ANNOTATION_TRANSLATED: "{}"}}})
    assert not cards_assigned.is_translated({"metadata": {"annotations": {f"{names.ANNOTATION_INLINE_REQUEST_PREFIX}m":
                                                                          "gpu=1"}}})
    assert not cards_assigned.is_translated({"metadata": {}})


def test_the_message_names_per_container_claim_size_cards_and_node() -> None:
    containers = [
        cards_assigned.ContainerCards("main", "vllm-main", ("GPU-A", "GPU-B"), {names.RESOURCE_NVIDIA_GPU: 2}),
        cards_assigned.ContainerCards("warm", "vllm-warm", ("GPU-C",),
                                      {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "3000Mi"}),
        cards_assigned.ContainerCards("side", "vllm-side", (), {}),
    ]
    assert cards_assigned.message("n1", containers) == (
        "on node n1: container main: claim vllm-main, 2 cards on GPU-A, GPU-B;"
        " container warm: claim vllm-warm, 30% cores, 3000Mi memory on GPU-C;"
        " container side: claim vllm-side, size unknown on cards not known yet")
    assert cards_assigned.size_text({names.RESOURCE_NVIDIA_GPU: 1, names.RESOURCE_CORE: 100}) == "1 card"
