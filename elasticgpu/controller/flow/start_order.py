"""Which keys a start's first list may leave to the settled walk (issue 49 item 2: CPU at rest).

A fresh process (or a standby about to lead) lists the cluster and used to sync every key once,
none being settled yet (`flow/machinery/settled.py`): at 12,000 cards and 15,000 Bound claims
~42,000 syncs after "ready", at 40,000 / 50,000 ~140,000, each finding a Bound pair in order and
writing nothing. Here a claim or ElasticGPU is *in order at the start* when the pure decisions
its sync would run find nothing to do, read from the picture the first list built:

  - a claim: Bound, not being deleted, its bind in sync with its ElasticGPU (`binder.decide_claim`
    is `InSync`), its reservation held, no preemption plan left, not resizable (a resizable
    claim's size is the resizer's to check, so it is synced), its policing copy true to its
    class, of a class that does not recommend (`resizePolicy: Off`: the recommender's window of
    a claim and its per-claim series are built by a sync only) and showing no recommendation;
  - an ElasticGPU: Bound, not being deleted, kept (`binder.decide_elastic_gpu` is `Keep`) with
    its claim pointing back, held on the cards its spec names only, with the allocations naming
    its claim's uid.

Such a key starts settled, not verified (`SettledKeys.adopt`): the walk looks at it first, as
at any key settled longest ago. Everything else is synced as before: GPUs (readiness and the
heartbeat's timer are only known from a sync), pods, Pending, binding, deleting, Lost or Failed
objects, and any key whose check cannot tell. What only time changes (a recommendation's wait,
a quota's) starts from a usage event or a Pending claim, which are synced.
"""

from __future__ import annotations

from elasticgpu.controller.decisions import binder, bound_class, preemption
from elasticgpu.controller.flow.binding import policing_copy
from elasticgpu.controller.flow.machinery.workqueue import Key
from elasticgpu.controller.picture.picture import Picture


def in_order(picture: Picture, key: Key) -> bool:
    """Whether the sync of `key` would find nothing to do (see the module docstring); False for any
    kind but claims and ElasticGPUs."""
    with picture.lock:
        if key[0] == "claim" and len(key) == 3:
            return _claim_in_order(picture, key[1], key[2])
        if key[0] == "egpu" and len(key) == 2:
            return _egpu_in_order(picture, key[1])
    return False


def _claim_in_order(picture: Picture, namespace: str, name: str) -> bool:
    claim = picture.claim(namespace, name)
    if claim is None or claim.metadata.deletion_timestamp or not binder.is_bound(claim):
        return False
    view = picture.view()
    decision = binder.decide_claim(claim, view)
    if not isinstance(decision, binder.InSync):
        return False
    egpu = picture.egpu(decision.elastic_gpu)
    if egpu is None or not picture.ledger.held(decision.elastic_gpu):
        return False
    classes = view.classes
    if bound_class.resizable(claim, egpu, classes) or claim.status.resizable:
        return False
    if preemption.plan_of(claim) is not None:
        return False
    klass = bound_class.class_of(claim, egpu, classes)
    want = policing_copy.wanted(claim, egpu, classes)
    if want is not None and want != policing_copy.shown(claim):
        return False
    if klass is not None and policing_copy.wanted_privileged(claim, egpu, classes) != (
            claim.status.allow_privileged or None):
        return False
    # The recommender's window of a claim and its per-claim series (sizes, usage, recommendation) are
    # this process's memory, built by a sync only: a claim whose class recommends is synced.
    return klass is not None and klass.resize_policy == "Off" and claim.status.recommendation is None


def _egpu_in_order(picture: Picture, name: str) -> bool:
    egpu = picture.egpu(name)
    if egpu is None or egpu.metadata.deletion_timestamp or egpu.status.phase != "Bound":
        return False
    ref = egpu.spec.claim_ref
    if ref is None or not ref.name or not ref.uid:
        return False
    claim = picture.claim(ref.namespace or "", ref.name)
    if claim is None or not binder.points_to(egpu, claim) or claim.spec.elastic_gpu_name != name:
        return False
    ledger = picture.ledger
    held = ledger.gpus_holding(name)
    cards = set(binder.cards_of(egpu))
    if not held or (cards and any(g not in cards for g in held)):
        return False
    for gpu_name in held:
        allocation = ledger.allocation(gpu_name, name)
        if allocation is None or allocation.claim_ref is None or allocation.claim_ref.uid != ref.uid:
            return False  # `Commit.stamp_claim_ref` would write
    decision = binder.decide_elastic_gpu(egpu, claim=claim, gpus=ledger.gpu, held=ledger.held(name),
                                         conflict=ledger.conflict)
    return isinstance(decision, binder.Keep)
