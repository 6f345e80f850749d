"""Choosing victims for a claim that fits nowhere: the candidates (Bound claims of lower priority, groups
as a whole), the allocator's choice among them, the quota check, and the preference for victims no
PodDisruptionBudget protects (issue 44 item 4). Split from `preempting.py`, which carries the plan out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from elasticgpu.allocator import PlacementRequest, quota
from elasticgpu.allocator.preemption import Candidate, NoPreemption, Preemption, choose_victims
from elasticgpu.api import ElasticGPUClaim, ElasticGPUQuota
from elasticgpu.controller.decisions import binder, groups, preemption
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.flow.preemption.evicting import Evictions
from elasticgpu.controller.picture.picture import Picture

RECHECK_S = 2.0
"""Seconds after which a preemptor whose victims are going is looked at again even if no event came (the
GPU write that frees the victims' room normally wakes it at once)."""
MAX_PLANS = 4
"""Plans tried in one pass before settling for one whose victims a budget protects (`choose`)."""


@dataclasses.dataclass(frozen=True)
class Chosen:
    """A set of victims the allocator chose: where they make room, and the candidates they were chosen from."""

    picked: Preemption
    where: str
    victims: list[preemption.Victim]
    candidates: dict[str, Candidate]


class VictimChooser:
    """Chooses the victims of a preemption (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, commit: Commit,
                 evictions: Evictions) -> None:
        self.kube = kube
        self.picture = picture
        self.queue = queue
        self.commit = commit
        self.evictions = evictions

    def choose(self, claim: ElasticGPUClaim, decision: binder.Provision, request: PlacementRequest,
                mine: preemption.ClaimPriority, values: Mapping[str, int], *, fallback: bool) -> Chosen | str:
        """The victims to take for `claim`, or why there are none. Victims no PodDisruptionBudget protects are
        preferred (kube-scheduler's rule): a plan whose pods a dry-run eviction finds protected is set aside
        and another chosen without them; `fallback`: when every plan has protected victims, the first one
        (it waits for its budget, `_follow`), else none."""
        first: Chosen | None = None
        left_out = self.evictions.protected()
        remembered = bool(left_out)
        for _attempt in range(MAX_PLANS):
            with self.picture.lock:
                candidates, in_flight = self.candidates(values, below=mine.value)
                # A group is a victim as a whole: one protected member keeps the whole group out.
                groups_out = {c.group for k, c in candidates.items() if k in left_out and c.group}
                usable = {k: c for k, c in candidates.items()
                          if k not in left_out and not (c.group and c.group in groups_out)}
                picked = choose_victims(self.picture.ledger.inventory, request, priority=mine.value,
                                        candidates=usable.values(), policy=decision.parameters.policy)
                if isinstance(picked, Preemption):
                    chosen = Chosen(picked, self.where(picked), self.victims_of(picked), candidates)
            if isinstance(picked, NoPreemption) and fallback and first is None and remembered:
                # Only victims a budget protected lately would make room: ask their budgets again now
                # (they may allow a disruption by now) rather than wait with nothing to wake this claim.
                left_out, remembered = set(), False
                continue
            if isinstance(picked, NoPreemption):
                if in_flight:
                    # Lower-priority reservations whose claims are mid-bind (or mid-preemption by another
                    # claim): they may be victims in a moment, and nothing else would wake this claim then.
                    self.queue.add(("claim", claim.metadata.namespace or "", claim.metadata.name or ""),
                                   delay_s=RECHECK_S, recheck=True)
                break
            refused = self.quota_refuses(claim, decision, chosen.picked, chosen.victims)
            if refused:
                return refused
            protected = self.protected_keys(chosen.victims)
            if not protected:
                return chosen
            self.evictions.protect(protected)
            left_out |= protected
            first = first or chosen
        if fallback and first is not None:
            return first
        if first is not None:
            return "a PodDisruptionBudget protects the pods of every set of victims that would make room"
        return picked.reason if isinstance(picked, NoPreemption) else "no set of victims makes room"

    def protected_keys(self, victims: list[preemption.Victim]) -> set[str]:
        """The ElasticGPUs of `victims` with a running pod whose eviction a budget refuses now (dry run)."""
        protected = set()
        for victim in victims:
            model = self.picture.claim(victim.namespace, victim.name)
            if model is not None and model.metadata.uid == victim.uid and self.evictions.refused(model, dry_run=True):
                protected.add(victim.elastic_gpu)
        return protected

    def candidates(self, values: Mapping[str, int], *, below: int) -> tuple[dict[str, Candidate], int]:
        """The Bound claims of a class of priority below `below`, as candidates, and how many reservations of
        such a class are not candidates now (mid-bind, or being preempted) (under the picture's lock)."""
        picture = self.picture
        default = picture.view().default_class()
        fallback = default.metadata.name or "" if default is not None else ""
        found: dict[str, Candidate] = {}
        skipped = 0
        # A claim group is a victim as a whole or not at all (docs/gangs.md): its members are gathered here,
        # whatever their priority; one that may not be a victim keeps the whole group (the allocator judges
        # the priorities).
        members: dict[str, list[Candidate | None]] = {}
        for key in list(picture.ledger.inventory.reservations):
            egpu = picture.egpu(key)
            if egpu is None or egpu.spec.claim_ref is None:
                skipped += 1  # a reservation whose ElasticGPU is being created
                continue
            value = values.get(egpu.spec.elastic_gpu_class_name or fallback, 0)
            ref = egpu.spec.claim_ref
            claim = picture.claim(ref.namespace or "", ref.name or "")
            group = f"{ref.namespace}/{groups.group_name(claim)}" if claim is not None and groups.group_name(
                claim) else ""
            if value >= below and not group:
                continue
            candidate = preemption.candidate_of(egpu, claim, value, marked=self.mark_holds(claim, key))
            if group:
                members.setdefault(group, []).append(
                    dataclasses.replace(candidate, group=group) if candidate is not None else None)
            elif candidate is not None:
                found[key] = candidate
            if candidate is None and claim is not None and claim.status.phase != "Bound" \
                    and not claim.metadata.deletion_timestamp and value < below:
                skipped += 1  # mid-bind: a victim in a moment
        for group_members in members.values():
            if all(c is not None for c in group_members):
                found.update((c.key, c) for c in group_members if c is not None)
        return found, skipped

    def mark_holds(self, claim: ElasticGPUClaim | None, key: str) -> bool:
        """Whether `claim`'s `preempted-by` mark still stands: its preemptor exists and its plan names `key`.
        A mark left by a preemptor that was deleted, or bound elsewhere, keeps nobody from being a victim."""
        by = preemption.preempted_by(claim) if claim is not None else ""
        if not by:
            return False
        namespace, _, name = by.partition("/")
        preemptor = self.picture.claim(namespace, name)
        plan = preemption.plan_of(preemptor) if preemptor is not None else None
        return plan is not None and any(v.elastic_gpu == key for v in plan.victims)

    def where(self, chosen: Preemption) -> str:
        if chosen.card:
            return self.picture.ledger.inventory.card(chosen.card).record.describe()
        return f"node {chosen.node}"

    def victims_of(self, chosen: Preemption) -> list[preemption.Victim]:
        victims = []
        for key in chosen.victims:
            egpu = self.picture.egpu(key)
            ref = egpu.spec.claim_ref if egpu is not None else None
            if ref is None:
                continue
            victims.append(preemption.Victim(elastic_gpu=key, namespace=ref.namespace or "", name=ref.name or "",
                                             uid=ref.uid or ""))
        return victims

    def quota_refuses(self, claim: ElasticGPUClaim, decision: binder.Provision, chosen: Preemption,
                       victims: list[preemption.Victim]) -> str:
        """Why a quota of the claim's namespace would refuse it even once the victims are gone ("" if none):
        then preempting would free room for nothing. The victims' own charges (same namespace) are counted
        as given back; the bind itself is charged as any bind."""
        guard = self.commit.quota
        namespace = claim.metadata.namespace or ""
        if guard is None or not guard.limits(namespace, claim.metadata.name):
            return ""
        gone = {v.uid for v in victims if v.namespace == namespace}
        models = []
        for body in self.kube.list_quotas(namespace):
            model = ElasticGPUQuota.model_validate(body)
            kept = [c for c in model.status.charges if c.uid not in gone]
            models.append(model.model_copy(update={"status": model.status.model_copy(update={"charges": kept})}))
        verdict = quota.check(models, uid=claim.metadata.uid or "", class_name=decision.class_name,
                              amount=quota.amount_of(chosen.placement))
        if isinstance(verdict, quota.Exceeded | quota.Unreadable):
            return verdict.message
        return ""
