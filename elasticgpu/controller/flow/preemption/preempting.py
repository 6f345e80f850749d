"""Preempting: carries out `decisions.preemption`'s protocol for a claim that fits nowhere (plan, mark,
evict, fail; then the claim's ordinary sync binds it). See that module's docstring for the steps and
crash cases, and docs/preemption.md for what users see.

The reserver (`reserving.py`) calls `try_preempt` where it would otherwise say NoCapacity, and the claim
sync calls `settled` once the claim is Bound (`status.preemption` goes). Plans and marks live in claim
status, which only the controller writes, and a plan is checked again each time it is followed: a tenant
can neither forge one nor keep one going that its class no longer allows (issue 33, docs/security.md).
Every write is guarded by the resourceVersion the picture holds; a conflict re-reads the object and
raises, and the worker retries the claim from what it finds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping

from elasticgpu.allocator import PlacementRequest
from elasticgpu.allocator.preemption import Candidate, NoPreemption, choose_victims
from elasticgpu.api import ElasticGPUClaim, ElasticGPUClass
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, preemption
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.binding.elasticgpu_sync import ElasticGPUSync
from elasticgpu.controller.flow.binding.reserving import PreemptionOutcome as Outcome
from elasticgpu.controller.flow.machinery.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.flow.preemption.choosing import Chosen, VictimChooser
from elasticgpu.controller.flow.preemption.evicting import Evictions
from elasticgpu.controller.flow.preemption.priority_classes import PriorityClasses
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.picture.reservations import now_rfc3339

logger = logging.getLogger(__name__)

RECHECK_S = 2.0
"""Seconds after which a preemptor whose victims are going is looked at again even if no event came (the
GPU write that frees the victims' room normally wakes it at once)."""
BLOCKED_RECHECK_S = 10.0
"""Seconds before an eviction a PodDisruptionBudget refused is tried again."""

Pending = Callable[[ElasticGPUClaim, str, str], None]


class Preempter:
    """Preempts lower-priority claims for claims that fit nowhere (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, events: EventRecorder,
                 commit: Commit, elastic_gpus: ElasticGPUSync, pending: Pending,
                 metrics: Callable[[], ControllerMetrics | None] = lambda: None) -> None:
        """`pending`: writes a claim's Pending status and Event (`ClaimStatus.pending`); `metrics`: the
        controller's metrics when it has them (counts the claims preempted)."""
        self.metrics = metrics
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.events = events
        self.commit = commit
        self.elastic_gpus = elastic_gpus
        self.pending = pending
        self.priority_classes = PriorityClasses(kube)
        self.evictions = Evictions(kube=kube, picture=picture)
        self.chooser = VictimChooser(kube=kube, picture=picture, queue=queue, commit=commit, evictions=self.evictions)

    # -- entry points ------------------------------------------------------------------------------

    def try_preempt(self, claim: ElasticGPUClaim, decision: binder.Provision, request: PlacementRequest) -> Outcome:
        """`claim` (provisioned per `decision`, asking `request`) fits nowhere: go on with its plan if it still
        holds, or make one."""
        with self.picture.lock:
            classes = dict(self.picture.view().classes)
        priorities = self._priorities(classes)
        mine = priorities.get(decision.class_name) or preemption.ClaimPriority(0, preemption.DEFAULT_PREEMPTS)
        values = {name: p.value for name, p in priorities.items()}
        plan = preemption.plan_of(claim)
        if plan is not None:
            stale = self._stale(claim, decision, request, plan, mine, values)
            if not stale:
                outcome, blocked = self._follow(claim, plan)
                if not blocked or not mine.preempts:
                    return outcome
                # OBSERVATION: a budget protects a victim's pods, so nothing of this plan was evicted or
                # failed: take another plan whose victims no budget protects, if there is one; else wait.
                other = self.chooser.choose(claim, decision, request, mine, values, fallback=False)
                if not isinstance(other, Chosen):
                    return outcome
                logger.info("claim %s: a PodDisruptionBudget protects a victim of its plan; planning around it",
                            preemption.preemptor_name(claim))
                self._unmark_spared(claim, plan.victims)
                return self._make_plan(self._drop_plan(claim), other, mine)
            # OBSERVATION: the plan no longer holds (a class changed its priority or policy, a quota shrank,
            # the victims would no longer make room): stop here; victims already failed stay failed.
            logger.info("claim %s: dropping its preemption plan: %s", preemption.preemptor_name(claim), stale)
            self._unmark_spared(claim, plan.victims)
            claim = self._drop_plan(claim)
        if not mine.preempts:
            return Outcome(False, mine.note)
        if not any(value < mine.value for value in values.values()):
            return Outcome(False)  # no class of lower priority: nothing can be a victim (the common case)
        chosen = self.chooser.choose(claim, decision, request, mine, values, fallback=True)
        if isinstance(chosen, str):
            return Outcome(False, f"no preemption: {chosen}")
        return self._make_plan(claim, chosen, mine)

    def _make_plan(self, claim: ElasticGPUClaim, chosen: Chosen, mine: preemption.ClaimPriority) -> Outcome:
        """Write `chosen` as `claim`'s plan (`status.preemption`, guarded) and follow it."""
        picked, where, victims = chosen.picked, chosen.where, chosen.victims
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        status = preemption.plan_status(victims, node=picked.node, card=picked.card, where=where)
        patch = {"metadata": {"resourceVersion": claim.metadata.resource_version}, "status": {"preemption": status}}
        try:
            answer = self.kube.patch_claim_status(namespace, name, patch)
        except errors.Conflict:
            self._refresh(namespace, name)
            raise
        claim = self.picture.put_claim(answer)
        shown = ", ".join(f"{v.claim} (priority {chosen.candidates[v.elastic_gpu].priority})" for v in victims)
        self.events.record(self._body(claim), type_=NORMAL, reason=preemption.REASON_PREEMPTING,
                           message=f"priority {mine.value}: preempting claim(s) {shown} on {where}")
        outcome, _blocked = self._follow(
            claim, preemption.Plan(node=picked.node, card=picked.card, where=where, victims=victims))
        return outcome

    def settled(self, namespace: str, name: str) -> None:
        """The claim is Bound: its plan, if any, is done; `status.preemption` goes."""
        claim = self.picture.claim(namespace, name)
        plan = preemption.plan_of(claim) if claim is not None else None
        if claim is None or plan is None:
            return
        self._unmark_spared(claim, plan.victims)
        self._drop_plan(claim)

    def current(self, claim: ElasticGPUClaim) -> ElasticGPUClaim:
        """The claim as its preemption left it (the picture's copy, with the plan annotation and its
        resourceVersion) when the picture holds a newer copy of this claim with a plan; else `claim`. The bind's
        writes carry the claim's resourceVersion: the version read before the plan was written would conflict."""
        fresh = self.picture.claim(claim.metadata.namespace or "", claim.metadata.name or "")
        if fresh is None or fresh.metadata.uid != claim.metadata.uid or preemption.plan_of(fresh) is None:
            return claim
        return fresh

    # -- choosing ----------------------------------------------------------------------------------

    def _priorities(self, classes: Mapping[str, ElasticGPUClass]) -> dict[str, preemption.ClaimPriority]:
        """Each class's priority (a PriorityClass read at most once per class per call, outside the lock)."""
        return {name: preemption.priority_of(klass, self.priority_classes.get) for name, klass in classes.items()}

    def _stale(self, claim: ElasticGPUClaim, decision: binder.Provision, request: PlacementRequest,
               plan: preemption.Plan, mine: preemption.ClaimPriority, values: Mapping[str, int]) -> str:
        """Why `claim`'s plan may no longer be followed ("" when it may). Checked every time it is followed, as
        when it was made: the preemptor may still preempt, its victims still to go are of lower priority, they
        would still make room where the plan says, and the claim's quota would then admit it."""
        picture = self.picture
        with picture.lock:
            default = picture.view().default_class()
            fallback = default.metadata.name or "" if default is not None else ""
            held = [v for v in plan.victims if picture.ledger.held(v.elastic_gpu) is not None]
            going: list[tuple[preemption.Victim, int]] = []
            for victim in held:
                egpu = picture.egpu(victim.elastic_gpu)
                if egpu is not None and egpu.status.phase != "Failed":  # a failed one's room comes anyway
                    going.append((victim, values.get(egpu.spec.elastic_gpu_class_name or fallback, 0)))
        why = preemption.stale_reason(mine, decision.class_name, going)
        if why or not held:
            return why  # none held: `_follow` drops the plan and makes another
        if request.nodes and plan.node not in request.nodes:
            return f"this claim may no longer use node {plan.node}"
        # The victims as candidates of any lower priority: the question is only whether they make room.
        there = dataclasses.replace(request, nodes=frozenset({plan.node}))
        with picture.lock:
            chosen = choose_victims(picture.ledger.inventory, there, priority=mine.value,
                                    policy=decision.parameters.policy,
                                    candidates=[Candidate(key=v.elastic_gpu, priority=mine.value - 1) for v in held])
        if isinstance(chosen, NoPreemption):
            return f"its victims would no longer make room on {plan.where}"
        return self.chooser.quota_refuses(claim, decision, chosen, plan.victims)

    # -- carrying out ------------------------------------------------------------------------------

    def _follow(self, claim: ElasticGPUClaim, plan: preemption.Plan) -> tuple[Outcome, set[str]]:
        """Steps 2 to 4 for the victims still held; the claim's status says what it waits for. Also returns
        the ElasticGPUs of the victims a budget protects: then no victim of the plan was evicted or failed."""
        victims, where = plan.victims, plan.where
        me = preemption.preemptor_name(claim)
        with self.picture.lock:
            held = [v for v in victims if self.picture.ledger.held(v.elastic_gpu) is not None]
        if not held:
            # OBSERVATION: every victim is gone and the claim still fits nowhere: the room went to
            # another claim meanwhile. Drop the plan; the next sync makes a new one.
            self._drop_plan(claim)
            self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""))
            return Outcome(True), set()
        live: list[tuple[preemption.Victim, ElasticGPUClaim | None]] = []
        for victim in held:
            model = self.picture.claim(victim.namespace, victim.name)
            if model is not None and model.metadata.uid != victim.uid:
                model = None  # another claim of the same name: the victim itself is gone
            owner = preemption.preempted_by(model) if model is not None else ""
            if owner and owner != me and self.chooser.mark_holds(model, victim.elastic_gpu):
                # OBSERVATION: another preemptor marked this victim first: this plan cannot be kept.
                self._abandon(claim, victims)
                return Outcome(True), set()
            live.append((victim, model))
        for victim, model in live:
            if model is not None and preemption.preempted_by(model) != me:
                self._mark(model, claim, victim, where)  # unmarked, or a stale mark (its preemptor gone)
        # All or nothing (issue 44 item 4): every pod of the plan is asked first (a dry run), and a victim
        # fails only when no pod of the plan was refused, so a budget on one victim costs the others nothing.
        blocked: list[str] = []
        protected: set[str] = set()
        for dry_run in (True, False):
            for victim, model in live:
                refused = self.evictions.refused(model, dry_run=dry_run) if model is not None else []
                if refused and model is not None:
                    blocked += refused
                    protected.add(victim.elastic_gpu)
                    self._say_held(model, refused)
            if blocked:
                break
        if not blocked:
            for victim, _model in live:
                self._fail(victim, me)
        else:
            self.evictions.protect(protected)
        with self.picture.lock:
            freed = not any(self.picture.ledger.held(v.elastic_gpu) is not None for v in held)
        if freed:
            # OBSERVATION: every victim's room is free already (nothing ran there): bind now, in this sync,
            # rather than after a status write and a wake-up (the preemption latency, bench/preemption.py).
            return Outcome(True, retry=True), set()
        message = ""
        if blocked:
            message = (f"the eviction of pod(s) {', '.join(blocked)} is refused for now by a PodDisruptionBudget;"
                       f" no victim is preempted until every one's pods may go; retried every {BLOCKED_RECHECK_S:g}s")
            self.events.record(self._body(claim), type_=WARNING, reason=preemption.REASON_EVICTION_BLOCKED,
                               message=message)
        self.pending(claim, preemption.REASON_PREEMPTING, preemption.waiting_message(victims, where, blocked=message))
        self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""),
                       delay_s=BLOCKED_RECHECK_S if blocked else RECHECK_S, recheck=True)
        return Outcome(True), protected

    def _mark(self, victim: ElasticGPUClaim, preemptor: ElasticGPUClaim, entry: preemption.Victim,
              where: str) -> None:
        """Step 2: the victim's annotation (guarded), its Preempted condition and a Warning Event."""
        namespace, name = victim.metadata.namespace or "", victim.metadata.name or ""
        me = preemption.preemptor_name(preemptor)
        with self.picture.lock:
            classes = dict(self.picture.view().classes)
        values = {n: p.value for n, p in self._priorities(classes).items()}
        klass = preemptor.spec.class_name or ""
        egpu = self.picture.egpu(entry.elastic_gpu)
        victim_class = egpu.spec.elastic_gpu_class_name or "" if egpu is not None else ""
        message = preemption.victim_message(me, values.get(klass, 0), values.get(victim_class, 0), where)
        patch = {"metadata": {"resourceVersion": victim.metadata.resource_version}, "status": {"preemptedBy": me}}
        try:
            answer = self.kube.patch_claim_status(namespace, name, patch)
        except errors.Conflict:
            self._refresh(namespace, name)
            raise
        except errors.NotFound:
            return
        self.picture.put_claim(answer)
        # The mark is the record; the condition comes with the Lost status (`preempted_conditions`), or
        # from `_say_held` while a budget holds the pods: not one more write in every preemption's path.
        self.events.record(answer, type_=WARNING, reason=preemption.REASON_PREEMPTED_BY, message=message)
        logger.info("claim %s/%s preempted by %s", namespace, name, me)

    def _say_held(self, victim: ElasticGPUClaim, pods: list[str]) -> None:
        """The victim's Preempted condition while a PodDisruptionBudget holds its pods (once: it stays)."""
        victim = self.picture.claim(victim.metadata.namespace or "", victim.metadata.name or "") or victim
        if any(c.type == preemption.CONDITION_PREEMPTED for c in victim.status.conditions):
            return
        message = (f"preempted by claim {preemption.preempted_by(victim)}: waiting for a PodDisruptionBudget to allow"
                   f" the eviction of pod(s) {', '.join(pods)}; then its ElasticGPU fails and the claim becomes Lost")
        conditions = [*(c.to_dict() for c in victim.status.conditions),
                      preemption.preempted_condition(message, now=now_rfc3339())]
        with contextlib.suppress(errors.NotFound, errors.Conflict):  # a conflict: the next pass says it
            self.picture.put_claim(self.kube.patch_claim_status(victim.metadata.namespace or "",
                                                                victim.metadata.name or "", {
                "metadata": {"resourceVersion": victim.metadata.resource_version},
                "status": {"conditions": conditions}}))

    def _fail(self, victim: preemption.Victim, me: str) -> None:
        """Step 4: the victim's ElasticGPU Failed (reason Preempted); its sync frees the room once the agent
        no longer reports the claim running, and its claim becomes Lost."""
        egpu = self.picture.egpu(victim.elastic_gpu)
        if egpu is not None and egpu.status.phase not in ("Failed", "Released"):
            self.elastic_gpus.set_phase(egpu, "Failed", preemption.REASON_PREEMPTED,
                                        f"preempted by claim {me}; the reservation is freed once its pods are gone")
            metrics = self.metrics()
            if metrics is not None:
                metrics.preempted()
        # Its sync at once, here: it frees the room unless the agent reports the claim running (then the
        # GPU write that says they stopped wakes it). Its writes are guarded: a worker syncing the same
        # ElasticGPU meanwhile only makes one of the two re-read.
        self.elastic_gpus.sync(victim.elastic_gpu)
        self.queue.add(("claim", victim.namespace, victim.name))

    def _abandon(self, claim: ElasticGPUClaim, victims: list[preemption.Victim]) -> None:
        """Another preemptor holds a victim: unmark the victims this plan marked (none is evicted yet: marking
        comes first), drop the plan, and try again."""
        me = preemption.preemptor_name(claim)
        for victim in victims:
            model = self.picture.claim(victim.namespace, victim.name)
            if model is None or preemption.preempted_by(model) != me:
                continue
            self._unmark(model)
        self._drop_plan(claim)
        self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""),
                       delay_s=RECHECK_S * 0.1)

    def _unmark_spared(self, claim: ElasticGPUClaim, victims: list[preemption.Victim]) -> None:
        """The claim is Bound: victims of its plan that were marked but never failed (their pods were still
        held by a budget when room came elsewhere) lose the mark (best effort: a mark whose plan is gone
        keeps nobody from being a victim anyway, `_mark_holds`)."""
        me = preemption.preemptor_name(claim)
        for victim in victims:
            model = self.picture.claim(victim.namespace, victim.name)
            egpu = self.picture.egpu(victim.elastic_gpu)
            if model is None or preemption.preempted_by(model) != me or egpu is None or egpu.status.phase == "Failed":
                continue
            self._unmark(model)

    def _unmark(self, victim: ElasticGPUClaim) -> None:
        """The victim's `status.preemptedBy` goes (best effort: a conflict or a gone claim leaves a mark that
        keeps nobody from being a victim, `_mark_holds`)."""
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            self.picture.put_claim(self.kube.patch_claim_status(victim.metadata.namespace or "",
                                                                victim.metadata.name or "", {
                "metadata": {"resourceVersion": victim.metadata.resource_version}, "status": {"preemptedBy": None}}))

    def _drop_plan(self, claim: ElasticGPUClaim) -> ElasticGPUClaim:
        """The claim without `status.preemption` (as the server answered, or `claim` when it is gone)."""
        namespace, name = claim.metadata.namespace or "", claim.metadata.name or ""
        patch = {"metadata": {"resourceVersion": claim.metadata.resource_version}, "status": {"preemption": None}}
        try:
            return self.picture.put_claim(self.kube.patch_claim_status(namespace, name, patch))
        except errors.Conflict:
            self._refresh(namespace, name)
            raise
        except errors.NotFound:
            return claim

    # -- plumbing ----------------------------------------------------------------------------------

    def _body(self, claim: ElasticGPUClaim) -> Body:
        return self.picture.claim_body(claim.metadata.namespace or "", claim.metadata.name or "") or claim.to_dict()

    def _refresh(self, namespace: str, name: str) -> None:
        try:
            self.picture.put_claim(self.kube.get_claim(namespace, name))
        except errors.NotFound:
            return
