"""`kubectl egpu release --force EGPU`: an admin frees a reservation its node's agent still reports in use.

The controller keeps a released ElasticGPU's reservation while the node's agent lists its claim in
the GPU's `status.runningClaims` (the containers may still use the card), and stops believing that
list on its own when the Node is deleted or the agent is silent for
`ELASTICGPU_RUNNING_CLAIMS_EXPIRE_S` (5 minutes). For the cases in between (a node that is down
but not deleted, an agent that still beats but is wrong) this command sets the annotation
`elasticgpu.io/force-release: "true"` on the ElasticGPU: the controller then frees the reservation
whatever the agent reports.

The risk, printed every time: if those containers do still run, the card can be given to another
claim while they use it (two workloads on one card, beyond its memory or its share of compute).
Without `--force` the command only says what it would do.
"""

from __future__ import annotations

import argparse

from elasticgpu import user_errors
from elasticgpu.api import ElasticGPU, names
from elasticgpu.kubectl_plugin import cluster

RISK = (
    "risk: if those containers still run, the card can be given to another claim while they use it"
    " (two workloads on one card, beyond its memory or compute share); use it only when the node is gone"
    " or its pods are known to have stopped"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `release`."""
    parser.add_argument("elastic_gpu", metavar="ELASTICGPU", help="name of the ElasticGPU (kubectl get egpu)")
    parser.add_argument("--force", action="store_true",
                        help="free its reservation even while its node's agent reports its claim running")


def _holders(egpu: ElasticGPU) -> str:
    """What keeps it, as the controller's ReleasePending condition says ("" when nothing does)."""
    pending = next((c for c in egpu.status.conditions if c.type == "ReleasePending" and c.status == "True"), None)
    return pending.message.split(", as its agent reports", 1)[0] if pending is not None else ""


def run(args: argparse.Namespace, view: cluster.Cluster) -> int:
    """Set the force-release annotation on the ElasticGPU (with --force), saying what it does and its risk."""
    name = str(args.elastic_gpu)
    egpu = view.elastic_gpu(name)
    if egpu is None:
        raise user_errors.UserError(f"ElasticGPU {name} not found: check the name (kubectl get egpu)")
    held = _holders(egpu)
    what = (f"ElasticGPU {name} ({egpu.status.phase or 'no phase'}): the controller frees its reservation"
            f" whatever the agent reports" + (f" ({held})" if held else ""))
    if not args.force:
        print(f"would set {names.ANNOTATION_FORCE_RELEASE}=true: {what}")
        print(RISK)
        print("nothing done: add --force to do it")
        return 1
    view.annotate_elastic_gpu(name, {names.ANNOTATION_FORCE_RELEASE: "true"})
    print(f"{names.ANNOTATION_FORCE_RELEASE}=true set: {what}")
    print(RISK)
    if egpu.status.phase not in ("Released", "Failed"):
        print(f"note: it is {egpu.status.phase or 'not released'}: the annotation acts once its claim is deleted"
              " (or it fails)")
    return 0
