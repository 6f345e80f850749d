"""The CRI hook while the agent's parts are not all open: the socket serves, only claims wait.

The agent serves kubelet's socket before it has opened the device backend, the ledger and the
API client (starting.py), because kubelet reaches the runtime of every pod through it:

    GatedView    injection.AgentView: the API server's `claim_view.ClaimView` once the API client
                 is open; before, `not_ready_reason` names what is missing (a claim container is
                 refused with it, retryable), `node_gpu_access` cannot tell (None) and
                 `has_cards` is unknown (None), so a container without a claim starts as always
                 (with NVIDIA_VISIBLE_DEVICES=void); where the admin turned the refusal of
                 privileged containers on (--refuse-privileged), a privileged one is refused,
                 retryably, as on a node with cards, until discovery has run (issue 23.6): the
                 node's own privileged GPU pods (the driver's, which NVML may be waiting for)
                 pass in kube-system or a namespace labelled elasticgpu.io/node-gpu-access, once
                 the API client can read the label.
    GatedHooks   hooks.ContainerHooks: `claim_hooks.ClaimHooks` on the ledger once it is open;
                 before, containers without a claim get injection.decide's edit (no ledger row:
                 they hold nothing), a claim container is refused UNAVAILABLE with what is not
                 ready, RemoveContainer records nothing (the start-up reconciliation releases the
                 rows of containers gone meanwhile). Once the ledger opens, the start-up
                 reconciliation runs (`settle`, from the CRI hook's loop or the proxy's own
                 reconciler, whichever comes first) and claims are taken after it.
                 `wrap` (the agent's MIG room, agent/mig/room.py) may put hooks around the
                 claim hooks; the proxy's calls go through what it returns (None: not yet,
                 the gate stays closed), so nothing here knows about MIG.

A ledger that was moved aside as corrupt (`owed_rebuild`) is rebuilt before that first
reconciliation, from the runtime's containers (`rebuild`): every container the agent gave a
claim carries the annotation `elasticgpu.io/claim: <namespace>/<name>` and kubelet's pod labels;
its cards and size are the claim's as the controller bound it (its status and ElasticGPU, through the
view: only the controller writes them), never the container's environment: a tenant's image or pod
spec may set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1 in a whole-card container, and a row rebuilt from it
would let another claim's slice onto that card (issue 44.7). While claims cannot be read (the API
client not open yet, the API server out of reach) the rebuild, and with it the start-up
reconciliation, waits (`LedgerRebuildWaits`: `settle` is retried by the CRI hook's loop, a front's
reconcile returns without it; claims are refused as not ready meanwhile, as they would be without the
API server anyway). A claim that is gone, or bound elsewhere now, is recorded as whole cards of those
the container was given (NVIDIA_VISIBLE_DEVICES as the agent wrote it): the card check then refuses
every other claim on them until the container ends, which can waste a card but never serves one
twice. Each becomes a `created` row, so the holders and card checks see it as if nothing was lost. A
container holding a MIG instance also carries `elasticgpu.io/mig-instance` (`mig_annotation`):
its card, size and ElasticGPU go on its row and the instance's `mig_instances` row is recorded
again, so the start-up convergence keeps the instance (held) instead of leaving it as an
admin's, and the removal of its last holder destroys it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

import grpc

from elasticgpu.agent import isolation, rdma
from elasticgpu.agent.errors import KubeError, LedgerRebuildWaits, LedgerStateError
from elasticgpu.agent.injecting import claim_hooks, dra_containers, hooks, injection, limits_file, mig_annotation
from elasticgpu.agent.ledger.models import KIND_DRA, MIG_CREATED
from elasticgpu.agent.ledger.store import LedgerStore
from elasticgpu.api import names

log = logging.getLogger(__name__)

Wrap = Callable[[claim_hooks.ClaimHooks, injection.AgentView, LedgerStore], hooks.ContainerHooks | None]
"""Hooks around the claim hooks, given the view and the ledger (None: cannot be made yet)."""


class GatedView:
    """injection.AgentView before and after the API client is open (see the module docstring)."""

    def __init__(
        self,
        *,
        node_name: str,
        view: Callable[[], injection.AgentView | None],
        not_ready: Callable[[], str | None],
    ) -> None:
        """`view`: the API server's view once it can be made, else None; `not_ready`: what of the
        agent is not open yet (device backend, ledger, API client), or None."""
        self._node_name = node_name
        self._view = view
        self._not_ready = not_ready

    @property
    def node_name(self) -> str:
        """This node."""
        return self._node_name

    def not_ready_reason(self) -> str | None:
        """What of the agent is not open yet and why the API server's view is not ready, or None."""
        view = self._view()
        reasons = [self._not_ready(), None if view is None else view.not_ready_reason()]
        if view is None and reasons[0] is None:
            reasons[1] = "the API client is not open yet"
        found = [reason for reason in reasons if reason is not None]
        return "; ".join(found) if found else None

    def claim(self, namespace: str, name: str) -> injection.ClaimInfo | None:
        """The claim from the API server's view; raises while there is none (refused, retryable)."""
        view = self._view()
        if view is None:
            raise ConnectionError("the agent's API client is not open yet")
        return view.claim(namespace, name)

    def card(self, uuid: str) -> injection.CardInfo | None:
        """A card of this node, or None (also while the device backend is not open)."""
        view = self._view()
        return None if view is None else view.card(uuid)

    def has_cards(self) -> bool | None:
        """None (unknown) until discovery has run and the API view exists (see the module docstring)."""
        view = self._view()
        return None if view is None else view.has_cards()

    def node_gpu_access(self, namespace: str) -> bool | None:
        """The namespace's label, or None (cannot tell) while the API client is not open."""
        view = self._view()
        return None if view is None else view.node_gpu_access(namespace)

    def warn(self, pod: injection.PodRef, reason: str, message: str) -> None:
        """A Warning Event through the API server's view; logged only while it is not there."""
        view = self._view()
        if view is None:
            log.warning("pod %s: %s: %s (no Event: the agent's API client is not open yet)", pod, reason, message)
        else:
            view.warn(pod, reason, message)


class GatedHooks:
    """hooks.ContainerHooks before and after the ledger is open (see the module docstring)."""

    def __init__(
        self,
        *,
        view: injection.AgentView,
        ledger: Callable[[], LedgerStore | None],
        settings: injection.InjectionSettings,
        owed_rebuild: Callable[[], bool] = lambda: False,
        rebuilt: Callable[[], None] = lambda: None,
        container_env: Callable[[str], Mapping[str, str]] | None = None,
        limits: limits_file.LimitsFiles | None = None,
        rooms: isolation.IsolationRooms | None = None,
        wrap: Wrap | None = None,
        nics: rdma.RdmaRoom = rdma.NO_RDMA,
        dra_claims: Callable[[str], Sequence[dra_containers.DraClaim]] = lambda pod_uid: (),
    ) -> None:
        """`wrap`: hooks around the claim hooks (see the module docstring; None: the claim hooks alone);
        `ledger`: the ledger once open, else None; `owed_rebuild`: True while the ledger is new
        because a corrupt one was moved aside (`rebuilt` is called once it has been rebuilt);
        `container_env`: a container's environment, asked of the runtime (for the rebuild of containers
        listed without it); `rooms`: the node's isolation modes (kept by the agent across front restarts);
        `nics`: its RDMA NICs; `dra_claims`: the ResourceClaims the DRA driver prepared for a pod (by uid)."""
        self._dra_claims = dra_claims
        self._rooms = rooms
        self._nics = nics
        self._wrap = wrap
        self._view = view
        self._ledger = ledger
        self._settings = settings
        self._owed_rebuild = owed_rebuild
        self._rebuilt = rebuilt
        self._container_env = container_env
        self._limits = limits
        self._list_containers: Callable[[], Sequence[hooks.RuntimeContainer]] | None = None
        self._lock = threading.Lock()  # one ClaimHooks, one rebuild
        self.inner: claim_hooks.ClaimHooks | None = None
        """The claim hooks on the ledger, once it is open."""
        self._made: claim_hooks.ClaimHooks | None = None  # made, waiting for the wrap
        self.outer: hooks.ContainerHooks | None = None
        """What the proxy's calls go through once `inner` exists: `wrap`'s hooks around it, or it."""

    def _hooks(self) -> claim_hooks.ClaimHooks | None:
        if self.inner is not None:
            return self.inner
        ledger = self._ledger()
        if ledger is None:
            return None
        with self._lock:
            if self.inner is None:
                if self._made is None:
                    self._made = claim_hooks.ClaimHooks(view=self._view, ledger=ledger, settings=self._settings,
                                                        limits=self._limits, rooms=self._rooms,
                                                        nics=self._nics, dra_claims=self._dra_claims)
                inner = self._made
                outer = inner if self._wrap is None else self._wrap(inner, self._view, ledger)
                if outer is None:
                    return None  # the wrap cannot be made yet (the device backend is not open)
                if self._list_containers is not None:
                    outer.attach_runtime(self._list_containers)
                self.outer, self.inner = outer, inner
            return self.inner

    def _outer(self) -> hooks.ContainerHooks:
        assert self.outer is not None  # set with `inner`, which the callers checked
        return self.outer

    def reconciled(self) -> bool:
        """True once the claim hooks exist and their start-up reconciliation is done (claims are taken)."""
        return self.inner is not None and self.inner.reconciled.is_set()

    # --- hooks.ContainerHooks ---

    def prepare_create(self, request: injection.ContainerRequest) -> hooks.PreparedCreate:
        """The claim hooks' decision; before the ledger is open, the pass-through or a retryable refusal."""
        inner = self._hooks()
        if inner is not None and inner.reconciled.is_set():
            return self._outer().prepare_create(request)
        plain = request
        claims = self._dra_claims(plain.pod.uid)
        # A container of a prepared ResourceClaim waits for the ledger as a claim of ours does: its row and its
        # class's isolation come with it (dra_containers.py), never without.
        if injection.claim_of(plain) is None and not dra_containers.claims_of(plain, claims):
            return hooks.PreparedCreate(edit=injection.decide(plain, self._view, settings=self._settings,
                                                              dra_devices=dra_containers.devices(claims)))
        # A claim before the start-up reconciliation: say everything that is missing, not only the first.
        reasons = [self._view.not_ready_reason(), "its ledger is not open yet" if inner is None else
                   "its ledger is not reconciled with the runtime's containers yet"]  # fmt: skip
        reason = "; ".join(r for r in reasons if r)
        raise hooks.Refused(
            f"pod {plain.pod}, container {plain.container!r}: the elasticgpu agent on node {self._view.node_name} "
            f"is not ready yet ({reason}); kubelet retries this container by itself",
            code=grpc.StatusCode.UNAVAILABLE,
        )

    def created(self, prepared: hooks.PreparedCreate, container_id: str) -> None:
        """Complete the claim hooks' row (a container passed before the ledger opened has none)."""
        if prepared.token is not None and self.inner is not None:
            self._outer().created(prepared, container_id)

    def create_failed(self, prepared: hooks.PreparedCreate, code: grpc.StatusCode) -> None:
        """Undo the claim hooks' row, if it has one."""
        if prepared.token is not None and self.inner is not None:
            self._outer().create_failed(prepared, code)

    def removed(self, container_id: str) -> None:
        """Release the container's row; before the ledger is open, the start-up reconciliation will."""
        inner = self._hooks()
        if inner is not None:
            self._outer().removed(container_id)

    def attach_runtime(self, list_containers: Callable[[], Sequence[hooks.RuntimeContainer]]) -> None:
        """Keep the front's ListContainers for the claim hooks (now or once they exist)."""
        self._list_containers = list_containers
        if self.inner is not None:
            self._outer().attach_runtime(list_containers)

    def reconcile(self, containers: Sequence[hooks.RuntimeContainer], *, starting: bool) -> None:
        """The claim hooks' reconciliation (their start-up one first); nothing while the ledger is not open."""
        inner = self._hooks()
        if inner is None:
            return  # nothing recorded can be matched yet; `settle` runs the start-up one later
        try:
            self._settle(inner, containers, starting=starting or not inner.reconciled.is_set())
        except LedgerRebuildWaits as e:  # `settle` tries again from the CRI hook's loop; a front's call returns
            log.debug("%s", e)

    def settle(self) -> bool:
        """Run the start-up reconciliation once the ledger is open and it has not run; True once it has run."""
        inner = self._hooks()
        if inner is None or self._list_containers is None:
            return False
        if not inner.reconciled.is_set():
            self._settle(inner, self._list_containers(), starting=True)
        return True

    def _settle(self, inner: claim_hooks.ClaimHooks, containers: Sequence[hooks.RuntimeContainer], *,
                starting: bool) -> None:
        with self._lock:
            if starting and inner.reconciled.is_set():
                # The start-up one ran meanwhile (the proxy's reconciler and the hook's loop both
                # ask for it): claims are taken now, one may be in flight, so no longer `starting`.
                starting = False
            if starting and self._owed_rebuild():
                ledger = self._ledger()
                assert ledger is not None  # the claim hooks exist only on an open ledger
                count = rebuild(ledger, containers, self._container_env or (lambda _: {}), self._view,
                                dra_claims=self._dra_claims)  # fmt: skip
                log.info("the ledger %s was rebuilt from the runtime's containers: %d claim container(s)",
                         ledger.url, count)  # fmt: skip
                self._rebuilt()
            self._outer().reconcile(containers, starting=starting)  # the wrap's too (MIG: converge)

    def close(self) -> None:
        """Finish the claim hooks' queued writes."""
        if self._made is not None:
            self._made.close()


def _bound_size(view: injection.AgentView, namespace: str, name: str, container: hooks.RuntimeContainer,
                container_env: Callable[[str], Mapping[str, str]]) -> tuple[list[str], int, int, str]:
    """(cards, cores, memory MiB, ElasticGPU) a rebuilt row holds: the claim's, as the controller bound it to this
    node; else whole cards of those the container was given (see the module docstring)."""
    try:
        info = view.claim(namespace, name)
    except (KubeError, ConnectionError, OSError) as e:
        raise LedgerRebuildWaits(f"the lost ledger is rebuilt once the claims of its containers can be read; "
                                 f"ElasticGPUClaim {namespace}/{name} (container {container.id}) cannot be now: "
                                 f"{e}") from e
    if info is not None and info.phase == "Bound" and info.node_name == view.node_name and info.gpus:
        return list(info.gpus), info.cores, 0 if info.whole_cards else info.memory_mib, info.elastic_gpu
    env = container.env if container.env is not None else container_env(container.id)
    given = [uuid for uuid in env.get(injection.ENV_VISIBLE_DEVICES, "").split(",") if uuid.startswith("GPU-")]
    log.warning("ledger rebuilt: container %s uses claim %s/%s, which is gone or no longer bound to this node: it "
                "is counted as holding its cards %s whole until it ends", container.id, namespace, name,
                ",".join(given) or "(none)")  # fmt: skip
    return given, names.CORES_PER_CARD, 0, ""


def _rebuild_dra(ledger: LedgerStore, container: hooks.RuntimeContainer,
                 dra_claims: Callable[[str], Sequence[dra_containers.DraClaim]]) -> bool:
    """Record the row of a container of a ResourceClaim (its marker, which only the agent writes), from the
    DRA checkpoint's entry of that claim for its pod; False when the checkpoint has none (unprepared: the
    container goes with its pod)."""
    labels = container.labels
    marked = container.annotations.get(dra_containers.RESOURCE_CLAIM_ANNOTATION, "")
    pod_uid = labels.get(injection.LABEL_POD_UID, "")
    claim = next((c for c in dra_claims(pod_uid) if f"{c.namespace}/{c.name}" == marked), None)
    if claim is None:
        return False
    row = ledger.record_started(
        pod_uid=pod_uid, pod_namespace=labels.get(injection.LABEL_POD_NAMESPACE, ""),
        pod_name=labels.get(injection.LABEL_POD_NAME, ""), container_name=container.name,
        claim_namespace=claim.namespace, claim_name=claim.name, elastic_gpu=claim.uid, gpu_uuids=list(claim.gpus),
        cores=claim.cores, memory_mib=claim.memory_mib, claim_kind=KIND_DRA,
    )  # fmt: skip
    ledger.mark_created(row, container.id)
    log.info("ledger rebuilt: container %s uses %s (cards %s)", container.id, claim, ",".join(claim.gpus))
    return True


def rebuild(ledger: LedgerStore, containers: Sequence[hooks.RuntimeContainer],
            container_env: Callable[[str], Mapping[str, str]], view: injection.AgentView, *,
            dra_claims: Callable[[str], Sequence[dra_containers.DraClaim]] = lambda pod_uid: ()) -> int:
    """Record a `created` row for every claim container of the runtime the ledger has no row of;
    returns how many were recorded (see the module docstring). Idempotent. `dra_claims`: the DRA driver's
    prepared claims by pod uid (a ResourceClaim's container is rebuilt from them)."""
    count = 0
    for container in containers:
        if (container.annotations.get(dra_containers.RESOURCE_CLAIM_ANNOTATION)
                and ledger.allocation_for_container(container.id) is None):
            count += _rebuild_dra(ledger, container, dra_claims)
            continue
        claim = container.annotations.get(injection.CLAIM_ANNOTATION, "")
        if "/" not in claim or ledger.allocation_for_container(container.id) is not None:
            continue
        namespace, name = claim.split("/", 1)
        mig = mig_annotation.parse(container.annotations.get(mig_annotation.MIG_ANNOTATION, ""))
        if mig is not None:
            # A MIG instance is its own limit and NVIDIA_VISIBLE_DEVICES names it, not its card: what the
            # row held is in the instance's annotation (the agent's own, on the container's config).
            gpus, cores, memory, elastic_gpu = [mig.card], mig.cores, mig.memory_mib, mig.elastic_gpu
            _rebuild_mig(ledger, mig)
        else:
            gpus, cores, memory, elastic_gpu = _bound_size(view, namespace, name, container, container_env)
        labels = container.labels
        row = ledger.record_started(
            pod_uid=labels.get(injection.LABEL_POD_UID, ""),
            pod_namespace=labels.get(injection.LABEL_POD_NAMESPACE, ""),
            pod_name=labels.get(injection.LABEL_POD_NAME, ""), container_name=container.name,
            claim_namespace=namespace, claim_name=name, elastic_gpu=elastic_gpu, gpu_uuids=gpus, cores=cores,
            memory_mib=memory,
        )  # fmt: skip
        ledger.mark_created(row, container.id)
        log.info("ledger rebuilt: container %s of pod %s/%s uses claim %s (cards %s)", container.id,
                 labels.get(injection.LABEL_POD_NAMESPACE), labels.get(injection.LABEL_POD_NAME), claim,
                 ",".join(gpus) or "unknown")  # fmt: skip
        count += 1
    return count


def _rebuild_mig(ledger: LedgerStore, mig: mig_annotation.MigAnnotation) -> None:
    """Record the MIG instance a running container holds (its `mig_instances` row, `created`), so
    the start-up convergence keeps it as held and its last holder's removal destroys it."""
    try:
        record = ledger.record_mig_creating(card_uuid=mig.card, elastic_gpu=mig.elastic_gpu, profile=mig.profile,
                                            start=mig.start)
    except LedgerStateError as e:  # another claim's row holds that slice: the annotation cannot be right
        log.warning("ledger rebuilt: MIG instance %s of %s not recorded: %s", mig.uuid, mig.elastic_gpu, e)
        return
    if record.state != MIG_CREATED:
        ledger.mark_mig_created(record.id, gpu_instance_id=mig.gpu_instance_id, mig_uuid=mig.uuid)
        log.info("ledger rebuilt: MIG instance %s (%s at slice %d of %s) held by %s", mig.uuid, mig.profile,
                 mig.start, mig.card, mig.elastic_gpu)
