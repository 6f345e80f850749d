"""Whether a pod may join the pods already on one node: what the scheduler's NodePorts and
InterPodAffinity plugins would refuse there. Pure functions over pod bodies; no I/O.

When the controller chooses the node of a pod's WaitForFirstConsumer claims, it pins the pod
there (required node affinity). A node the scheduler then refuses for the pod's neighbours would
leave it Pending for good: two replicas of a Deployment with a required anti-affinity on
`kubernetes.io/hostname` would both be pinned to the node the allocator packs onto. So the pod
sync rules such a node out, as it does one without CPU.

Checked against the pods of the one node (the pod sync lists them, and adds those it pinned
there itself that the scheduler has not bound yet):
- host ports: the same protocol and port, on the same host IP or either on all addresses;
- the pod's required anti-affinity terms whose topology is the node itself: no pod there may
  match; and the required anti-affinity terms of the pods there: the pod may not match them;
- the pod's required affinity terms whose topology is the node itself: a pod there matches, or
  (the scheduler's rule for the first pod of a group) the pod matches its own term.
A term over a wider topology (a zone) needs the pods of every node in it: it is left to the
scheduler, as is a term with a non-empty namespaceSelector (namespace labels are not watched).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from elasticgpu.api import LabelSelector
from elasticgpu.controller.decisions import pod_gate
from elasticgpu.controller.decisions.binder import selector_matches

Body = Mapping[str, Any]
HOSTNAME = "kubernetes.io/hostname"
"""The topology key whose domain is one node: the only one the pods of a node decide."""


def fits_neighbours(pod: Body, node: str, others: Iterable[Body]) -> str:
    """Why `pod` cannot join the pods `others` on `node` (ports, required pod (anti-)affinity on
    the node's own topology), or "" when it can. Terminated pods and the pod itself are skipped."""
    here = [o for o in others if not pod_gate.is_terminated(o) and not _same_pod(o, pod)]
    clash = _port_clash(pod, here)
    if clash:
        return clash
    for term in _node_terms(pod, "podAntiAffinity"):
        match = next((o for o in here if _term_selects(term, owner=pod, target=o)), None)
        if match is not None:
            return (f"pod {_name(match)} on it matches the pod's required anti-affinity"
                    f" ({_describe(term)}, topologyKey {HOSTNAME})")
    for other in here:
        for term in _node_terms(other, "podAntiAffinity"):
            if _term_selects(term, owner=other, target=pod):
                return f"pod {_name(other)} on it has a required anti-affinity that matches the pod ({_describe(term)})"
    for term in _node_terms(pod, "podAffinity"):
        if not any(_term_selects(term, owner=pod, target=o) for o in here) and not _term_selects(
                term, owner=pod, target=pod):
            return f"no pod on it matches the pod's required affinity ({_describe(term)}, topologyKey {HOSTNAME})"
    return ""


# -- host ports -------------------------------------------------------------------------------


def _host_ports(pod: Body) -> list[tuple[str, str, int]]:
    """(protocol, host IP, port) of every host port of the pod's containers and sidecars."""
    spec = pod.get("spec") or {}
    containers = list(spec.get("containers") or [])
    containers += [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    found = []
    for container in containers:
        for port in container.get("ports") or []:
            number = port.get("hostPort") or 0
            if number:
                found.append((port.get("protocol") or "TCP", port.get("hostIP") or "0.0.0.0", int(number)))
    return found


def _port_clash(pod: Body, here: Sequence[Body]) -> str:
    wanted = _host_ports(pod)
    if not wanted:
        return ""
    for other in here:
        for protocol, address, number in _host_ports(other):
            for w_protocol, w_address, w_number in wanted:
                same_address = address == w_address or "0.0.0.0" in (address, w_address)
                if (protocol, number) == (w_protocol, w_number) and same_address:
                    return f"host port {w_number}/{w_protocol} is taken by pod {_name(other)} on it"
    return ""


# -- inter-pod affinity -------------------------------------------------------------------------


def _node_terms(pod: Body, kind: str) -> list[Mapping[str, Any]]:
    """The pod's required terms of `kind` (podAffinity, podAntiAffinity) on the node's topology."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    return [t for t in terms if t.get("topologyKey") == HOSTNAME]


def _term_selects(term: Mapping[str, Any], *, owner: Body, target: Body) -> bool:
    """True when `target` is in the term's namespaces and matches its label selector (with
    matchLabelKeys / mismatchLabelKeys taken from `owner`, the pod that carries the term)."""
    if not _in_namespaces(term, owner, target):
        return False
    raw = term.get("labelSelector")
    if raw is None:
        return False  # a null selector matches no pod
    owner_labels = (owner.get("metadata") or {}).get("labels") or {}
    expressions = list(raw.get("matchExpressions") or [])
    expressions += [{"key": k, "operator": "In", "values": [owner_labels[k]]}
                    for k in term.get("matchLabelKeys") or [] if k in owner_labels]
    expressions += [{"key": k, "operator": "NotIn", "values": [owner_labels[k]]}
                    for k in term.get("mismatchLabelKeys") or [] if k in owner_labels]
    try:
        selector = LabelSelector.model_validate({**raw, "matchExpressions": expressions})
    except ValidationError:
        return False  # the API server validated it; a shape we cannot read is left to the scheduler
    return selector_matches(selector, (target.get("metadata") or {}).get("labels") or {})


def _in_namespaces(term: Mapping[str, Any], owner: Body, target: Body) -> bool:
    namespace = (target.get("metadata") or {}).get("namespace", "")
    listed = set(term.get("namespaces") or [])
    chooser = term.get("namespaceSelector")
    if chooser is None:
        return namespace in (listed or {(owner.get("metadata") or {}).get("namespace", "")})
    if not chooser.get("matchLabels") and not chooser.get("matchExpressions"):
        return True  # {}: every namespace
    return namespace in listed  # by namespace labels: not known here, left to the scheduler


def _same_pod(a: Body, b: Body) -> bool:
    ma, mb = a.get("metadata") or {}, b.get("metadata") or {}
    if ma.get("uid") and mb.get("uid"):
        return bool(ma["uid"] == mb["uid"])
    return (ma.get("namespace"), ma.get("name")) == (mb.get("namespace"), mb.get("name"))


def _name(pod: Body) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _describe(term: Mapping[str, Any]) -> str:
    selector = term.get("labelSelector") or {}
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    parts += [f"{e.get('key')} {e.get('operator')} {','.join(e.get('values') or [])}".rstrip()
              for e in selector.get("matchExpressions") or []]
    return "labels " + (", ".join(parts) if parts else "(any)")
