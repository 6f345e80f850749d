"""Over-limit policing on the node: the usage loop's samples in, the runtime's StopContainer out.

After every usage pass the usage loop hands its per-claim figures and its process rows here.
For each claim with an open allocation on this node:
1. its containers' memory (the processes of each container, as the usage loop attributed them);
2. its policy, from the claim's `status.policing` as the usage loop last read the claim (the
   controller copies it from the class on bind; absent or not read yet: Warn); for a ResourceClaim
   (issue 48: a row of claim_kind ResourceClaim, key `resourceclaim/<name>`) the policy of its
   DeviceClass's config, which the DRA driver kept in its checkpoint at prepare (`dra_policy`, by the
   claim's uid; not there: Warn);
3. `decisions.observe` says whether to stop, and which containers;
4. each container is stopped through the CRI proxy's runtime channel (`stop_container`), and
   once the runtime confirms, `decisions.confirm` records it: a container is stopped once. Then a
   Warning Event `OverLimitStopped` on the claim (the ResourceClaim for DRA's) and one on its pod
   (where `kubectl describe pod` shows why the container restarted), and the claim's stop counter goes up (the metric
   `elasticgpu_agent_over_limit_stops_total`).

Failures never end the usage loop and are retried: a stop the runtime refused or did not answer
is not confirmed, so the next pass decides it again (a warning is logged at the 1st, 2nd, 4th,
8th ... failure of one container, not every pass); an Event the API server refused is kept and
written again at the next passes (up to `_EVENT_ATTEMPTS`). A container the runtime no longer
knows (removed meanwhile) counts as stopped, without an Event: the agent did not stop it.

Time: the grace is counted on a monotonic clock (a wall-clock step must never shorten it);
Events carry the wall-clock time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pydantic

from elasticgpu.agent import errors
from elasticgpu.agent.discovery import ProcessUsage
from elasticgpu.agent.inventory import rfc3339
from elasticgpu.agent.kube import AgentKube
from elasticgpu.agent.ledger.store import DRA_CLAIM_PREFIX, Allocation
from elasticgpu.agent.policing import decisions
from elasticgpu.agent.settings import PolicingSettings
from elasticgpu.api import names
from elasticgpu.api.policing import Policing

logger = logging.getLogger(__name__)

REASON_STOPPED = "OverLimitStopped"
_EVENT_ATTEMPTS = 10
"""Passes an Event the API server refused is written again before it is given up (and logged)."""

ClaimKey = tuple[str, str]
Row = tuple[ProcessUsage, Allocation | None, str | None]


class ContainerStopper(Protocol):
    """The runtime client (the CRI proxy: the agent's only runtime-socket user)."""

    def stop_container(self, container_id: str, *, timeout_s: int) -> None:
        """Stop the container; raises `errors.ContainerNotFound` or `errors.RuntimeCallFailed`."""


def policy_of(claim: Mapping[str, Any] | None) -> decisions.Policy:
    """The claim's policy from its `status.policing`; Warn when absent, unreadable or not read yet."""
    copied = ((claim or {}).get("status") or {}).get("policing")
    if not copied:
        return decisions.WARN
    try:
        policing = Policing.model_validate(copied)
    except pydantic.ValidationError:
        return decisions.WARN  # a status the CRD would refuse: never stop on what cannot be read
    # max: the CRD refuses a negative grace; should one get through, it is no shorter than 0.
    return decisions.Policy(action=policing.over_limit_action, grace_s=float(max(0, policing.over_limit_grace_seconds)))


def containers_of(rows: Iterable[Row]) -> tuple[dict[ClaimKey, dict[str, int]], dict[str, Allocation]]:
    """Per claim, the MiB each of its containers uses; and each container's allocation (ledger row)."""
    per_claim: dict[ClaimKey, dict[str, int]] = {}
    allocations: dict[str, Allocation] = {}
    for process, owner, container in rows:
        if owner is None or container is None:
            continue
        allocations[container] = owner
        used = per_claim.setdefault(owner.claim_key, {})  # the usage pass's key (a ResourceClaim's too)
        used[container] = used.get(container, 0) + process.memory_mib
    return per_claim, allocations


@dataclass
class _OwedEvent:
    namespace: str
    involved: dict[str, Any]
    message: str
    at: str
    attempts: int = 0


class Enforcer:
    """Polices the node's claims after each usage pass (see the module docstring)."""

    def __init__(self, *, kube: AgentKube, runtime: Callable[[], ContainerStopper | None],
                 settings: PolicingSettings, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 dra_policy: Callable[[str], decisions.Policy | None] = lambda uid: None) -> None:  # fmt: skip
        """`runtime` returns the CRI proxy now serving (None while it is down, or with --cri-proxy false);
        `dra_policy` the policy the DRA driver kept for a ResourceClaim's uid (None: none kept)."""
        self.dra_policy = dra_policy
        """The policy the DRA driver kept for a ResourceClaim's uid at prepare (None: none kept: Warn)."""
        self._kube = kube
        self._runtime = runtime
        self._settings = settings
        self._clock = clock
        self._wall_clock = wall_clock
        self._watches: dict[ClaimKey, decisions.Watch] = {}
        self._failures: dict[str, int] = {}  # container id -> failed stops in a row (for the log's backoff)
        self._no_runtime = 0  # passes in a row that found no runtime to stop through (for the log's backoff)
        self._owed: list[_OwedEvent] = []
        self.stops: dict[ClaimKey, int] = {}
        """Containers stopped per claim since the agent started (the metric's counter)."""

    def police(self, limits: Mapping[ClaimKey, int], rows: Iterable[Row],
               claim_body: Callable[[ClaimKey], Mapping[str, Any] | None]) -> None:  # fmt: skip
        """One pass over the claims of the usage pass: `limits` is the MiB each claim with an open
        allocation reserved, `rows` the usage loop's process rows, `claim_body` the claim as last
        read (None: not yet). A failure is logged and retried by the next pass, never raised."""
        now = self._clock()
        per_claim, allocations = containers_of(rows)
        for key in limits:
            body = claim_body(key)
            policy = self._policy_of(key, body, allocations)
            if not self._settings.over_limit_stops:
                policy = decisions.WARN  # the operator's brake (--over-limit-stops false)
            sample = decisions.Sample(at=now, limit_mib=limits.get(key, 0), containers=per_claim.get(key, {}))
            watch, stop = decisions.observe(self._watches.get(key, decisions.Watch()), sample, policy)
            self._watches[key] = watch
            if stop is not None:
                self._carry_out(key, stop, policy, allocations, body, now)
        for gone in [k for k in self._watches if k not in limits]:
            del self._watches[gone]  # no open allocation any more: a new one starts a new count
        for container in [c for c in self._failures if c not in allocations]:
            del self._failures[container]  # its processes are gone from the card
        self._pay_owed_events()

    def _policy_of(self, key: ClaimKey, body: Mapping[str, Any] | None,
                   allocations: Mapping[str, Allocation]) -> decisions.Policy:  # fmt: skip
        """The claim's policy: an ElasticGPUClaim's from its status, a ResourceClaim's as its driver kept it."""
        if not key[1].startswith(DRA_CLAIM_PREFIX):
            return policy_of(body)
        # Its uid is on its containers' rows; a claim none of whose containers uses the card is not over anyway.
        uid = next((a.elastic_gpu for a in allocations.values() if a.is_dra and a.claim_key == key), None)
        return (self.dra_policy(uid) if uid else None) or decisions.WARN

    def _carry_out(self, key: ClaimKey, stop: decisions.Stop, policy: decisions.Policy,
                   allocations: Mapping[str, Allocation], body: Mapping[str, Any] | None,
                   now: float) -> None:  # fmt: skip
        runtime = self._runtime()
        if runtime is None:
            self._no_runtime += 1
            if self._no_runtime & (self._no_runtime - 1) == 0:  # 1st, 2nd, 4th ...: not every pass
                logger.warning("claim %s/%s is over its memory for %.0f s, but the runtime cannot be reached (the CRI"
                               " proxy is not serving); the next pass tries again", key[0], key[1],
                               now - stop.over_since)  # fmt: skip
            return
        self._no_runtime = 0
        for container in stop.containers:
            try:
                runtime.stop_container(container, timeout_s=self._settings.over_limit_stop_timeout_s)
            except errors.ContainerNotFound:
                logger.info("claim %s/%s: container %s is gone already; not stopped", key[0], key[1], container)
                self._watches[key] = decisions.confirm(self._watches[key], container)
                continue
            except errors.RuntimeCallFailed as e:
                failures = self._failures[container] = self._failures.get(container, 0) + 1
                if failures & (failures - 1) == 0:  # 1st, 2nd, 4th, 8th ...: the runtime may be down for long
                    logger.warning("claim %s/%s over its memory: %s (failure %d)", key[0], key[1], e, failures)
                continue
            self._failures.pop(container, None)
            self._watches[key] = decisions.confirm(self._watches[key], container)
            self.stops[key] = self.stops.get(key, 0) + 1
            self._tell(key, container, stop, policy, allocations.get(container), body, now)

    def _tell(self, key: ClaimKey, container: str, stop: decisions.Stop, policy: decisions.Policy,
              allocation: Allocation | None, body: Mapping[str, Any] | None, now: float) -> None:  # fmt: skip
        namespace, name = key
        where = (f"container {allocation.container_name} ({container[:13]}) of pod {allocation.pod_namespace}/"
                 f"{allocation.pod_name}" if allocation is not None else f"container {container[:13]}")
        dra = name.startswith(DRA_CLAIM_PREFIX)
        named, of, ask = ((f"ResourceClaim {namespace}/{name.removeprefix(DRA_CLAIM_PREFIX)}", "DeviceClass",
                           "Request more memory capacity in the ResourceClaim") if dra
                          else (f"claim {namespace}/{name}", "class", f"Request more {names.RESOURCE_MEMORY}"))
        message = (
            f"{where} stopped: {named} used {stop.used_mib} MiB of GPU memory, more than the {stop.limit_mib} MiB it"
            f" reserved, for {now - stop.over_since:.0f} s (the {of} allows {policy.grace_s:.0f} s: overLimitAction"
            f" StopContainer) on node {self._kube.node_name}; kubelet applies the pod's restartPolicy. {ask}, or use"
            " less"
        )
        logger.warning("%s", message)
        at = rfc3339(self._wall_clock())
        if dra:
            # The Event is about the ResourceClaim itself (its uid is the row's; the agent never reads the claim).
            self._owed.append(_OwedEvent(namespace=namespace, message=message, at=at, involved={
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "namespace": namespace,
                "name": name.removeprefix(DRA_CLAIM_PREFIX),
                "uid": allocation.elastic_gpu if allocation is not None else None}))
        else:
            metadata = (body or {}).get("metadata") or {}
            self._owed.append(_OwedEvent(namespace=namespace, message=message, at=at, involved={
                "apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "name": name, "namespace": namespace,
                "uid": metadata.get("uid")}))
        if allocation is not None:
            self._owed.append(_OwedEvent(namespace=allocation.pod_namespace, message=message, at=at, involved={
                "apiVersion": "v1", "kind": "Pod", "name": allocation.pod_name,
                "namespace": allocation.pod_namespace, "uid": allocation.pod_uid}))

    def _pay_owed_events(self) -> None:
        owed, self._owed = self._owed, []
        for event in owed:
            try:
                self._kube.create_event(namespace=event.namespace, involved=event.involved, type_="Warning",
                                        reason=REASON_STOPPED, message=event.message, now=event.at)
            except errors.KubeError as e:
                event.attempts += 1
                if event.attempts < _EVENT_ATTEMPTS:
                    self._owed.append(event)  # the next pass writes it again
                else:
                    logger.warning("%s Event about %s %s/%s given up after %d attempts: %s", REASON_STOPPED,
                                   event.involved["kind"], event.namespace, event.involved["name"], event.attempts, e)
