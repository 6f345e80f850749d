"""The pods of `elasticgpu plan`'s input: Pods, and the pod templates of workloads.

A pod given to plan gets the admission webhook's own checks (`api.pod_claims.read_pod_claims`,
the function the webhook calls, and its refusal of `spec.nodeName`), and one more that only an
offline tool holding the whole input can make: every claim a pod names is in the input, in the
pod's namespace (on a cluster such a pod would wait, gated, until someone creates the claim).
A problem is a `PodInvalid` naming the object, the annotation and the fix.

A workload (Deployment, StatefulSet, ReplicaSet, Job, CronJob) stands for as many pods as it
runs at once (`replicas`, a Job's `parallelism`, default 1); each is named `<workload>-<n>` here
(a StatefulSet's own names; a Deployment's are random on a cluster). An inline request
(`elasticgpu.io/request.<container>`) becomes the claim the controller would make for each of
those pods (`inline_claim_name`), planned after the claims of the files, as the controller meets
them once the pods exist. A DaemonSet's pods are one per node: they are checked, not planned.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elasticgpu.api import ElasticGPUClaim, names, pod_claims
from elasticgpu.api.errors import ElasticGPUError, InvalidPodClaims

POD_KIND = "Pod"
# kind -> the path to its pod template, and the field that says how many pods run at once.
TEMPLATES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "Deployment": (("spec", "template"), "replicas"),
    "StatefulSet": (("spec", "template"), "replicas"),
    "ReplicaSet": (("spec", "template"), "replicas"),
    "Job": (("spec", "template"), "parallelism"),
    "CronJob": (("spec", "jobTemplate", "spec", "template"), "parallelism"),
    "DaemonSet": (("spec", "template"), None),
}
KINDS = frozenset({POD_KIND, *TEMPLATES})
"""The kinds of pods and workloads plan reads."""
MAX_PODS = 1000
"""Replicas above this are refused: plan binds in memory, one claim per pod."""


class PodInvalid(ElasticGPUError):
    """A pod (or a workload's pod template) the webhook would refuse, or one naming a claim the input lacks."""


@dataclass(frozen=True)
class InputPods:
    """One Pod or workload of the input: the pods it stands for and the claims they use."""

    where: str
    """The file, document and object, for messages."""
    namespace: str
    pod_names: tuple[str, ...]
    """Empty for a DaemonSet (one pod per node: checked, not planned)."""
    claims: pod_claims.PodClaims


def read(doc: Mapping[str, Any], where: str) -> InputPods:
    """The pods of one Pod or workload document; raises `PodInvalid` with the webhook's words."""
    kind = str(doc.get("kind"))
    metadata = doc.get("metadata") or {}
    # A generateName gets a random suffix on a cluster; `0` stands for it here.
    name = str(metadata.get("name") or (f"{metadata['generateName']}0" if metadata.get("generateName") else ""))
    namespace = str(metadata.get("namespace") or "default")
    count: int | None = 1
    if kind == POD_KIND:
        pod, field = doc, ""
    else:
        path, count_field = TEMPLATES[kind]
        pod = _at(doc, path)
        field = ".".join(path) + "."
        count = _count(doc, count_field, kind)
    try:
        used = pod_claims.parse_pod_claims(
            (pod.get("metadata") or {}).get("annotations") or {}, containers=pod_claims.container_names(pod))
    except InvalidPodClaims as error:
        raise PodInvalid("; ".join(f"{field}{problem}" for problem in error.problems)) from None
    if not used.is_empty and (pod.get("spec") or {}).get("nodeName"):
        raise PodInvalid(f"{field}spec.nodeName: a pod that uses claims is placed on the node of its claims;"
                         " remove spec.nodeName (use a nodeSelector or node affinity to restrict the nodes)")
    if kind == POD_KIND:
        pods: tuple[str, ...] = (name,)
    elif count is None:
        pods = ()
    else:
        pods = tuple(f"{name}-{index}" for index in range(count))
    return InputPods(where=where, namespace=namespace, pod_names=pods, claims=used)


def _at(doc: Mapping[str, Any], path: tuple[str, ...]) -> Mapping[str, Any]:
    value: Any = doc
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    if not isinstance(value, Mapping):
        raise PodInvalid(f"{'.'.join(path)}: required (the pod template)")
    return value


def _count(doc: Mapping[str, Any], field: str | None, kind: str) -> int | None:
    if field is None:
        return None
    spec = doc.get("spec") or {}
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    value = spec.get(field, 1)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_PODS:
        raise PodInvalid(f"spec.{field}: must be a whole number from 0 to {MAX_PODS} for plan")
    return value


def inline_claims(found: Iterable[InputPods]) -> list[ElasticGPUClaim]:
    """The claims the controller would make for the inline requests of the pods, in input order."""
    out = []
    for entry in found:
        for pod in entry.pod_names:
            for request in entry.claims.inline:
                out.append(ElasticGPUClaim.model_validate({
                    "metadata": {"name": request.claim_name(pod), "namespace": entry.namespace},
                    "spec": request.spec.to_dict(),
                }))
    return out


def consumed_claims(found: Iterable[InputPods]) -> set[tuple[str, str]]:
    """(namespace, name) of every claim a pod of the input uses, inline ones included: the first
    consumer a WaitForFirstConsumer claim waits for."""
    used: set[tuple[str, str]] = set()
    for entry in found:
        used.update((entry.namespace, reference.claim_name) for reference in entry.claims.references)
        used.update((entry.namespace, request.claim_name(pod)) for pod in entry.pod_names
                    for request in entry.claims.inline)
    return used


def shared_claim_notes(found: Iterable[InputPods]) -> list[str]:
    """A note for each workload whose pods all name one claim: a claim serves one pod at a time (as a
    ReadWriteOnce volume), so all but one of them would wait; not an error, as on a cluster."""
    notes = []
    for entry in found:
        if len(entry.pod_names) > 1 and entry.claims.references:
            named = ", ".join(sorted({r.claim_name for r in entry.claims.references}))
            notes.append(f"note: {entry.where}: its {len(entry.pod_names)} pods all name claim(s) {named}, which serve"
                         " one pod at a time: the others would wait; an inline request"
                         " (elasticgpu.io/request.<container>) gives each pod a claim of its own")
    return notes


def check_references(found: Iterable[InputPods], claims: Iterable[ElasticGPUClaim]) -> None:
    """Raise `PodInvalid` for the first pod naming a claim the input does not hold in its namespace."""
    by_namespace: dict[str, set[str]] = {}
    for claim in claims:
        by_namespace.setdefault(claim.metadata.namespace or "default", set()).add(claim.metadata.name or "")
    for entry in found:
        there = by_namespace.get(entry.namespace, set())
        for reference in entry.claims.references:
            if reference.claim_name in there:
                continue
            close = difflib.get_close_matches(reference.claim_name, sorted(there), n=1)
            meant = f" (did you mean {close[0]}?)" if close else ""
            key = names.claim_annotation(reference.container)
            raise PodInvalid(
                f"{entry.where}: {pod_claims.annotation_field(key)}: claim {entry.namespace}/{reference.claim_name}"
                f" is not in the input{meant}; on a cluster the pod would wait for it, gated: add the claim's"
                " manifest with -f, or fix the name")
