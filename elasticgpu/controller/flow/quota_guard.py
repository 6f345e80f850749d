"""The quota guard: charges a claim to its namespace's ElasticGPUQuotas before its reservation
is committed, gives the charge back when the reservation fails or the claim is released, and
recomputes every quota from the reservations on resync (docs/quota.md).

# Why charge first

A reservation's commit point is a GPU status write guarded by that card's resourceVersion; a
quota spans many cards, so that write cannot guard it. The quota's own status write, with the
quota's resourceVersion, is the quota's commit point:

    1. charge    ElasticGPUQuota.status.charges += {claim uid, class, cores, memory, cards}
                 (PUT with the quota's resourceVersion, for each quota of the namespace; a 409
                 re-reads the quotas and checks again: two controllers never both fit the last room)
    2. reserve   the GPU write (`Commit.commit`), as before

A charge is keyed by the claim's uid, so a retried bind, or two controllers binding the same
claim, charge it once. A failed reservation does NOT give its charge back: the other controller
may be binding the same claim and have reserved on the strength of that very charge (found
charged, so it wrote nothing); a give-back would leave its reservation uncharged. (The race test
caught exactly that: 350 cores held under a quota of 300.) So charges only ever cover at least
the reservations. A charge with no reservation (a failed reservation, a crash between 1 and 2)
is an over-charge, never an over-use: the resync drops it once it is older than the grace
period. The reverse order could over-use: a reservation with no charge lets another claim take
the room meanwhile. A deleted claim's charge is given back once its reservation is freed
(`release`, `freed`): while its pods still run on the card the reservation stays, and so does
the charge (`decisions.quota_holding` says what a namespace holds). The resync never lowers a
charge within the grace period, nor below what the GPU objects reserve (read live first).

The quotas are read live at each charge (a LIST of the namespace's quotas): the charge must be
written against their current resourceVersions anyway. Which namespaces have a quota at all comes
from the controller's quota watch (the picture's `quotas`), so a bind in a namespace without one
makes no request for quotas; only while that watch is not synced does the guard list them itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Set
from datetime import UTC, datetime

from elasticgpu.allocator import Placement, quota
from elasticgpu.api import GPU, ElasticGPU, ElasticGPUQuota, ObjectReference, QuotaCharge
from elasticgpu.api import quota as quota_keys
from elasticgpu.api.errors import InvalidQuantity
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import quota_holding, running_holders
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.settings import ControllerSettings

logger = logging.getLogger(__name__)


class QuotaExceeded(errors.ControllerError):
    """A quota of the claim's namespace has no room for it (or cannot be read); nothing was
    reserved. `reason` and `message` are for the claim's Pending condition and Event."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _model(body: Body) -> ElasticGPUQuota:
    return ElasticGPUQuota.model_validate(body)


class QuotaGuard:
    """Charges, gives back and recomputes quotas (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture, settings: ControllerSettings) -> None:
        self.kube = kube
        self.picture = picture
        self.settings = settings
        self._lock = threading.Lock()  # guards the fields below; never held across a request
        self._limited: set[str] = set()
        self._known = False  # whether `_limited` comes from a list that worked
        self._limited_at = -1e9  # monotonic seconds of the last list of every quota, worked or not
        self._refreshing = False
        self._fill: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}
        """Per quota (namespace, name): hard key -> (used, hard) as last written or read (the
        quota gauges; the resync refreshes every quota, each charge its own)."""

    def limits(self, namespace: str, claim: str | None = None) -> bool:
        """Whether `namespace` has a quota: from the quota watch (the picture's `quotas`) while it
        is synced, with no request, when that watch has delivered every quota written before
        `claim` (its resourceVersion); when it has not (a quota created just before the claim,
        its watch event not here yet), from one live list of the namespace's quotas, which then
        answers for every claim seen before it; else (an install whose RBAC does not grant watch on quotas,
        a watch that just failed) from a list of every quota at most `QuotaSettings.refresh_s`
        old. Never waits for another thread's list: while one is under way, or after one failed
        (until the next try, `refresh_s` later), the answer is "has one", and charging reads the
        namespace's quotas live. A list that hangs (a half-open connection) so delays only the
        bind that made it, by at most the request timeout, never every bind of the controller."""
        watched = self.picture.quotas.limits(namespace)
        if watched is not None:
            return watched or not self._listed_none(namespace, self._version_of(namespace, claim))
        with self._lock:
            if time.monotonic() - self._limited_at <= self.settings.quota.refresh_s:
                return namespace in self._limited or not self._known
            if self._refreshing:
                return True
            self._refreshing = True
        bodies: list[Body] | None = None
        try:
            bodies = self.kube.list_quotas(None)
        except errors.ApiError as err:
            logger.debug("list of every ElasticGPUQuota failed (binds read their namespace's live): %s", err)
        finally:
            with self._lock:
                self._refreshing = False
                self._limited_at = time.monotonic()
                self._known = bodies is not None
                if bodies is not None:
                    self._limited = {(b.get("metadata") or {}).get("namespace", "") for b in bodies}
        return namespace in self._limited if bodies is not None else True

    def _version_of(self, namespace: str, claim: str | None) -> int | None:
        if claim is None:
            return None
        with self.picture.lock:
            model = self.picture.claim(namespace, claim)
        version = model.metadata.resource_version if model is not None else None
        return int(version) if version is not None and version.isdigit() else None

    def _listed_none(self, namespace: str, claim_version: int | None) -> bool:
        """Whether `namespace` has no quota written before `claim_version`: known from the watch or
        an earlier live list, else listed live now (a failed list counts as "has one": the charge
        then reads the quotas live, and retries)."""
        quotas = self.picture.quotas
        if quotas.covers(namespace, claim_version):
            return True
        upto = max(quotas.latest, claim_version or -1)  # all seen so far was written before the list
        try:
            bodies = self.kube.list_quotas(namespace)
        except errors.ApiError as err:
            logger.debug("live list of the ElasticGPUQuotas of %s failed: %s", namespace, err)
            return False
        if bodies:
            return False  # its watch event is on the way; until then this bind reads them live
        quotas.checked(namespace, upto)
        return True

    def _seen(self, namespace: str, has_quota: bool) -> None:
        with self._lock:
            (self._limited.add if has_quota else self._limited.discard)(namespace)

    def class_of(self, claim_ref: ObjectReference) -> str:
        """The class a claim is provisioned with: the one it names, else the default class."""
        with self.picture.lock:
            claim = self.picture.claim(claim_ref.namespace or "", claim_ref.name or "")
            named = claim.spec.class_name if claim is not None else None
            if named:
                return named
            default = self.picture.view().default_class()
        return (default.metadata.name or "") if default is not None else ""

    def charge(self, claim_ref: ObjectReference, placement: Placement) -> list[str]:
        """Charge the claim for `placement` to every quota of its namespace (guarded writes).
        Returns the quotas this call wrote (to give back if the reservation then fails); raises
        `QuotaExceeded` (having given back what it wrote) when one has no room."""
        namespace, uid = claim_ref.namespace or "", claim_ref.uid or ""
        entry = quota.charge_for(claim=claim_ref.name or "", uid=uid, class_name=self.class_of(claim_ref),
                                 amount=quota.amount_of(placement))
        written: list[str] = []
        if not self.limits(namespace, claim_ref.name):
            return written
        for _attempt in range(self.settings.binding.conflict_retries):
            quotas = [_model(b) for b in self.kube.list_quotas(namespace)]
            self._seen(namespace, bool(quotas))
            verdict = quota.check(quotas, uid=uid, class_name=entry.class_name, amount=quota.amount_of(placement))
            if isinstance(verdict, quota.Exceeded | quota.Unreadable):
                self.give_back(namespace, uid, only=written)
                reason = quota.REASON_QUOTA_EXCEEDED if isinstance(verdict, quota.Exceeded) else \
                    quota.REASON_INVALID_QUOTA
                raise QuotaExceeded(reason, verdict.message)
            try:
                for model in quotas:
                    if quota.holds(model, entry):
                        continue
                    self._put(model, quota.status_with(model, entry))
                    written.append(model.metadata.name or "")
            except errors.Conflict:
                logger.debug("quota of %s changed while charging claim %s; checking again", namespace, entry.claim)
                continue
            return written
        self.give_back(namespace, uid, only=written)
        raise errors.BindingError(f"claim {namespace}/{entry.claim}: its namespace's ElasticGPUQuotas kept changing"
                                  " while it was charged; retrying later")

    def read(self, namespace: str, claim: str | None = None) -> list[ElasticGPUQuota]:
        """The quotas of `namespace` (for deciding whether room may be kept for a waiter, which
        must agree with the charge its bind would make): none, with no request, where it has
        none (`limits`); else read live. Raises `errors.ApiError` when they cannot be read."""
        if not self.limits(namespace, claim):
            return []
        return [_model(b) for b in self.kube.list_quotas(namespace)]

    def give_back(self, namespace: str, uid: str, *, only: list[str] | None = None) -> None:
        """Remove the charge of claim `uid` from the namespace's quotas (`only`: from these)."""
        if (only is not None and not only) or (only is None and not self.limits(namespace)):
            return  # nothing written, or no quota in the namespace to hold a charge
        for _attempt in range(self.settings.binding.conflict_retries):
            try:
                for model in (_model(b) for b in self.kube.list_quotas(namespace)):
                    if only is not None and model.metadata.name not in only:
                        continue
                    if any(c.uid == uid for c in model.status.charges):
                        self._put(model, quota.status_without(model, uid))
            except errors.Conflict:
                continue
            return
        # Left to the resync, which drops a charge with no reservation after the grace period.
        logger.warning("could not give back the quota charge of claim uid %s in %s; the resync will", uid, namespace)

    def release(self, namespace: str, uid: str, egpu_name: str) -> None:
        """The claim `uid` is gone (its finalizer removed): give its charge back now unless the
        namespace still holds its reservation (`quota_holding`: its pods still run on the card,
        or its ElasticGPU is being reclaimed). Then `freed` gives it back once the ElasticGPU's
        sync has freed the reservation, or the resync does."""
        if uid in self._held(namespace, gone={uid}, only=egpu_name):
            return
        self.give_back(namespace, uid)

    def freed(self, egpu: ElasticGPU) -> None:
        """`egpu`'s reservation was freed: give back its claim's charge (the claim holds one
        ElasticGPU, so it holds nothing now)."""
        ref = egpu.spec.claim_ref
        if ref is not None and ref.uid and ref.namespace:
            self.give_back(ref.namespace, ref.uid)

    def resync(self) -> None:
        """Recompute every quota from the reservations (guarded writes; a conflict leaves that
        quota to the next resync). The reservations come from the picture; where that would lower
        or drop a charge they are read again live first: a charge never drops below what the
        API server's GPU objects reserve, even while the GPU watch lags."""
        try:
            bodies = self.kube.list_quotas(None)
        except errors.ApiError as err:
            logger.debug("quota resync: list failed: %s", err)
            return
        now = datetime.now(UTC)
        live: dict[str, GPU] | None = None
        seen: set[tuple[str, str]] = set()
        for model in (_model(b) for b in bodies):
            namespace = model.metadata.namespace or ""
            seen.add((namespace, model.metadata.name or ""))
            self._note(model, quota.status_of(model, list(model.status.charges)))
            charges = self._recompute(model, now, None)
            if quota.lowers(model.status.charges, charges):
                if live is None:
                    try:
                        live = {(b.get("metadata") or {}).get("name", ""): GPU.model_validate(b)
                                for b in self.kube.list_gpus()}
                    except errors.ApiError as err:
                        logger.debug("quota resync: GPU list failed, no charge lowered: %s", err)
                        return
                charges = self._recompute(model, now, live)
            status = quota.status_of(model, charges)
            if status == quota.status_of(model, list(model.status.charges)) and model.status.summary.cores:
                continue
            try:
                self._put(model, status)
            except (errors.Conflict, errors.NotFound):
                logger.debug("quota %s/%s changed during the resync; the next one repairs it", namespace,
                             model.metadata.name)
                continue
        with self._lock:
            for key in set(self._fill) - seen:
                del self._fill[key]  # the quota was deleted

    def _recompute(self, model: ElasticGPUQuota, now: datetime, live: dict[str, GPU] | None) -> list[QuotaCharge]:
        """The charges `model` should hold, from the picture's GPUs or (`live`) those read live."""
        namespace = model.metadata.namespace or ""
        holding = {}
        for uid, held in self._held(namespace, live=live).items():
            ref = ObjectReference(namespace=namespace, name=held.name, uid=uid)
            amount = quota.Amount(cores=held.cores, memory_mib=held.memory, cards=held.cards)
            holding[uid] = quota.charge_for(claim=held.name, uid=uid, class_name=self.class_of(ref), amount=amount)
        return quota.recompute(model, holding=holding, now=now, grace_s=self.settings.resync.orphan_grace_s)

    def _held(self, namespace: str, *, live: dict[str, GPU] | None = None, gone: Set[str] = frozenset(),
              only: str | None = None) -> dict[str, quota_holding.Held]:
        """By claim uid, what the namespace holds on the cards (`quota_holding.held_by`): from the
        picture, or from `live` GPUs; `gone`: claims to count as gone whatever the picture says;
        `only`: just the cards that hold that ElasticGPU."""
        with self.picture.lock:
            ledger = self.picture.ledger
            lookup = live.get if live is not None else ledger.gpu
            gpu_names = (ledger.gpus_holding(only) if only is not None
                         else list(live) if live is not None else ledger.gpu_names())
            gpus = [g for name in gpu_names if (g := lookup(name)) is not None]
            alive = set()  # the claims the reservations name that exist (looked up one by one, not all claims)
            for model in gpus:
                for allocation in model.status.allocations:
                    ref = allocation.claim_ref
                    if ref is None or ref.namespace != namespace or not ref.uid or ref.uid in gone:
                        continue
                    claim = self.picture.claim(namespace, ref.name or "")
                    if claim is not None and claim.metadata.uid == ref.uid:
                        alive.add(ref.uid)

            nodes = self.picture.nodes
            now = time.time()

            def handed(egpu_name: str) -> bool:
                egpu = self.picture.egpu(egpu_name)
                return egpu is not None and quota_holding.handed_to_admin(egpu)

            def expired(gpu: GPU) -> str:
                return running_holders.expired_reason(
                    gpu, now=now, expire_after_s=self.settings.gpu_health.running_claims_expire_s,
                    node_gone_for_s=nodes.gone_for(gpu))

            return quota_holding.held_by(namespace, gpus=gpus, alive=alive, handed=handed, gpu=lookup,
                                         expired=expired)

    def _put(self, model: ElasticGPUQuota, status: dict[str, object]) -> None:
        body = model.to_dict()
        body["status"] = status
        body["metadata"] = {"name": model.metadata.name, "namespace": model.metadata.namespace,
                            "resourceVersion": model.metadata.resource_version}
        self.kube.replace_quota_status(body)
        self._note(model, status)

    def _note(self, model: ElasticGPUQuota, status: Mapping[str, object]) -> None:
        """Remember used and hard of each key of `status` (the quota gauges)."""
        fill: dict[str, tuple[int, int]] = {}
        hard, used = status.get("hard"), status.get("used")
        if isinstance(hard, Mapping) and isinstance(used, Mapping):
            for key, limit in hard.items():
                try:
                    resource = quota_keys.split_key(str(key))[1]
                    fill[str(key)] = (quota_keys.parse_amount(resource, used.get(key, 0), field=f"status.used[{key}]"),
                                      quota_keys.parse_amount(resource, limit, field=f"status.hard[{key}]"))
                except InvalidQuantity:
                    continue  # the CRD refuses such values; a gauge is not the place to say so
        with self._lock:
            self._fill[(model.metadata.namespace or "", model.metadata.name or "")] = fill

    def fill(self) -> list[tuple[str, str, str, int, int]]:
        """(namespace, quota, key of spec.hard, used, hard) of every quota last seen (the gauges)."""
        with self._lock:
            return [(ns, name, key, used, hard) for (ns, name), keys in sorted(self._fill.items())
                    for key, (used, hard) in sorted(keys.items())]
