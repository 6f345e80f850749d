"""`kubectl egpu why CLAIM`: why a claim is where it is, and for a Pending one what it lacks.

The phase, reason and message are the controller's, read from the claim. For a Pending claim
of a dynamic class the plugin asks `elasticgpu.plan` (which decides through the controller's own
decisions, `controller.decisions.binder` and `capacity`, and its allocator) what the controller
would decide in the cluster as it is now: a request or class to fix (InvalidRequest, ClassNotFound,
...), a card that can never hold it (NeverFits), no room now (the closest card and what it lacks),
or a place, and then what the claim still waits for.
"""

from __future__ import annotations

import argparse
from typing import Any

from elasticgpu import plan
from elasticgpu.api import ElasticGPUClaim, ElasticGPUError
from elasticgpu.api.pod_claims import read_pod_claims
from elasticgpu.kubectl_plugin import cluster

WAIT_FOR_CONSUMER = "WaitingForFirstConsumer"
"""The reason of a claim whose class binds when a pod first uses it (the binder's word)."""
CLAIMS_READY = "elasticgpu.io/ClaimsReady"
"""The pod condition the controller writes (`controller.decisions.pod_gate`; the plugin imports no
controller code): why a pod that uses claims is still gated."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `why`."""
    parser.add_argument("claim", metavar="CLAIM", help="name of the ElasticGPUClaim (in -n NAMESPACE)")


def _lines_of_status(claim: ElasticGPUClaim) -> list[str]:
    status = claim.status
    phase = status.phase or "Pending"
    lines = [f"ElasticGPUClaim {claim.metadata.namespace}/{claim.metadata.name}: {phase}"
             + (f" ({status.reason})" if status.reason else "")]
    if status.message:
        lines.append(f"  message:  {status.message}")
    if phase == "Bound":
        lines.append(f"  bound to: ElasticGPU {claim.spec.elastic_gpu_name} on node {status.node_name},"
                     f" cards {', '.join(status.gpus) or '-'}")
    for condition in status.conditions:
        if condition.status == "True" and condition.type not in (phase, "Bound"):
            lines.append(f"  condition {condition.type}: {condition.reason} {condition.message}".rstrip())
    return lines


def _static(view: cluster.Cluster, claim: ElasticGPUClaim) -> list[str]:
    """A claim that names its ElasticGPU waits for that one: say how it is."""
    name = claim.spec.elastic_gpu_name or ""
    egpu = view.elastic_gpu(name)
    if egpu is None:
        return [f"  static:   it names ElasticGPU {name}, which does not exist: create it, or clear"
                " spec.elasticGPUName to let a class provision one"]
    state = egpu.status.phase or "Pending"
    why = f" ({egpu.status.reason}: {egpu.status.message})" if egpu.status.reason else ""
    return [f"  static:   it names ElasticGPU {name}, which is {state}{why}"]


CAPACITY_REASONS = frozenset({"NoCapacity", "NeverFits", "QuotaExceeded"})
"""Reasons that say what the claim lacks (room, a large enough card, quota); the others name a
mistake to fix (the request, the class) or what the claim waits for."""


def _placement(view: cluster.Cluster, claim: ElasticGPUClaim) -> list[str]:
    """The controller's verdict on the claim in the cluster as it is now (`plan`, which decides
    through the controller's own decisions): where it would go, what it lacks, or what to fix."""
    found = plan.PlanInput(gpus=view.gpus(), node_list=[], classes=view.classes(), claims=[claim],
                           node_labels=view.node_labels())
    [result] = plan.plan(found)
    lines = [f"  request:  {result.request} (class {result.class_name or '-'})"]
    fits = result.placement or result.would_fit
    if fits is None:
        label = "lacks" if result.reason in CAPACITY_REASONS else "cause"
        lines.append(f"  {label}:{' ' * (9 - len(label))}{result.message}")
        return lines
    lines.append(f"  fits now: {fits.describe()}")
    if result.reason == WAIT_FOR_CONSUMER:
        lines.append("  waits:    for a pod that uses it (WaitForFirstConsumer): the controller binds it when"
                     " that pod is placed; see the pod's Events")
    else:
        lines.append("  waits:    for the controller's next sync (is it running? kubectl get pods -A -l"
                     " app.kubernetes.io/name=elasticgpu)")
    return lines


def _uses(pod: dict[str, Any], claim: str) -> bool:
    try:
        return claim in read_pod_claims(pod).claim_names(str((pod.get("metadata") or {}).get("name", "")))
    except ElasticGPUError:
        return False  # annotations the webhook would refuse: that pod's own condition says so


def _pods(view: cluster.Cluster, claim: ElasticGPUClaim) -> list[str]:
    """The pods that use the claim, with their ClaimsReady condition (WaitForFirstConsumer: a pod
    that cannot be placed keeps its claims Pending, and only the pod says why)."""
    lines = []
    for pod in view.pods_using_claims():
        if not _uses(pod, claim.metadata.name or ""):
            continue
        name = (pod.get("metadata") or {}).get("name")
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == CLAIMS_READY), None)
        if ready is None:
            lines.append(f"  pod {name}: no {CLAIMS_READY} condition yet")
        else:
            lines.append(f"  pod {name}: {CLAIMS_READY}={ready.get('status')} ({ready.get('reason')})"
                         f" {ready.get('message') or ''}".rstrip())
    return lines


def explain(view: cluster.Cluster, claim: ElasticGPUClaim) -> list[str]:
    """The lines `why` prints for `claim`."""
    lines = _lines_of_status(claim)
    if (claim.status.phase or "Pending") != "Pending":
        return lines
    if claim.spec.elastic_gpu_name:
        return lines + _static(view, claim) + _pods(view, claim)
    return lines + _placement(view, claim) + _pods(view, claim)


def run(args: argparse.Namespace, view: cluster.Cluster) -> int:
    """Print why; exit 0 (the answer is the output, not the exit code)."""
    for line in explain(view, view.claim(args.claim)):
        print(line)
    return 0

