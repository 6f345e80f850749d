"""Keeping node autoscalers from removing a node under a claim, and only then.

A node whose cards hold a reservation (a Bound claim, or one reserved for a pod on its way) gets
the annotations both autoscalers honour on a Node: Karpenter's `karpenter.sh/do-not-disrupt`
(no consolidation, drift or expiry while it is there) and Cluster Autoscaler's
`cluster-autoscaler.kubernetes.io/scale-down-disabled`. A node whose cards hold nothing loses
them again, so an idle GPU node can go (our agent is a DaemonSet pod, which neither autoscaler
counts; GPU objects name their Node as owner without blocking its deletion; no finalizer of ours
is on a Node).

An annotation an admin set is never removed: `elasticgpu.io/protects` records which of the two
the controller added, and only those are taken away.

Pure: takes a Node's annotations, returns the merge patch of its metadata (or None).
"""

from __future__ import annotations

from collections.abc import Mapping

PROTECTING = {
    "karpenter.sh/do-not-disrupt": "true",
    "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
}
ANNOTATION_PROTECTS = "elasticgpu.io/protects"
"""On a Node: the protecting annotations the controller added (comma-separated), so that it
removes only those."""


def patch(annotations: Mapping[str, str], *, held: bool) -> dict[str, dict[str, str | None]] | None:
    """The annotations patch for a node whose cards hold a reservation (`held`) or not; None when
    it already says what it should."""
    ours = [k for k in (annotations.get(ANNOTATION_PROTECTS) or "").split(",") if k in PROTECTING]
    if held:
        missing = {k: v for k, v in PROTECTING.items() if k not in annotations}
        if not missing:
            return None
        added = sorted({*ours, *missing})
        return {"annotations": {**missing, ANNOTATION_PROTECTS: ",".join(added)}}
    if not ours and ANNOTATION_PROTECTS not in annotations:
        return None
    removed: dict[str, str | None] = {k: None for k in ours}
    removed[ANNOTATION_PROTECTS] = None
    return {"annotations": removed}
