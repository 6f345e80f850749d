"""The pod sync: a gated pod that uses claims, from its annotations to its gate lift.

One sync of a pod (on the worker thread, like every sync, so the picture never races itself):

1. inline claims of an earlier pod of the same name, or of a pod that is gone, are deleted
   (uid precondition; `inline_claims`);
2. a pod without our gate (lifted, or never gated) needs nothing more;
3. its annotations are read (`api.pod_claims`, the webhook's own parser); the inline claims it
   asks for are created (owned by the pod);
4. `pod_gate.decide_gate` says what is next, from the claims as the picture holds them:
   - Wait: the condition `elasticgpu.io/ClaimsReady=False` with the reason (written once per
     reason and message; a Warning Event with it when the pod cannot proceed by itself);
   - ReserveUsers: the pod is written into the claim's `status.users` with the claim's
     resourceVersion (of two pods, one wins; the other then sees ClaimInUse);
   - Place: WaitForFirstConsumer claims are bound on one node (`_place`);
   - Lift: node affinity and gate removal in one update guarded by the pod's resourceVersion;
     a translated pod first gets its one `CardsAssigned` Event (`cards_assigned`).

# WaitForFirstConsumer (`_place`)

`pod_placement` proposes a node that passes the pod's selectors and taints and takes all its
claims; the pod's CPU and memory are checked against that node's pods (one list), and a node
short of them is ruled out and the next proposal asked for. With more than one claim to place,
the chosen node is first written onto the pod (annotation `elasticgpu.io/selected-node`, with
the pod's resourceVersion): two controllers racing on one pod then agree on the node before
either reserves anything. Then every claim is reserved (the commit point of each, `Commit`);
if one fails, the ones reserved in this pass are freed again (all or none) and the pod retries.
The rest of each bind (ElasticGPU, claim) goes through `ClaimBinding.after_commit`; the claims'
watch events wake the pod, which then lifts its gate.

Crash cases: reserved, no ElasticGPU yet: the next sync finds the reservations held
(`Ledger.held`) and finishes them on their node; a pod deleted meanwhile leaves an orphan
reservation, which the resync frees after its grace. Gate lifted before the pod's condition was
set to True: the condition is cosmetic; the next change of the pod does not need it.
Reservations of one pod on two nodes (two controllers before the node was agreed): those whose
ElasticGPU does not exist yet are freed and placed again, beside the one whose ElasticGPU exists
(read live: the picture may lag the other controller's create), which is never freed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any

from elasticgpu.allocator import PlacementRequest
from elasticgpu.api import ElasticGPUClaim, names, pod_claims, timestamps
from elasticgpu.api.errors import InvalidPodClaims
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, cards_assigned, pod_gate, provisioned_names
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.claim_binding import ClaimBinding
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.binding.provisioner import claim_ref_of
from elasticgpu.controller.flow.machinery.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.flow.quota_guard import QuotaExceeded
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.picture import pod_index
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.pods import cards_event, inline_claims, pod_neighbours, pod_placement

logger = logging.getLogger(__name__)

DECISIONS_PER_SYNC = 4
"""Steps one sync may take in a row (reserve users, then lift): each write's answer is in the
picture at once, so the next step needs no watch event."""


class PodSync:
    """Syncs one pod at a time (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, events: EventRecorder,
                 commit: Commit, binding: ClaimBinding) -> None:
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.events = events
        self.commit = commit
        self.binding = binding
        """Finishes the binds of the pod's claims (after their commit point, or to an existing ElasticGPU)."""
        self.metrics: ControllerMetrics | None = None
        """Observes how long pods waited for their gate lift, when set (`attach_metrics`)."""

    def sync(self, namespace: str, name: str) -> bool:
        """Decide and carry out the next steps of one pod. True when it is not gated (or gone):
        nothing pending, the periodic resync may leave it alone (`settled.SettledKeys`); False
        while its gate waits."""
        with self.picture.lock:
            departed = self.picture.pods.take_departed(namespace, name)
            pod = self.picture.pods.pod(namespace, name)
            owned = {claim: body for claim in self.picture.pods.owned_claims(namespace, name)
                     if (body := self.picture.claim_body(namespace, claim)) is not None}
        if departed is not None:
            self._let_go(departed)
        for stale in inline_claims.stale_claims(owned, pod):
            self._delete_inline(namespace, stale)
        if pod is None or not pod_gate.is_gated(pod) or pod_gate.is_terminated(pod):
            return True
        try:
            used = pod_claims.read_pod_claims(pod)
        except InvalidPodClaims as err:
            # The webhook refuses these; a pod created while it was not installed may carry them.
            self._wait(pod, pod_gate.Wait(pod_gate.REASON_INVALID_ANNOTATIONS, str(err), warning=True))
            return False
        if not self._ensure_inline(pod, used):
            return False
        for _step in range(DECISIONS_PER_SYNC):
            views = self._views(pod, used)
            decision = pod_gate.decide_gate(pod, views)
            if isinstance(decision, pod_gate.NotGated):
                return True
            if isinstance(decision, pod_gate.Wait):
                self._wait(pod, decision)
                return False
            if isinstance(decision, pod_gate.Lift):
                self._lift(pod, used, decision.node)
                return False
            if isinstance(decision, pod_gate.Place):
                self._place(pod, decision, views)
                return False
            self._reserve_users(pod, decision)
        return False

    # -- reading ----------------------------------------------------------------------------------

    def _views(self, pod: Body, used: pod_claims.PodClaims) -> list[pod_gate.ClaimView]:
        meta = pod["metadata"]
        namespace, pod_name, pod_uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
        inline = {request.claim_name(pod_name) for request in used.inline}
        views = []
        to_check: dict[str, tuple[str, str]] = {}
        with self.picture.lock:
            view = self.picture.view()
            for claim_name in used.claim_names(pod_name):
                claim = self.picture.claim(namespace, claim_name)
                other = ""
                if claim is not None and claim.status.users and not pod_gate.lists_user(claim, pod_name, pod_uid):
                    user = claim.status.users[0]
                    held_by = self.picture.pods.pod(namespace, user.name)
                    if held_by is None:
                        to_check[claim_name] = (user.name, user.uid)  # not in the picture: ask the server
                    elif _is_live(held_by, user.uid):
                        other = user.name
                views.append(pod_gate.ClaimView(
                    name=claim_name, claim=claim, inline=claim_name in inline,
                    waits_for_consumer=claim is not None and _waits_for_consumer(claim, view), other_user=other))
        for index, claim_view in enumerate(views):
            if claim_view.name in to_check:
                user_name, user_uid = to_check[claim_view.name]
                if self._user_is_live(namespace, user_name, user_uid):
                    views[index] = dataclasses.replace(claim_view, other_user=user_name)
        return views

    def _user_is_live(self, namespace: str, name: str, uid: str) -> bool:
        """A live read: a claim's user the picture does not hold may have been created just now
        (never take a claim from a pod on the cache alone)."""
        try:
            return _is_live(self.kube.get_pod(namespace, name), uid)
        except errors.NotFound:
            return False

    # -- steps ------------------------------------------------------------------------------------

    def _ensure_inline(self, pod: Body, used: pod_claims.PodClaims) -> bool:
        """Create the inline claims the pod lacks; False when the pod must wait for something."""
        meta = pod["metadata"]
        namespace, pod_name = meta.get("namespace", ""), meta.get("name", "")
        for request in used.inline:
            claim_name = request.claim_name(pod_name)
            body = self.picture.claim_body(namespace, claim_name)
            if body is None:
                self._create_inline(pod, request)
                continue
            if inline_claims.owned_by(body, pod):
                continue
            owner = pod_index.owner_pod(body)
            if owner is not None and owner[0] == pod_name:
                return False  # an earlier pod of this name owns it: it is being deleted, then remade
            self._wait(pod, pod_gate.Wait(
                pod_gate.REASON_INLINE_CLAIM_TAKEN,
                f"{pod_claims.annotation_field(names.inline_request_annotation(request.container))}: the claim"
                f" {claim_name} this request makes already exists and is not the pod's; delete or rename that"
                " claim, or rename the pod", warning=True))
            return False
        return True

    def _create_inline(self, pod: Body, request: pod_claims.InlineRequest) -> None:
        with self.picture.lock:
            provisioned = inline_claims.provisioned_class(request, self.picture.view())
        body = inline_claims.build_claim(pod, request, provisioned=provisioned)
        namespace, claim_name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            answer = self.kube.create_claim(body)
        except errors.AlreadyExists:
            answer = self.kube.get_claim(namespace, claim_name)  # made by us before, or by the other controller
        self.picture.put_claim(answer)
        self.queue.add(("claim", namespace, claim_name))

    def _delete_inline(self, namespace: str, stale: inline_claims.Stale) -> None:
        # NotFound: the garbage collector or the other controller was first; Conflict: the name
        # belongs to another claim now.
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            self.kube.delete_claim_of(namespace, stale.name, uid=stale.uid)
        logger.info("deleted claim %s/%s: the pod that owned it is gone", namespace, stale.name)

    def _let_go(self, departed: Body) -> None:
        """A pod is gone: the claims it names that still list it as their user list no one (their
        status tells the truth; the next pod takes them either way). Inline claims are deleted,
        not written. A failed write puts the pod back, so the retry lets go again."""
        meta = departed.get("metadata") or {}
        namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
        annotations = meta.get("annotations") or {}
        named = sorted({v for k, v in annotations.items() if k.startswith(names.ANNOTATION_CLAIM_PREFIX) and v})
        for claim_name in named:
            claim = self.picture.claim(namespace, claim_name)
            if claim is None or not claim.status.users or claim.status.users[0].name != name \
                    or (claim.status.users[0].uid and claim.status.users[0].uid != uid):
                continue
            patch = {"metadata": {"resourceVersion": claim.metadata.resource_version}, "status": {"users": []}}
            try:
                self.picture.put_claim(self.kube.patch_claim_status(namespace, claim_name, patch))
            except errors.NotFound:
                continue
            except errors.Conflict:
                with self.picture.lock:
                    self.picture.pods.keep_departed(departed)
                self.picture.put_claim(self.kube.get_claim(namespace, claim_name))
                raise

    def _reserve_users(self, pod: Body, decision: pod_gate.ReserveUsers) -> None:
        meta = pod["metadata"]
        namespace = meta.get("namespace", "")
        user = {"name": meta.get("name", ""), "uid": meta.get("uid", "")}
        for claim_name in decision.claims:
            claim = self.picture.claim(namespace, claim_name)
            if claim is None:
                continue
            patch = {"metadata": {"resourceVersion": claim.metadata.resource_version}, "status": {"users": [user]}}
            try:
                answer = self.kube.patch_claim_status(namespace, claim_name, patch)
            except errors.Conflict:
                # Changed meanwhile (another pod took it, or its bind went on): re-read, decide again.
                self.picture.put_claim(self.kube.get_claim(namespace, claim_name))
                raise
            self.picture.put_claim(answer)

    def _wait(self, pod: Body, decision: pod_gate.Wait) -> None:
        if decision.quiet:
            return
        current = pod_gate.condition_of(pod)
        if current is not None and current.get("status") == "False" and current.get("reason") == decision.reason \
                and current.get("message") == decision.message:
            return  # said already: no write, no Event
        self._set_condition(pod, "False", decision.reason, decision.message)
        if decision.warning:
            self.events.record(_with_kind(pod), type_=WARNING, reason=decision.reason, message=decision.message)

    def _set_condition(self, pod: Body, status: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        condition = {"type": pod_gate.CONDITION_CLAIMS_READY, "status": status, "reason": reason,
                     "message": message[:1024], "lastTransitionTime": timestamps.now_rfc3339()}
        try:
            answer = self.kube.patch_pod_status(meta.get("namespace", ""), meta.get("name", ""),
                                                {"status": {"conditions": [condition]}})
        except errors.NotFound:
            return
        self.picture.put_pod(answer)

    def _lift(self, pod: Body, used: pod_claims.PodClaims, node: str) -> None:
        meta = pod["metadata"]
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        if cards_assigned.is_translated(pod):  # before the lift: a crash between repeats it (409), never loses it
            cards_event.post(self.events, self.picture, _with_kind(pod), used, node)
        try:
            answer = self.kube.patch_pod(namespace, name, pod_gate.lift_patch(pod, node))
        except errors.NotFound:
            return
        except errors.Conflict:
            self._refresh_pod(namespace, name)  # the other controller lifted it, or the pod changed
            raise
        self.picture.put_pod(answer)
        if self.metrics is not None:
            created = timestamps.epoch_seconds(meta.get("creationTimestamp"))
            if created is not None:
                self.metrics.gate_lifted(waited_s=max(0.0, time.time() - created))
        current = pod_gate.condition_of(pod)
        if current is not None and current.get("status") != "True":
            # Only a pod that was told why it waited hears that it no longer does: a write per pod
            # on the happy path would cost as much as the gate lift itself.
            self._set_condition(answer, "True", pod_gate.REASON_READY, f"every claim is bound on node {node}")
            self.events.record(_with_kind(answer), type_=NORMAL, reason=pod_gate.REASON_READY,
                               message=f"every claim is bound on node {node}; scheduling gate lifted")
        logger.debug("pod %s/%s: gate lifted, pinned to node %s", namespace, name, node)

    def _refresh_pod(self, namespace: str, name: str) -> None:
        try:
            self.picture.put_pod(self.kube.get_pod(namespace, name))
        except errors.NotFound:
            return

    # -- WaitForFirstConsumer -----------------------------------------------------------------------

    def _place(self, pod: Body, decision: pod_gate.Place, views: list[pod_gate.ClaimView]) -> None:
        meta = pod["metadata"]
        namespace = meta.get("namespace", "")
        claims = {v.name: v.claim for v in views if v.name in decision.claims and v.claim is not None}
        if any(self.binding.hand_off.in_flight(("claim", namespace, claim_name)) for claim_name in claims):
            return  # placed already: their binds are finishing, and their watch events wake the pod
        wanted: list[pod_placement.Wanted] = []
        provisions: dict[str, tuple[ElasticGPUClaim, binder.Provision]] = {}
        # Claims that bind to an existing ElasticGPU: (claim, ElasticGPU, its node) by claim name.
        statics: dict[str, tuple[ElasticGPUClaim, str, str]] = {}
        with self.picture.lock:
            view = _as_first_consumer(self.picture.view(), claims.values())
            for claim_name, claim in sorted(claims.items()):
                provision = binder.decide_claim(claim, view)
                if isinstance(provision, binder.BindToExisting):
                    # OBSERVATION: an Available ElasticGPU matches: its cards fix the node.
                    statics[claim_name] = (claim, provision.elastic_gpu, self._node_of(provision.elastic_gpu))
                    continue
                if not isinstance(provision, binder.Provision):
                    reason = provision.reason if isinstance(provision, binder.Wait) else pod_gate.REASON_CLAIM_PENDING
                    message = provision.message if isinstance(provision, binder.Wait) else str(provision)
                    self._wait(pod, pod_gate.Wait(reason, f"claim {claim_name}: {message}", warning=True))
                    return
                key = provisioned_names.provisioned_name(claim)
                request = PlacementRequest(gpu=provision.request, models=provision.parameters.gpu_model,
                                           node_selector=provision.parameters.node_selector,
                                           isolation=provision.required_isolation,
                                           topology=provision.topology)
                klass = view.classes.get(provision.class_name)
                wanted.append(pod_placement.Wanted(claim=claim_name, key=key, request=request,
                                                   policy=provision.parameters.policy,
                                                   mig=klass is not None and klass.is_mig))
                provisions[key] = (claim, provision)
            held = {w.key: p for w in wanted if (p := self.picture.ledger.held(w.key)) is not None}
        held_nodes = {p.node for p in held.values()}
        if len(held_nodes) > 1:
            # Reservations of one pod on two nodes (two controllers before the node was agreed):
            # free them and start over, but never one whose ElasticGPU exists already (the other
            # controller's bind went on; the picture may not show it yet: a live read). Freeing that
            # one would leave its ElasticGPU without its reservation (Lost); the rest goes beside it.
            made = {key for key in held if _elastic_gpu_exists(self.picture, self.kube, key)}
            keep_nodes = {held[key].node for key in made}
            if len(keep_nodes) > 1:
                where = ", ".join(f"ElasticGPU {key} on {held[key].node}" for key in sorted(made))
                self._wait(pod, pod_gate.Wait(pod_gate.REASON_FAILED_PLACEMENT, f"the pod's claims were provisioned"
                                              f" on different nodes ({where}); a pod runs on one node: delete"
                                              " the claims of one node", warning=True))
                return
            for key in sorted(held):
                if key not in made and held[key].node not in keep_nodes:
                    self.commit.free_reservation(key)
            raise errors.BindingError(f"pod {namespace}/{meta.get('name')}: its claims were reserved on"
                                      f" {', '.join(sorted(held_nodes))}; freed those not on"
                                      f" {next(iter(keep_nodes), 'a node with an ElasticGPU')}, placing again")
        static_nodes = {node for _claim, _egpu, node in statics.values()}
        if len(static_nodes | ({decision.node} if decision.node and statics else set())) > 1:
            where = ", ".join(f"{name} -> ElasticGPU {egpu} on {node}" for name, (_c, egpu, node) in sorted(
                statics.items()))
            self._wait(pod, pod_gate.Wait(pod_gate.REASON_FAILED_PLACEMENT, f"the pod's claims match ElasticGPUs on"
                                          f" different nodes ({where}); a pod runs on one node", warning=True))
            return
        selected = (meta.get("annotations") or {}).get(names.ANNOTATION_SELECTED_NODE)
        fixed = (decision.node or next(iter(static_nodes), None) or (next(iter(held_nodes)) if held_nodes else None)
                 or selected)
        chosen = self._choose(pod, [w for w in wanted if w.key not in held], fixed)
        if isinstance(chosen, str):
            if selected and not held and not decision.node:
                # The node agreed on earlier no longer fits and nothing is reserved there: let the
                # next sync choose again (the pod's resourceVersion guards the write).
                self._write_selected_node(pod, None)
            self._wait(pod, pod_gate.Wait(pod_gate.REASON_FAILED_PLACEMENT, chosen, warning=True))
            for claim_name in sorted(claims):  # their status says why they still wait (claim_sync)
                self.queue.add(("claim", namespace, claim_name))
            return
        node, placements, partitions = chosen
        if len(wanted) > 1 and selected != node:
            pod = self._write_selected_node(pod, node)
        committed: list[str] = []
        for key, placement in sorted(placements.items()):
            claim = provisions[key][0]
            try:
                self.commit.commit(key, placement, claim_ref_of(claim), partitions.get(key))
            except QuotaExceeded as err:
                for done in committed:  # all or none
                    self.commit.free_reservation(done)
                self._wait(pod, pod_gate.Wait(err.reason, f"claim {claim.metadata.name}: {err.message}", warning=True))
                meta = pod.get("metadata") or {}
                # Quotas are not watched: look again after a while (docs/quota.md).
                self.queue.add(("pod", meta.get("namespace", ""), meta.get("name", "")),
                               delay_s=self.commit.settings.quota.recheck_s, recheck=True)
                return
            except (errors.Conflict, errors.Rejected):
                for done in committed:  # all or none: a partial reservation is released
                    self.commit.free_reservation(done)
                raise
            committed.append(key)
        for key, placement in sorted({**held, **placements}.items()):
            claim, provision = provisions[key]
            self.binding.after_commit(claim, provision, key, placement)
        for claim, egpu, _node in statics.values():
            self.binding.bind_existing(claim, egpu)

    def _node_of(self, egpu_name: str) -> str:
        """The node of an ElasticGPU's cards ("" when the picture does not know them)."""
        egpu = self.picture.egpu(egpu_name)
        cards = binder.cards_of(egpu) if egpu is not None else []
        gpu = self.picture.ledger.gpu(cards[0]) if cards else None
        return gpu.spec.node_name if gpu is not None else ""

    def _choose(self, pod: Body, wanted: list[pod_placement.Wanted],
                fixed: str | None) -> tuple[str, dict[str, Any], dict[str, Any]] | str:
        """The node for the claims still to place, with their placements and (MIG claims) their
        cards' partitions; or why there is none."""
        with self.picture.lock:
            nodes = self.picture.pods.nodes()
            gpu_nodes = set(self.picture.ledger.inventory.node_names())
        ruled_out: dict[str, str] = {}
        candidates = set()
        for name in sorted(gpu_nodes if fixed is None else {fixed}):
            why = pod_placement.node_filter(pod, name, nodes.get(name))
            if why:
                ruled_out[name] = why
            elif name in gpu_nodes:
                candidates.add(name)
        if fixed is not None and fixed not in gpu_nodes:
            ruled_out.setdefault(fixed, "has no GPU the controller knows of")
        while True:
            if not wanted:
                if fixed is not None and not ruled_out:
                    return fixed, {}, {}
                return pod_placement.explain("the pod cannot run where its claims are", ruled_out)
            with self.picture.lock:
                proposal, more = pod_placement.propose(self.picture.ledger, wanted, candidates)
            ruled_out.update(more)
            if isinstance(proposal, pod_placement.NoNode):
                return pod_placement.explain(f"no node can take all of the pod's claims: {proposal.reason}"
                                             if candidates else "no node passes the pod's constraints", ruled_out)
            node = nodes.get(proposal.node)
            if node is not None:
                others = self.kube.list_pods_on_node(proposal.node)
                with self.picture.lock:
                    others += self.picture.placed_on(proposal.node)
                short = (pod_placement.fits_resources(pod, node, others)
                         if pod_placement.allocatable(node) is not None else "")
                why = f"has too little room for the pod: {short}" if short else pod_neighbours.fits_neighbours(
                    pod, proposal.node, others)
                if why:
                    ruled_out[proposal.node] = why
                    candidates.discard(proposal.node)
                    continue
            return proposal.node, dict(proposal.placements), dict(proposal.partitions)

    def _write_selected_node(self, pod: Body, node: str | None) -> Body:
        """Record (or clear) the node chosen for the pod's claims: the commit point of the choice
        between two controllers. A conflict re-reads the pod and retries the sync."""
        meta = pod["metadata"]
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                              "annotations": {names.ANNOTATION_SELECTED_NODE: node}}}
        try:
            answer = self.kube.patch_pod(namespace, name, patch)
        except errors.Conflict:
            self._refresh_pod(namespace, name)
            raise
        self.picture.put_pod(answer)
        return answer


def _elastic_gpu_exists(picture: Picture, kube: KubeApi, name: str) -> bool:
    """A live read: the picture may not show yet an ElasticGPU another controller just made."""
    if picture.egpu(name) is not None:
        return True
    try:
        kube.get_elastic_gpu(name)
    except errors.NotFound:
        return False
    return True


def _is_live(pod: Body, uid: str) -> bool:
    """True when `pod` is that incarnation (`uid`, when known) and not terminated."""
    meta = pod.get("metadata") or {}
    if uid and meta.get("uid") != uid:
        return False
    return not pod_gate.is_terminated(pod) and not meta.get("deletionTimestamp")


def _with_kind(pod: Body) -> Body:
    """List items and patch answers may lack kind and apiVersion; an Event's involvedObject needs them."""
    return {"apiVersion": "v1", "kind": "Pod", **pod}


def _class_of(claim: ElasticGPUClaim, view: binder.Picture) -> Any:
    name = claim.spec.class_name
    return view.classes.get(name) if name else view.default_class()


def _waits_for_consumer(claim: ElasticGPUClaim, view: binder.Picture) -> bool:
    """True when the claim is unbound, names no ElasticGPU (but the one to provision for it, not
    made yet: an inline claim's), and its class (of ours) binds WaitForFirstConsumer."""
    if claim.status.phase == "Bound" or claim.metadata.deletion_timestamp:
        return False
    named = claim.spec.elastic_gpu_name
    if named and (provisioned_names.prenamed(claim) != named or named in view.elastic_gpus):
        return False
    if view.by_claim_uid.get(claim.metadata.uid or "") in view.elastic_gpus:
        return False  # provisioned already: its own sync completes the bind
    klass = _class_of(claim, view)
    return (klass is not None and klass.provisioner in names.OWN_PROVISIONERS
            and klass.effective_binding_mode == "WaitForFirstConsumer")


def _as_first_consumer(view: binder.Picture, claims: Any) -> binder.Picture:
    """The binder's view with the claims' classes binding Immediate: the pod is the consumer
    they waited for, so the binder may now decide how to provision them."""
    classes = dict(view.classes)
    for claim in claims:
        klass = _class_of(claim, view)
        if klass is not None and klass.metadata.name:
            classes[klass.metadata.name] = klass.model_copy(
                update={"binding_mode": "Immediate", "egpu_binding_mode": None})
    return dataclasses.replace(view, classes=classes)
