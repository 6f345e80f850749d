"""The ElasticGPU sync: ask `binder.decide_elastic_gpu` for an ElasticGPU's next step and carry
it out (reserve its capacity, set its phase, release it, reclaim it).

Every failure leaves the objects as they were after the last successful write and raises; the
worker retries the key.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from elasticgpu.allocator import Placement
from elasticgpu.api import GPU, ElasticGPU, ElasticGPUClaim, accounting, names
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, release, running_holders
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.commit import Commit
from elasticgpu.controller.flow.binding.provisioner import capacity_of, provisioned_for_its_claim
from elasticgpu.controller.flow.machinery.events import NORMAL, WARNING, EventRecorder
from elasticgpu.controller.flow.machinery.workqueue import WorkQueue
from elasticgpu.controller.metrics import ControllerMetrics
from elasticgpu.controller.picture.picture import Body, Picture
from elasticgpu.controller.picture.reservations import now_rfc3339
from elasticgpu.controller.settings import GPUHealthSettings

logger = logging.getLogger(__name__)


def routine_reclaim(egpu: ElasticGPU) -> bool:
    """True for an ElasticGPU the controller provisioned for a claim (`provisioned_for_its_claim`) whose
    reclaim policy is Delete: its release and deletion follow the claim's (for an inline claim, the
    pod's) on their own, once per pod, and nobody has anything to do, so they get no Normal Event
    (issue 37: two Events per pod deletion, each costing the API server a write; the PV controller
    writes none when it deletes a released volume either). The log keeps them; Warnings, a static
    ElasticGPU and one that is retained (an admin must act) keep their Events."""
    return egpu.spec.reclaim_policy == "Delete" and provisioned_for_its_claim(egpu)


class ElasticGPUSync:
    """Syncs one ElasticGPU at a time; also writes ElasticGPU status for the claim sync."""

    def __init__(self, *, kube: KubeApi, picture: Picture, queue: WorkQueue, events: EventRecorder,
                 commit: Commit, settings: GPUHealthSettings | None = None) -> None:
        """`settings`: when the agents' running-claims reports expire (`running_holders`)."""
        self.kube = kube
        self.settings = settings or GPUHealthSettings()
        self.picture = picture
        self.queue = queue
        self.events = events
        self.metrics: ControllerMetrics | None = None
        """Counts releases when set (`Operability` sets it)."""
        self.commit = commit
        self._lock = threading.Lock()
        self._rechecks_due: dict[str, float] = {}
        """ElasticGPUs kept for a running holder: when their delayed recheck is due (monotonic)."""
        self._said_in_use: set[str] = set()
        """Uids of the ElasticGPUs being deleted whose in-use Event this process wrote."""

    def put(self, body: Body) -> ElasticGPU:
        """Take a write's answer into the picture (queueing what it wakes); its model."""
        model, keys = self.picture.put_egpu(body)
        self.queue.add_all(keys)
        return model

    def set_status(self, egpu: ElasticGPU, placement: Placement | None, phase: str, reason: str,
                   message: str, *, event: bool = True) -> ElasticGPU:
        """Write the ElasticGPU's status (phase, reason, message; capacity, node and cards from
        `placement`); an Event when the phase changes and `event`.

        The write carries the resourceVersion `egpu` was read at: a controller with a stale
        picture must never turn a Released or Failed ElasticGPU back into Bound. A 409 re-reads
        it into the picture and raises Conflict (the next sync decides from what it finds)."""
        # A reason that only repeats the phase (Bound, Available, Released) is not written: the
        # REASON column stays empty unless it says something; the Event keeps the reason.
        status: Body = {"phase": phase, "reason": None if reason == phase else reason, "message": message}
        if placement is not None:
            status["capacity"] = capacity_of(placement)
            status["nodeName"] = placement.node
            status["gpus"] = [share.uuid for share in placement.cards]
            status["gpuList"] = ",".join(status["gpus"])  # the GPUS column of kubectl get egpu
        ref = egpu.spec.claim_ref
        if ref is not None and ref.name:
            status["claim"] = f"{ref.namespace}/{ref.name}"  # the CLAIM column
        # Accounting (issue 38): a period that this write closes (phase leaves Bound, or a resize)
        # is folded into the closed sums in this same patch, under the same resourceVersion, so
        # the fold happens exactly once and with the change that caused it (api/accounting.py).
        folded = accounting.fold(accounting.view(egpu), phase=phase, capacity=status.get("capacity"),
                                 now=time.time())
        if folded is not None:
            status["accounting"] = folded
        name = egpu.metadata.name or ""
        patch = {"metadata": {"resourceVersion": egpu.metadata.resource_version}, "status": status}
        try:
            answer = self.kube.patch_elastic_gpu_status(name, patch)
        except errors.Conflict:
            with contextlib.suppress(errors.NotFound):
                self.put(self.kube.get_elastic_gpu(name))
            raise
        written = self.put(answer)
        if phase == "Released" and egpu.status.phase != phase and self.metrics is not None:
            self.metrics.released()
        if event and egpu.status.phase != phase:
            kind = WARNING if phase == "Failed" else NORMAL
            if phase == "Released" and routine_reclaim(egpu):
                logger.info("ElasticGPU %s: %s: %s", name, reason, message)  # no Event: see routine_reclaim
            else:
                self.events.record(answer, type_=kind, reason=reason, message=message)
        return written

    def set_phase(self, egpu: ElasticGPU, phase: str, reason: str, message: str) -> ElasticGPU:
        """`set_status` with the placement the GPUs hold for it."""
        placement = self.picture.ledger.held(egpu.metadata.name or "")
        return self.set_status(egpu, placement, phase, reason, message)

    def sync(self, name: str) -> bool:
        """Decide and carry out the next step of one ElasticGPU. True when it is kept as it is
        (or gone): the periodic resync may leave it alone until it changes (`settled.SettledKeys`)."""
        picture = self.picture
        egpu = picture.egpu(name)
        if egpu is None:
            return True
        if self.commit.holds_outside_spec(egpu):
            # OBSERVATION: the GPUs hold this ElasticGPU on cards its spec does not name (the
            # loser of a provisioning race reserved them): free those first, or the decision
            # below would see a placement that disagrees with the spec and fail it.
            self.commit.free_extra_cards(egpu)
        with picture.lock:
            egpu = picture.egpu(name)
            if egpu is None:
                return True
            claim = None
            ref = egpu.spec.claim_ref
            if ref is not None and ref.name:
                claim = picture.claim(ref.namespace or "", ref.name)
            ledger = picture.ledger
            held_after_failure = egpu.status.phase == "Failed" and bool(ledger.gpus_holding(name))
            decision = binder.decide_elastic_gpu(
                egpu, claim=claim, gpus=ledger.gpu, held=ledger.held(name), conflict=ledger.conflict
            )
        if isinstance(decision, binder.Keep):
            if egpu.metadata.deletion_timestamp and ref is not None and ref.name:
                # OBSERVATION: being deleted while its claim uses it: the finalizer holds it.
                self._say_in_use(egpu, f"{ref.namespace}/{ref.name}")
            elif egpu.status.phase == "Bound":
                self.commit.stamp_claim_ref(egpu)
            elif egpu.status.phase == "Failed" and held_after_failure:
                # OBSERVATION: Failed, and its reservation kept while its claim still ran on the card:
                # free it once the agent no longer reports the claim running.
                self._free_unless_running(egpu)
            return True
        if isinstance(decision, binder.Reserve):
            self._reserve(egpu, decision.placement, claim)
        elif isinstance(decision, binder.Fail):
            # Failed first (its claim becomes Lost at once), then the reservation: kept while the node's
            # agent still reports the claim running on the card. A crash between the two leaves a Failed
            # ElasticGPU that holds its reservation, which the Keep branch above frees.
            if egpu.status.phase != "Failed" or egpu.status.reason != decision.reason:
                egpu = self.set_status(egpu, None, "Failed", decision.reason, decision.message)
            self._free_unless_running(egpu)
            if ref is not None and ref.name:
                self.queue.add(("claim", ref.namespace or "", ref.name))
        elif isinstance(decision, binder.StayPending):
            if (egpu.status.phase, egpu.status.reason, egpu.status.message) != (
                    "Pending", decision.reason, decision.message):
                answer = self.set_status(egpu, None, "Pending", decision.reason, decision.message, event=False)
                self.events.record(self.picture.egpu_body(name) or answer.to_dict(), type_=WARNING,
                                   reason=decision.reason, message=decision.message)
        elif isinstance(decision, binder.MarkBound):
            self.set_phase(egpu, "Bound", binder.REASON_BOUND, f"bound to claim {ref.namespace}/{ref.name}"
                           if ref else "bound")
        elif isinstance(decision, binder.ReleaseIfClaimGone):
            self._release_if_claim_gone(egpu)
        elif isinstance(decision, binder.Reclaim):
            self._reclaim(egpu, delete=decision.delete)
        return False

    def _reserve(self, egpu: ElasticGPU, placement: Placement, claim: ElasticGPUClaim | None) -> None:
        name = egpu.metadata.name or ""
        if names.FINALIZER_EGPU_PROTECTION not in egpu.metadata.finalizers:
            patch = {"metadata": {"finalizers": [*egpu.metadata.finalizers, names.FINALIZER_EGPU_PROTECTION],
                                  "resourceVersion": egpu.metadata.resource_version}}
            egpu = self.put(self.kube.patch_elastic_gpu(name, patch))
        if self.picture.ledger.held(name) != placement:
            try:
                self.commit.commit(name, placement, egpu.spec.claim_ref)
            except (errors.Conflict, errors.Rejected):
                self.queue.add(("egpu", name))  # the card changed: decide again (maybe DoesNotFit)
                return
        if claim is not None and binder.points_to(egpu, claim) and claim.spec.elastic_gpu_name == name:
            self.set_status(egpu, placement, "Bound", binder.REASON_BOUND,
                            f"bound to claim {claim.metadata.namespace}/{claim.metadata.name}")
        else:
            self.set_status(egpu, placement, "Available", binder.REASON_AVAILABLE,
                            f"reserved on {placement.describe()}")
        if egpu.spec.claim_ref is not None and egpu.spec.claim_ref.name:
            self.queue.add(("claim", egpu.spec.claim_ref.namespace or "", egpu.spec.claim_ref.name))

    def _say_in_use(self, egpu: ElasticGPU, claim: str) -> None:
        """One Warning Event per deletion (per process) naming the claim that keeps `egpu`: without
        it `kubectl delete egpu` hangs on the finalizer and nothing says why."""
        key = egpu.metadata.uid or egpu.metadata.name or ""
        with self._lock:
            if key in self._said_in_use:
                return
            self._said_in_use.add(key)
        name = egpu.metadata.name or ""
        namespace, _, claim_name = claim.partition("/")
        self.events.record(self.picture.egpu_body(name) or egpu.to_dict(), type_=WARNING, reason=binder.REASON_IN_USE,
                           message=f"ElasticGPU {name} is bound to claim {claim}: its deletion waits for the claim"
                           f" to go; delete the claim (kubectl delete egpuc -n {namespace} {claim_name}) when no"
                           " pod needs it any more")

    def _release_if_claim_gone(self, egpu: ElasticGPU) -> None:
        ref = egpu.spec.claim_ref
        assert ref is not None and ref.name
        try:
            fresh = self.kube.get_claim(ref.namespace or "", ref.name)
        except errors.NotFound:
            fresh = None
        if fresh is not None and (not ref.uid or fresh["metadata"].get("uid") == ref.uid):
            self.picture.put_claim(fresh)
            if not fresh["metadata"].get("deletionTimestamp"):
                self.queue.add(("claim", ref.namespace or "", ref.name))
                return
            if names.FINALIZER_CLAIM_PROTECTION in (fresh["metadata"].get("finalizers") or []):
                return  # its own release path runs
        if egpu.status.phase == "Bound" and (self._pods_still_using(egpu) or self._keep_while_running(egpu)):
            # OBSERVATION: the claim is gone (its finalizer removed by hand) but a pod that used it still runs, or
            # the node's agent reports its containers on the card: the card is still theirs, so the ElasticGPU
            # stays Bound and accounted (issue 44 item 5: Released stopped the bill while the card stayed
            # reserved and charged). The pod's departure, or the agent's GPU write, wakes it; so does the recheck.
            self._recheck(egpu.metadata.name or "")
            return
        self.set_phase(egpu, "Released", binder.REASON_RELEASED, f"claim {ref.namespace}/{ref.name} was deleted")
        self.queue.add(("egpu", egpu.metadata.name or ""))

    def _pods_still_using(self, egpu: ElasticGPU) -> list[str]:
        """The pods, bound to a node and not terminated, that name `egpu`'s claim (which is gone): they run with its
        card, so the ElasticGPU stays theirs (Bound, accounted) until they are gone."""
        ref = egpu.spec.claim_ref
        if ref is None or not ref.name:
            return []
        namespace = ref.namespace or ""
        with self.picture.lock:
            users = sorted(self.picture.pods_using(namespace, ref.name))
            bodies = [self.picture.pods.pod(namespace, pod) for pod in users]
        return [f"{namespace}/{(body.get('metadata') or {}).get('name', '')}" for body in bodies
                if body is not None and (body.get("spec") or {}).get("nodeName") and release.pod_is_running(body)]

    def _running_holders(self, egpu: ElasticGPU) -> list[running_holders.RunningHolder]:
        """The claims the agents report running on the cards of `egpu`'s reservation (those whose report
        expired, or every one when an admin forced the release, carry why they keep nothing)."""
        name = egpu.metadata.name or ""
        now = time.time()
        expire_s = self.settings.running_claims_expire_s
        force = running_holders.forced(egpu)
        with self.picture.lock:
            ledger, nodes = self.picture.ledger, self.picture.nodes

            def expired(gpu: GPU) -> str:
                if force:
                    return f"an admin set {names.ANNOTATION_FORCE_RELEASE}=true on ElasticGPU {name}"
                return running_holders.expired_reason(gpu, now=now, expire_after_s=expire_s,
                                                      node_gone_for_s=nodes.gone_for(gpu))

            return running_holders.holders_of(name, claim_ref=egpu.spec.claim_ref,
                                              gpu_names=ledger.gpus_holding(name), gpus=ledger.gpu, expired=expired)

    def _keep_while_running(self, egpu: ElasticGPU) -> bool:
        """True while the node's agent reports `egpu`'s claim running on a card of its reservation: the
        reservation must stay (freeing it would give the card to a second claim while the first runs).
        Says so once (condition `ReleasePending`, an Event) and rechecks after a delay; the agent's GPU
        write when the containers stop wakes it sooner. A report no longer believed (its node gone, its
        agent silent too long, an admin's annotation) keeps nothing, and a Warning Event says why."""
        reported = self._running_holders(egpu)
        holders = running_holders.running(reported)
        name = egpu.metadata.name or ""
        if not holders:
            with self._lock:
                self._rechecks_due.pop(name, None)
            expired = [holder for holder in reported if holder.expired]
            if expired:
                message = (f"{running_holders.describe(expired)} by the agent's last report, which is no longer"
                           f" believed: {expired[0].expired}; the reservation is freed")
                self.events.record(self.picture.egpu_body(name) or egpu.to_dict(), type_=WARNING,
                                   reason=running_holders.REASON_REPORT_EXPIRED, message=message)
            return False
        condition = running_holders.release_pending_condition(
            egpu, holders, now=now_rfc3339(), expire_after_s=self.settings.running_claims_expire_s)
        previous = next((c for c in egpu.status.conditions if c.type == condition["type"]), None)
        if previous is None or (previous.status, previous.reason, previous.message) != (
                condition["status"], condition["reason"], condition["message"]):
            answer = self._write_conditions(egpu, condition)
            if previous is None or previous.status != "True":
                self.events.record(answer, type_=WARNING, reason=running_holders.REASON_CLAIM_STILL_RUNNING,
                                   message=condition["message"])
        self._recheck(name)
        return True

    def _recheck(self, name: str) -> None:
        """Look at `name` again in `RECHECK_S` unless a look is already due by then (one per wait, not one
        per GPU event). A recheck, not a retry: nothing is left to do until it is due."""
        now = time.monotonic()
        with self._lock:
            due = self._rechecks_due.get(name)
            if due is not None and now < due:
                return
            self._rechecks_due[name] = now + running_holders.RECHECK_S
        self.queue.add(("egpu", name), delay_s=running_holders.RECHECK_S, recheck=True)

    def _write_conditions(self, egpu: ElasticGPU, condition: dict[str, str]) -> Body:
        """Replace (or add) one condition of `egpu`'s status, guarded by the resourceVersion it was read at."""
        name = egpu.metadata.name or ""
        kept = [c.to_dict() for c in egpu.status.conditions if c.type != condition["type"]]
        patch = {"metadata": {"resourceVersion": egpu.metadata.resource_version},
                 "status": {"conditions": sorted([*kept, condition], key=lambda c: str(c.get("type")))}}
        try:
            answer = self.kube.patch_elastic_gpu_status(name, patch)
        except errors.Conflict:
            with contextlib.suppress(errors.NotFound):
                self.put(self.kube.get_elastic_gpu(name))
            raise
        self.put(answer)
        return answer

    def _free_unless_running(self, egpu: ElasticGPU) -> None:
        """Free `egpu`'s reservation unless its claim still runs there; then say the release is done."""
        if self._keep_while_running(egpu):
            return
        self.commit.free_reservation(egpu.metadata.name or "")
        if self.commit.quota is not None:
            self.commit.quota.freed(egpu)  # the charge follows the reservation, not the claim
        pending = next((c for c in egpu.status.conditions if c.type == running_holders.CONDITION_RELEASE_PENDING
                        and c.status == "True"), None)
        if pending is not None:
            self._write_conditions(egpu, {
                "type": running_holders.CONDITION_RELEASE_PENDING, "status": "False",
                "reason": running_holders.REASON_NO_RUNNING_HOLDER, "lastTransitionTime": now_rfc3339(),
                "message": "the agent no longer reports the claim running on the card: the reservation is freed"})

    def _reclaim(self, egpu: ElasticGPU, *, delete: bool) -> None:
        name = egpu.metadata.name or ""
        if self._keep_while_running(egpu):
            return  # the finalizer stays too: a reservation with no ElasticGPU would look like an orphan
        self.commit.free_reservation(name)
        if self.commit.quota is not None:
            self.commit.quota.freed(egpu)  # the charge follows the reservation, not the claim
        if names.FINALIZER_EGPU_PROTECTION in egpu.metadata.finalizers:
            kept = [f for f in egpu.metadata.finalizers if f != names.FINALIZER_EGPU_PROTECTION]
            try:
                answer = self.kube.patch_elastic_gpu(
                    name, {"metadata": {"finalizers": kept, "resourceVersion": egpu.metadata.resource_version}})
            except errors.NotFound:
                return
            self.put(answer)
        if delete and not egpu.metadata.deletion_timestamp:
            with contextlib.suppress(errors.NotFound):
                self.kube.delete_elastic_gpu(name, uid=egpu.metadata.uid)
            message = f"reclaim policy Delete: capacity freed and ElasticGPU {name} deleted"
            if routine_reclaim(egpu):
                logger.info("ElasticGPU %s: Reclaimed: %s", name, message)  # no Event: see routine_reclaim
            else:
                self.events.record(self.picture.egpu_body(name) or egpu.to_dict(), type_=NORMAL, reason="Reclaimed",
                                   message=message)

