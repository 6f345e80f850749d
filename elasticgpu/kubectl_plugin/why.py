"""`kubectl egpu why CLAIM`: why a claim is where it is, and for a Pending one what it lacks.

The phase, reason and message are the controller's, read from the claim. For a Pending claim
of a dynamic class the plugin asks the allocator (`elasticgpu.plan`, the same code and policy
the controller binds with) where the claim would go in the cluster as it is now: nowhere, and
then the closest card and what it lacks; or somewhere, and then what the claim still waits for.
"""

from __future__ import annotations

import argparse

from elasticgpu import plan
from elasticgpu.api import ElasticGPUClaim
from elasticgpu.kubectl_plugin import cluster

WAIT_FOR_CONSUMER = "WaitForFirstConsumer"


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


def _placement(view: cluster.Cluster, claim: ElasticGPUClaim) -> list[str]:
    """Where the allocator would put the claim now, or the closest card and what it lacks."""
    found = plan.PlanInput(gpus=view.gpus(), node_list=[], classes=view.classes(), claims=[claim],
                           node_labels=view.node_labels())
    # The claim's own class decides the policy, model and nodes, exactly as in the controller.
    [result] = plan.plan(found)
    classes = {c.metadata.name: c for c in found.classes if c.metadata.name}
    gpu_class = plan.class_for(claim, classes)
    lines = [f"  request:  {result.request} (class {result.class_name or '-'})"]
    if result.placement is None:
        lines.append(f"  lacks:    {result.message}")
        return lines
    lines.append(f"  fits now: {result.placement.describe()}")
    if gpu_class is not None and gpu_class.effective_binding_mode == WAIT_FOR_CONSUMER:
        lines.append("  waits:    for a pod that uses it (WaitForFirstConsumer): the controller binds it when"
                     " that pod is placed; see the pod's Events")
    else:
        lines.append("  waits:    for the controller's next sync (is it running? kubectl get pods -A -l"
                     " app.kubernetes.io/name=elasticgpu)")
    return lines


def explain(view: cluster.Cluster, claim: ElasticGPUClaim) -> list[str]:
    """The lines `why` prints for `claim`."""
    lines = _lines_of_status(claim)
    if (claim.status.phase or "Pending") != "Pending":
        return lines
    if claim.spec.elastic_gpu_name:
        return lines + _static(view, claim)
    return lines + _placement(view, claim)


def run(args: argparse.Namespace, view: cluster.Cluster) -> int:
    """Print why; exit 0 (the answer is the output, not the exit code)."""
    for line in explain(view, view.claim(args.claim)):
        print(line)
    return 0

