"""The agent's `injection.AgentView`, read from the API server on demand.

Scale: 10,000 agents must not each list or watch the cluster's claims. A node needs a claim
only when kubelet creates a container that names it, which is rare (once per container start),
so the view reads by name when asked, through the agent's kube module, and nothing else:

    claim(ns, name)   GET the claim; if it says Bound, GET its ElasticGPU (spec.elasticGPUName);
                      both kept `ttl_s` seconds (the containers of one pod start together and
                      share one read). A claim that does not exist is cached as such too.
    card(uuid)        the cards discovery reports now (no API call)
    node_gpu_access   GET the Namespace by name (never a list or watch), its label
                      elasticgpu.io/node-gpu-access kept `namespace_ttl_s`; asked for every
                      container without a claim, so it never waits on a silent API server:
                      while the server has not answered within `ready_window_s` it says "cannot
                      tell" (None) at once, and a failed read is remembered as such briefly
    warn              a Warning Event about a pod, written by one background thread (at most one
                      per pod and reason a minute: kubelet retries a refused container often)
    not_ready_reason  ready while the API server answered the agent within `ready_window_s`
                      (any call: heartbeats every 30 s, the GPU watch), learnt for free; past
                      that, one GET /version at most every `probe_interval_s` says whether it
                      is back (the agent's own loops may be in a long backoff)

The ElasticGPU is the source of truth of what a claim holds (cards, node, capacity), as a
PersistentVolume is for its claim; the claim's status only mirrors it. So the view takes them
from the ElasticGPU and checks the two-way pointer: an ElasticGPU that is gone or whose
spec.claimRef names another claim makes the claim `Lost` (what the controller will write),
and its container is refused.

When the API server cannot be asked, `claim` raises and `not_ready_reason` says why: the
injection refuses that container as retryable (kubelet retries); containers without a claim
never consult the view and start as always.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, Protocol

from elasticgpu.agent import errors
from elasticgpu.agent.discovery import Card
from elasticgpu.agent.injecting import injection
from elasticgpu.api import names, quantities

log = logging.getLogger(__name__)
_EVENT_EVERY_S = 60.0  # one Event per pod and reason a minute at most
_FAILED_READ_S = 2.0  # a namespace read that failed is not retried for this long (None meanwhile)


class ClaimReader(Protocol):
    """What the view asks of the agent's kube module (`kube.AgentKube`)."""

    answered_at: float | None
    last_failure: str | None

    def probe(self) -> None:
        """A cheap request whose answer (or none) updates `answered_at` / `last_failure`."""
        ...

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """One claim; raises `errors.KubeNotFound`."""
        ...

    def read_elastic_gpu(self, name: str) -> dict[str, Any]:
        """One ElasticGPU; raises `errors.KubeNotFound`."""
        ...

    def read_namespace(self, name: str) -> dict[str, Any]:
        """One Namespace; raises `errors.KubeNotFound`."""
        ...

    def create_event(
        self, *, namespace: str, involved: dict[str, Any], type_: str, reason: str, message: str, now: str
    ) -> None:
        """A core/v1 Event about `involved`."""
        ...


def limits(capacity: dict[str, Any], *, cards: int, physical: bool) -> tuple[int, int]:
    """(cores per card, memory MiB per card) of a bound capacity; (100, 0) for whole cards.

    Whole cards: `nvidia.com/gpu` in the capacity (the controller writes it for them), an
    ElasticGPU of `spec.physicalGPU`, or 100 cores per card. A slice is one card: its cores
    (0 when it reserved memory only) and its memory."""
    cores = quantities.parse_count(capacity.get(names.RESOURCE_CORE, 0), field="capacity")
    if physical or names.RESOURCE_NVIDIA_GPU in capacity or cores >= names.CORES_PER_CARD * max(cards, 1):
        return names.CORES_PER_CARD, 0
    memory = quantities.parse_memory_mib(capacity.get(names.RESOURCE_MEMORY, 0), field="capacity")
    return cores, memory


def claim_info(claim: dict[str, Any], egpu: dict[str, Any] | None) -> injection.ClaimInfo:
    """The view of a claim and its ElasticGPU (None: not asked, or gone)."""
    metadata, spec, status = claim.get("metadata") or {}, claim.get("spec") or {}, claim.get("status") or {}
    namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
    phase = str(status.get("phase") or "Pending")
    users = tuple(injection.ClaimUser(str(u.get("name", "")), str(u.get("uid", ""))) for u in status.get("users") or [])
    source: dict[str, Any] = status
    physical = False
    nics: tuple[str, ...] = ()
    if phase == "Bound":
        ref = ((egpu or {}).get("spec") or {}).get("claimRef") or {}
        uid = str(metadata.get("uid", ""))
        if egpu is None or (ref.get("namespace"), ref.get("name")) != (namespace, name) or (
            ref.get("uid") and uid and ref.get("uid") != uid
        ):
            # OBSERVATION: the claim says Bound, its ElasticGPU is gone or serves another claim.
            phase = "Lost"
        else:
            egpu_status = egpu.get("status") or {}
            # The ElasticGPU's status is the truth; the claim's mirrors it (older objects: its spec).
            source = {
                "nodeName": egpu_status.get("nodeName") or status.get("nodeName"),
                "gpus": egpu_status.get("gpus") or status.get("gpus"),
                "capacity": egpu_status.get("capacity") or status.get("capacity") or egpu["spec"].get("capacity"),
            }
            physical = egpu["spec"].get("physicalGPU") is not None
            nics = tuple(str(n) for n in (egpu["spec"].get("physicalGPU") or {}).get("rdmaNics") or [])
    gpus = tuple(str(g) for g in source.get("gpus") or [])
    cores, memory = limits(dict(source.get("capacity") or {}), cards=len(gpus), physical=physical)
    mig = status.get("partition") or {}
    partition = (str(mig["profile"]), int(mig.get("start") or 0)) if phase == "Bound" and mig.get("profile") else None
    return injection.ClaimInfo(
        namespace=namespace,
        name=name,
        phase=phase,
        node_name=source.get("nodeName"),
        elastic_gpu=str(spec.get("elasticGPUName") or ""),
        gpus=gpus,
        cores=cores,
        memory_mib=memory,
        users=users,
        partition=partition,
        # What enforces a slice's size, from its class on bind (absent on claims bound before issue 25: None).
        isolation=str(status.get("isolation") or "None"),
        nics=nics,
        # From its class on bind, in the claim's status: only the controller writes it (the status subresource),
        # never the tenant who owns the claim's spec and annotations (issue 33.4). Only a Bound claim's counts.
        allow_privileged=phase == "Bound" and status.get(injection.ALLOW_PRIVILEGED_FIELD) is True,
    )


class ClaimView:
    """injection.AgentView from the API server (see the module docstring). Thread-safe."""

    def __init__(
        self,
        *,
        kube: ClaimReader,
        node_name: str,
        cards: Callable[[], Sequence[Card] | None],
        ttl_s: float = 5.0,
        ready_window_s: float = 60.0,
        probe_interval_s: float = 2.0,
        not_ready: Callable[[], str | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        namespace_ttl_s: float = 30.0,
    ) -> None:
        """`cards`: the cards discovery reports now (None before its first snapshot); `not_ready`: another
        reason to refuse claims (the CDI spec not written), or None."""
        self._kube = kube
        self._node_name = node_name
        self._cards = cards
        self._ttl_s = ttl_s
        self._ready_window_s = ready_window_s
        self._probe_interval_s = probe_interval_s
        self._probed_at: float | None = None
        self.not_ready = not_ready
        """Another reason to refuse claims, or None (the agent sets the CRI hook's `spec_problem`)."""
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[float, injection.ClaimInfo | None]] = {}
        self.reads = 0
        """API reads the view made (claims and ElasticGPUs), for tests and metrics."""
        self._namespace_ttl_s = namespace_ttl_s
        self._namespaces: dict[str, tuple[float, bool | None]] = {}
        self._warned: dict[tuple[str, str], float] = {}
        self._events: futures.ThreadPoolExecutor | None = None

    @property
    def node_name(self) -> str:
        """This node."""
        return self._node_name

    def not_ready_reason(self) -> str | None:
        """Why claims cannot be injected now, or None (see the module docstring)."""
        if not self._answered_recently():
            with self._lock:
                now = self._clock()
                due = self._probed_at is None or now - self._probed_at >= self._probe_interval_s
                if due:
                    self._probed_at = now
            if due:
                with contextlib.suppress(errors.KubeError):
                    self._kube.probe()
        answered = self._kube.answered_at
        failure = f" ({self._kube.last_failure})" if self._kube.last_failure else ""
        if answered is None:
            return "it has not reached the API server since it started" + failure
        silent = self._clock() - answered
        if silent > self._ready_window_s:
            return f"the API server has not answered it for {silent:.0f} s{failure}"
        return self.not_ready()

    def _answered_recently(self) -> bool:
        answered = self._kube.answered_at
        return answered is not None and self._clock() - answered <= self._ready_window_s

    def claim(self, namespace: str, name: str) -> injection.ClaimInfo | None:
        """The claim with what its ElasticGPU holds; None if there is none. Raises `errors.KubeError`
        when the API server cannot be asked (the container is then refused as retryable)."""
        key = (namespace, name)
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and now - cached[0] < self._ttl_s:
                return cached[1]
        info = self._read(namespace, name)
        with self._lock:
            if len(self._cache) > 1024:  # claims of containers long started: forget them
                self._cache = {k: v for k, v in self._cache.items() if now - v[0] < self._ttl_s}
            self._cache[key] = (now, info)
        return info

    def _read(self, namespace: str, name: str) -> injection.ClaimInfo | None:
        self.reads += 1
        try:
            claim = self._kube.read_claim(namespace, name)
        except errors.KubeNotFound:
            return None
        egpu = None
        egpu_name = (claim.get("spec") or {}).get("elasticGPUName")
        if (claim.get("status") or {}).get("phase") == "Bound" and egpu_name:
            self.reads += 1
            try:
                egpu = self._kube.read_elastic_gpu(str(egpu_name))
            except errors.KubeNotFound:
                egpu = None
        return claim_info(claim, egpu)

    def card(self, uuid: str) -> injection.CardInfo | None:
        """A card discovery reports now, by uuid (any case)."""
        wanted = uuid.lower()
        for card in self._cards() or ():
            if card.uuid.lower() == wanted:
                return injection.CardInfo(uuid=card.uuid, index=card.index, memory_mib=card.memory_mib)
        return None

    def has_cards(self) -> bool | None:
        """True when discovery reports a card now, None before discovery's first snapshot."""
        cards = self._cards()
        return None if cards is None else bool(cards)

    def node_gpu_access(self, namespace: str) -> bool | None:
        """Whether the namespace carries elasticgpu.io/node-gpu-access=true (None: cannot tell now)."""
        now = self._clock()
        with self._lock:
            cached = self._namespaces.get(namespace)
        if cached is not None:
            at, known = cached
            if now - at < (self._namespace_ttl_s if known is not None else _FAILED_READ_S):
                return known
        if not self._answered_recently():
            return None  # never wait on a silent API server for a container without a claim
        value: bool | None
        try:
            labels = (self._kube.read_namespace(namespace).get("metadata") or {}).get("labels") or {}
            value = labels.get(injection.NODE_GPU_ACCESS_LABEL) == "true"
        except errors.KubeNotFound:
            value = False
        except errors.KubeError as e:
            log.warning("cannot read namespace %s for its label %s (%s); its containers without a claim get no GPU "
                        "meanwhile", namespace, injection.NODE_GPU_ACCESS_LABEL, e)
            value = None
        with self._lock:
            if len(self._namespaces) > 4096:
                self._namespaces.clear()
            self._namespaces[namespace] = (now, value)
        return value

    def warn(self, pod: injection.PodRef, reason: str, message: str) -> None:
        """Queue a Warning Event about the pod (at most one per pod and reason a minute)."""
        now = self._clock()
        with self._lock:
            key = (pod.uid or str(pod), reason)
            if now - self._warned.get(key, -_EVENT_EVERY_S) < _EVENT_EVERY_S:
                return
            self._warned[key] = now
            if len(self._warned) > 4096:
                self._warned = {k: v for k, v in self._warned.items() if now - v < _EVENT_EVERY_S}
            if self._events is None:
                self._events = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pod-events")
            events = self._events
        events.submit(self._write_event, pod, reason, message)

    def _write_event(self, pod: injection.PodRef, reason: str, message: str) -> None:
        involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            self._kube.create_event(namespace=pod.namespace, involved=involved, type_="Warning", reason=reason,
                                    message=message[:1024], now=stamp)
        except Exception as e:  # an Event is best effort; the refusal itself reached kubelet
            log.warning("could not record Event %s about pod %s: %s", reason, pod, e)

    def close(self) -> None:
        """Finish the queued Events (the agent is stopping)."""
        with self._lock:
            events, self._events = self._events, None
        if events is not None:
            events.shutdown(wait=True)
