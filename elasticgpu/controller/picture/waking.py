"""Which keys a change wakes: the picture's indexes from an object to the objects whose sync may
now decide differently (the pods of a claim, the claims of an ElasticGPU, the ElasticGPUs on a
card, the claims a GPU event may move on in a resize), and the measures that tell whether a GPU
event freed room. `Waking` reads the maps `Reading` keeps and keeps the two ElasticGPU indexes in
step; `TakingIn` (taking_in.py) calls it for every object it takes in.
"""

from __future__ import annotations

from typing import Any

from elasticgpu.api import ElasticGPU, names
from elasticgpu.controller.decisions import binder
from elasticgpu.controller.picture import compact, pod_index, reading

Body = reading.Body
ClaimKey = reading.ClaimKey
Keys = reading.Keys


class Waking(reading.Reading):
    """The keys a change wakes, and the ElasticGPU indexes they are read from; see the module docstring."""

    def _isolation_of(self, gpu_name: str) -> frozenset[str]:
        """The isolation modes GPU `gpu_name` offers in the picture (none when unknown)."""
        record = self.ledger.gpu_record(gpu_name)  # no model built: every GPU event asks, before its take-in
        return record.card.isolation if record is not None else frozenset()


    def _index_cards(self, name: str, old: ElasticGPU | None, new: ElasticGPU | None) -> None:
        before = set(binder.cards_of(old)) if old is not None else set()
        after = set(binder.cards_of(new)) if new is not None else set()
        for gpu_name in before - after:
            _discard(self._egpus_on, gpu_name, name)
        for gpu_name in after - before:
            self._egpus_on.setdefault(gpu_name, set()).add(name)

    def _index_uid(self, name: str, old: ElasticGPU | None, new: ElasticGPU | None) -> None:
        old_uid = old.spec.claim_ref.uid if old is not None and old.spec.claim_ref is not None else None
        new_uid = new.spec.claim_ref.uid if new is not None and new.spec.claim_ref is not None else None
        if old_uid and old_uid != new_uid and self._by_claim_uid.get(old_uid) == name:
            del self._by_claim_uid[old_uid]
        if new_uid:
            self._by_claim_uid[new_uid] = name

    def _free_of(self, gpu_name: str) -> int:
        """A measure of the card's free room that grows when room appears: a card new to the
        picture or Healthy again counts as more room than any Unhealthy or absent one."""
        record = self.ledger.gpu_record(gpu_name)  # no model built: every GPU event asks, before its take-in
        if record is None or record.said_unhealthy:
            return -(1 << 62)
        return -sum(cores + memory for _key, cores, memory, _whole in record.all_shares())

    def _allocation_sizes(self, gpu_name: str) -> dict[str, tuple[int, int, Any]]:
        """Each allocation's (cores, memory, limit) on a GPU, as the picture holds it."""
        record = self.ledger.gpu_record(gpu_name)  # no model built: every GPU event asks, before its take-in
        return record.sizes() if record is not None else {}

    def _resizing_claims_on(self, gpu_name: str, *, freed: bool,
                            sizes: dict[str, tuple[int, int, Any]] | None = None) -> Keys:
        """The claims a GPU event may move on in a resize (issue 17): those with a shrink under
        way (a limit on their allocation: the agent may have applied it), those whose allocation
        changed size (another controller resized it: the claim's status follows), and, when room
        freed, every claim on the card (one may wait for room to expand)."""
        model = self.ledger.gpu(gpu_name)
        if model is None:
            return []
        return [("claim", a.claim_ref.namespace or "", a.claim_ref.name) for a in model.status.allocations
                if a.claim_ref is not None and a.claim_ref.name
                and (freed or a.limit is not None
                     or (sizes is not None and a.elastic_gpu in sizes
                         and sizes[a.elastic_gpu] != (a.cores, a.memory, a.limit)))]

    def _egpus_on_gpu(self, gpu_name: str) -> list[str]:
        return sorted(self._egpus_on.get(gpu_name, ()))

    def _egpu_for_claim_uid(self, uid: str) -> str | None:
        if not uid:
            return None
        name = names.elastic_gpu_name_for_claim(uid)
        if name in self._egpus:
            return name
        return self._by_claim_uid.get(uid)

    def _claims_of_egpu(self, name: str, body: Body) -> Keys:
        keys: Keys = []
        ref = (body.get("spec") or {}).get("claimRef") or {}
        if ref.get("name"):  # the picture's own strings, as `TakingIn.observe` says why
            keys.append(("claim", compact.own(str(ref.get("namespace", ""))), compact.own(str(ref["name"]))))
        naming = sorted(compact.index_members(self._claims_naming, name))
        keys += [("claim", ns, claim_name) for ns, claim_name in naming]
        return keys

    def _pods_of_claim(self, key: ClaimKey, body: Body) -> Keys:
        """The pods a claim's change may unblock: those that use it, and the pod that owns it."""
        keys: Keys = [("pod", key[0], pod) for pod in sorted(self._pod_claims.get(key, ()))]
        owner = pod_index.owner_pod(body)
        if owner is not None and owner[0] not in self._pod_claims.get(key, ()):
            keys.append(("pod", key[0], compact.own(owner[0])))
        return keys


def _discard(index: dict[str, set[Any]], key: str, member: Any) -> None:
    """Remove `member` from `index[key]`, and the entry once empty (no empty set per object ever seen)."""
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]
