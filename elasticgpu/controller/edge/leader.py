"""Leader election on a `coordination.k8s.io/v1` Lease: one controller binds, the others wait.

The protocol is client-go's (`tools/leaderelection`), on one Lease object:

    spec.holderIdentity        who leads ("" after a clean release: anyone may take it at once)
    spec.leaseDurationSeconds  how long a standby waits, after the holder's last renewal, before
                               it takes the Lease (10 s by default)
    spec.renewTime             when the holder last renewed (it renews every retry period, 2 s)
    spec.acquireTime, spec.leaseTransitions   when it was taken, how often it changed hands

Every write is a PUT that carries the resourceVersion read just before (a create for a missing
Lease): two candidates that read the same expired Lease both try, the server accepts one and
answers the other 409 Conflict. Nothing is decided from a write that did not succeed.

Time. A standby must not trust the holder's clock alone, nor only its own observations:

- client-go measures expiry from the moment the standby *saw* the record change. That is safe
  against clock skew but late by up to one retry period (the change happened before it was seen).
- Here the standby takes the `renewTime` written in the record, converted to its own monotonic
  clock, but clamped into the interval in which it knows the change happened: after the
  previous read that showed the old record, and before the read that showed the new one. With
  synchronised clocks that is the renewal itself; with skewed clocks it is off by at most one
  retry period, early or late. Early is safe because a leader gives up after `renew_deadline_s`
  (7 s) without a successful renewal, before `lease_duration_s` (10 s) less one retry period
  (2 s). So a standby takes over within 10 s of the leader's last renewal, and so within 10 s
  of its death (plus the duration of one request), not 10 s plus two polls.

Defaults: 10/7/2 s, shorter than client-go's 15/10/2 (issue 49: a leader's kill -9 to the new
leader's first bind within 15 s; the lease is most of it, since a standby keeps its picture
warm). The price is a leader that steps down after 7 s without an answer from a slow server
(client-go's: 10 s); `--leader-elect-lease-duration` and friends (chart values
`controller.leaderElection`) lengthen them for such a server.

A leader that cannot renew within `renew_deadline_s` stops leading (`on_lost`): the controller
then stops and exits, and its Pod restarts as a standby, as client-go's controllers do. On a
clean stop the leader releases the Lease (holder "", duration 1 s) so a standby takes over at
once instead of after the lease.

Renewing (issue 49 item 2: a leader lost its Lease twice in a 16,000-card fill, "not renewed
for 7.5s"). A renewal is one PUT of the Lease as the leader's last write returned it (client-go's
optimistic renewal; a 409 falls back to a read and a write), due a retry period after the
previous attempt *began*, and no request outlasts the renew deadline. Before, a read and a write
begun a retry period after the previous renewal *ended* needed four answers within the deadline
(lost once each Lease request took 1.5 s on the local server; now kept at 3.3 s:
`bench/leader_renew.py`), and urllib3 retried a timed-out read three times past the deadline.

`KubernetesLeases` is the Lease client on kubernetes.client's CoordinationV1Api; the controller
uses `leasing.TransportLeases` (its own lean transport, a connection of its own) unless it must
go through an HTTP proxy. The elector only needs their three calls (`LeaseClient`).
"""

from __future__ import annotations

import datetime
import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from elasticgpu.api import timestamps
from elasticgpu.controller import errors

__all__ = ["KubernetesLeases", "LeaderElector", "LeaderSettings", "LeaseClient", "default_identity"]

log = logging.getLogger(__name__)

Body = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class LeaderSettings:
    """How the controllers of one cluster elect their leader (client-go's protocol; shorter
    periods than its 15/10/2 s, see the module's docstring)."""

    enabled: bool = True
    """Off only when exactly one controller runs (a test, a single replica by design)."""
    namespace: str = "kube-system"
    """Namespace of the Lease: where the controller's Deployment runs."""
    name: str = "elasticgpu-controller"
    """Name of the Lease; every replica of one controller uses the same."""
    lease_duration_s: float = 10.0
    """Seconds after the holder's last renewal before a standby may take the Lease: how long a
    dead leader blocks binding."""
    renew_deadline_s: float = 7.0
    """Seconds a leader keeps trying to renew before it stops leading. Below lease_duration_s by
    more than retry_period_s, so it has stopped before any standby can take over."""
    retry_period_s: float = 2.0
    """Seconds between a leader's renewals and between a standby's attempts (jittered up to
    +20%, so standbys do not read in step)."""
    request_timeout_s: float = 4.0
    """Seconds one Lease request may take. A leader's renewal is cut shorter still: no request
    outlasts its renew deadline, so a hung connection cannot keep it leading past it."""

    def __post_init__(self) -> None:
        if not self.lease_duration_s > self.renew_deadline_s + self.retry_period_s:
            raise ValueError(
                f"LeaderSettings: lease_duration_s ({self.lease_duration_s:g}) must exceed renew_deadline_s "
                f"({self.renew_deadline_s:g}) + retry_period_s ({self.retry_period_s:g}), or a standby could "
                "take the Lease while the old leader still leads; lengthen the lease or shorten the deadline")
        if not self.renew_deadline_s > self.retry_period_s:
            raise ValueError(f"LeaderSettings: renew_deadline_s ({self.renew_deadline_s:g}) must exceed "
                             f"retry_period_s ({self.retry_period_s:g})")


def default_identity() -> str:
    """This process's identity in the Lease: host name (the Pod's name in a cluster) and a
    random suffix, so a restarted process never mistakes the old holder for itself."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaseClient(Protocol):
    """The three Lease calls the elector needs, each given up after `timeout_s` seconds.
    Errors: `errors.Conflict` for a 409 (someone else wrote first), `errors.ApiError` for
    everything else that failed (a timeout included)."""

    def get(self, namespace: str, name: str, *, timeout_s: float) -> Body | None:
        """The Lease as a dict, or None when it does not exist."""

    def create(self, namespace: str, body: Body, *, timeout_s: float) -> Body:
        """Create the Lease; `errors.Conflict` (AlreadyExists) when it exists."""

    def replace(self, namespace: str, name: str, body: Body, *, timeout_s: float) -> Body:
        """PUT the Lease with `body["metadata"]["resourceVersion"]` as precondition."""


class KubernetesLeases:
    """`LeaseClient` over kubernetes.client's CoordinationV1Api (dicts in, dicts out)."""

    def __init__(self, api_client: Any) -> None:
        """`api_client`: a kubernetes.client.ApiClient (the controller's: same TLS and token)."""
        from kubernetes import client

        self._api = client.CoordinationV1Api(api_client)

    @classmethod
    def on(cls, configuration: Any) -> KubernetesLeases:
        """Leases through their own ApiClient on `configuration` (a kubernetes.client.Configuration,
        the controller's: same server, TLS and token)."""
        import copy

        from kubernetes import client

        # A copy without urllib3's retries: it retries a read that timed out up to three times,
        # each with the whole timeout again, which ran a renewal cut at the renew deadline on
        # past it. The renew loop decides when to try again.
        own = copy.deepcopy(configuration)
        own.retries = False
        return cls(client.ApiClient(own))

    def _call(self, what: str, call: Callable[..., Any], *args: Any, timeout_s: float,
              missing_ok: bool = False) -> Body | None:
        import json

        import urllib3
        from kubernetes import client

        try:
            response = call(*args, _preload_content=False, _request_timeout=timeout_s)
            data: Body = json.loads(response.data)
            return data
        except client.ApiException as err:
            if err.status == 404 and missing_ok:
                return None
            message = f"{what}: HTTP {err.status} {err.reason}: {(err.body or '')[:300]!s}"
            if err.status == 409:
                raise errors.Conflict(message, status=409) from None
            raise errors.ApiUnavailable(message, status=err.status or 0) from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise errors.ApiUnavailable(f"{what}: no answer: {err}") from None

    def get(self, namespace: str, name: str, *, timeout_s: float = 4.0) -> Body | None:
        """The Lease `namespace/name`, or None."""
        return self._call(f"get Lease {namespace}/{name}", self._api.read_namespaced_lease, name, namespace,
                          timeout_s=timeout_s, missing_ok=True)

    def create(self, namespace: str, body: Body, *, timeout_s: float = 4.0) -> Body:
        """Create the Lease."""
        created = self._call(f"create Lease {namespace}/{body['metadata']['name']}",
                             self._api.create_namespaced_lease, namespace, body, timeout_s=timeout_s)
        assert created is not None  # only a read may find nothing
        return created

    def replace(self, namespace: str, name: str, body: Body, *, timeout_s: float = 4.0) -> Body:
        """Replace the Lease (resourceVersion precondition in the body)."""
        replaced = self._call(f"update Lease {namespace}/{name}", self._api.replace_namespaced_lease,
                              name, namespace, body, timeout_s=timeout_s)
        assert replaced is not None
        return replaced


def _micro_time(at: float) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC) of the epoch time `at`."""
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")




class LeaderElector:
    """Acquires, renews and releases one Lease for `identity`.

    Use: `acquire(stop)` blocks until this process leads (True) or `stop` is set (False); then
    `keep(stop, on_lost=...)` renews in a thread until `stop` (then releases) or until renewal
    fails for `renew_deadline_s` (then calls `on_lost` once). `healthy()` is a /healthz check.
    """

    def __init__(self, leases: LeaseClient, settings: LeaderSettings | None = None, *,
                 identity: str | None = None, on_change: Callable[[bool], None] | None = None,
                 on_renew: Callable[[float, float], None] | None = None) -> None:
        """`on_change(leading)` is told each time leadership is gained or lost (a metric);
        `on_renew(seconds, late_s)` after each renewal attempt, how long it took and how late
        it began (metrics: a late start is this process starved, a long one the server)."""
        self.leases = leases
        self.settings = settings or LeaderSettings()
        self.identity = identity or default_identity()
        self._on_change = on_change
        self._on_renew = on_renew
        self._written: Body | None = None
        """The Lease as our last successful write returned it, while leading: the next renewal
        is one PUT of it (client-go's fast path) instead of a read and a write."""
        self._lock = threading.Lock()
        self._leading = False
        self._renewed_at: float | None = None  # monotonic time of our last successful write
        # What we last saw of the Lease and the monotonic interval in which it last changed.
        self._seen: tuple[str, str, str] | None = None  # (resourceVersion, holder, renewTime)
        self._seen_at = 0.0  # monotonic: the read that showed the current record
        self._changed_at = 0.0  # monotonic: our estimate of when the holder wrote it
        self._expires_at = 0.0  # monotonic: when the current holder's lease runs out
        self._rng = random.Random()
        self._blocked = ""
        """Why no attempt can succeed until an admin acts (the Lease API or its namespace is
        missing: a 404), said once in the log and by `ready`; empty otherwise."""

    # -- state -----------------------------------------------------------------------------------
    @property
    def leading(self) -> bool:
        """Whether this process holds the Lease: it acquired it and renewed it within the renew
        deadline (false at the deadline even when the renew thread is stuck)."""
        with self._lock:
            renewed_at = self._renewed_at
            return (self._leading and renewed_at is not None
                    and time.monotonic() - renewed_at < self.settings.renew_deadline_s)

    def healthy(self) -> tuple[bool, str]:
        """A /healthz check: fails when this process believes it leads but has not renewed for
        longer than the lease lasts (its renew thread is stuck: a standby may lead already)."""
        with self._lock:
            if not self._leading or self._renewed_at is None:
                return True, ""
            late = time.monotonic() - self._renewed_at
        if late > self.settings.lease_duration_s:
            return False, (f"Lease {self.settings.namespace}/{self.settings.name} held by {self.identity} "
                           f"not renewed for {late:.0f}s (lease duration {self.settings.lease_duration_s:g}s)")
        return True, ""

    def ready(self) -> tuple[bool, str]:
        """A /readyz check: fails while the Lease cannot be taken at all (a 404: this process would
        stand by for ever, binding nothing, while looking like a healthy standby)."""
        with self._lock:
            blocked = self._blocked
        return (False, blocked) if blocked else (True, "")

    def _missing(self, err: errors.ApiError) -> str:
        """What a 404 on the Lease means and the fix, in one line."""
        s = self.settings
        if "namespaces" in str(err):
            return (f"cannot take the leader Lease {s.namespace}/{s.name}: namespace {s.namespace} does not exist;"
                    " create it, name another with --leader-elect-namespace, or run one replica with"
                    " --leader-elect=false")
        return (f"cannot take the leader Lease {s.namespace}/{s.name}: this API server has no Lease API"
                " (coordination.k8s.io/v1 answers 404); run one replica with --leader-elect=false, or use a"
                " server that serves Leases (Kubernetes 1.14 and later do)")

    def _set_leading(self, leading: bool, *, renewed_at: float | None = None) -> None:
        with self._lock:
            changed, self._leading = self._leading != leading, leading
            if leading:
                self._renewed_at = renewed_at if renewed_at is not None else time.monotonic()
            else:
                self._written = None
        if changed and self._on_change is not None:
            self._on_change(leading)

    # -- one attempt -----------------------------------------------------------------------------
    def _observe(self, lease: Body, read_started: float, now: float) -> None:
        """Record what a read (begun at monotonic `read_started`, answered at `now`) showed."""
        spec = lease.get("spec") or {}
        record = (str(lease["metadata"].get("resourceVersion", "")), spec.get("holderIdentity") or "",
                  spec.get("renewTime") or "")
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_duration_s)
        if record != self._seen:
            # The holder wrote after our previous read of the old record (or, on the first read,
            # at most one lease ago) and before this read answered.
            earliest = self._seen_at if self._seen is not None else now - duration
            renewed = timestamps.epoch_seconds(record[2])
            estimate = now - (time.time() - renewed) if renewed is not None else now
            self._changed_at = min(max(estimate, earliest), now)
            self._seen = record
        self._seen_at = read_started
        self._expires_at = self._changed_at + duration

    def _timeout(self, deadline: float | None) -> float:
        """Seconds the next request may take: the request timeout, cut at `deadline`."""
        if deadline is None:
            return self.settings.request_timeout_s
        left = deadline - time.monotonic()
        if left <= 0.05:
            raise errors.ApiUnavailable(f"Lease {self.settings.namespace}/{self.settings.name}: renew deadline "
                                        f"({self.settings.renew_deadline_s:g}s) passed")
        return min(self.settings.request_timeout_s, left)

    def try_acquire_or_renew(self, *, deadline: float | None = None) -> bool:
        """One attempt: read the Lease and take or renew it if it is ours, free or expired.
        True when this process holds it afterwards. Raises `errors.ApiError` when the server
        could not be asked or refused for a reason other than a lost race. `deadline`
        (monotonic): no request lasts past it."""
        s = self.settings
        started = time.monotonic()
        if deadline is not None and self._written is not None and self._leading:
            renewed = self._renew_written(self._written, started, deadline)
            if renewed:
                return True
            # Someone wrote since our last write (or it answered 409 to a write of ours whose
            # answer was lost): read the Lease and decide as any candidate does.
        lease = self.leases.get(s.namespace, s.name, timeout_s=self._timeout(deadline))
        now = time.monotonic()
        wall = time.time()
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": s.name, "namespace": s.namespace},
                    "spec": self._spec(acquire_time=_micro_time(wall), transitions=0, wall=wall)}
            try:
                created = self.leases.create(s.namespace, body, timeout_s=self._timeout(deadline))
            except errors.Conflict:
                return False  # another candidate created it first
            self._observe(created, started, time.monotonic())
            self._written = created
            self._took("created")
            return True
        self._observe(lease, started, now)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        ours = holder == self.identity
        if holder and not ours and now < self._expires_at:
            return False  # held and not expired
        transitions = int(spec.get("leaseTransitions") or 0)
        new_spec = self._spec(
            acquire_time=spec.get("acquireTime") if ours else _micro_time(wall),
            transitions=transitions if ours else transitions + 1, wall=wall)
        body = {**lease, "spec": {**spec, **new_spec}}
        try:
            replaced = self.leases.replace(s.namespace, s.name, body, timeout_s=self._timeout(deadline))
        except errors.Conflict:
            return False  # someone wrote since our read: read again on the next attempt
        self._observe(replaced, started, time.monotonic())
        self._written = replaced
        if not ours:
            self._took(f"taken over from {holder or 'nobody (released)'}")
        return True

    def _renew_written(self, written: Body, started: float, deadline: float) -> bool:
        """The leader's renewal in one request: PUT the Lease as our last write returned it,
        with a new renewTime, its resourceVersion the precondition (client-go's optimistic
        renewal). A read first doubled each renewal's requests, and under a busy server or a
        GIL-bound process each request is the slow part. False on a 409: someone wrote since."""
        s = self.settings
        spec = written.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return False
        body = {**written, "spec": {**spec, "renewTime": _micro_time(time.time()),
                                    "leaseDurationSeconds": round(s.lease_duration_s)}}
        try:
            replaced = self.leases.replace(s.namespace, s.name, body, timeout_s=self._timeout(deadline))
        except errors.Conflict:
            self._written = None
            return False
        self._observe(replaced, started, time.monotonic())
        self._written = replaced
        return True

    def _spec(self, *, acquire_time: str | None, transitions: int, wall: float) -> Body:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": round(self.settings.lease_duration_s),
                "acquireTime": acquire_time, "renewTime": _micro_time(wall), "leaseTransitions": transitions}

    def _took(self, how: str) -> None:
        log.info("leading: Lease %s/%s %s by %s", self.settings.namespace, self.settings.name, how, self.identity)

    def _pause(self) -> float:
        """Seconds to the next attempt: the retry period (jittered), or less when the holder's
        lease runs out sooner, so a standby tries right when it may take over."""
        pause = self.settings.retry_period_s * self._rng.uniform(1.0, 1.2)
        if not self._leading and self._seen is not None and self._seen[1]:
            until_expiry = self._expires_at - time.monotonic() + 0.05
            pause = min(pause, max(until_expiry, 0.05))
        return pause

    # -- loops -----------------------------------------------------------------------------------
    def acquire(self, stop: threading.Event) -> bool:
        """Block until this process leads (True) or `stop` is set (False)."""
        s = self.settings
        announced = False
        while not stop.is_set():
            attempt = time.monotonic()
            try:
                if self.try_acquire_or_renew():
                    with self._lock:
                        self._blocked = ""
                    self._set_leading(True, renewed_at=attempt)
                    return True
                if not announced and self._seen is not None:
                    log.info("standing by: Lease %s/%s is held by %s", s.namespace, s.name, self._seen[1])
                    announced = True
            except errors.ApiError as err:
                if err.status == 404:
                    # No retry can succeed until an admin acts: say it once, with the fix, and keep
                    # trying quietly (the API or the namespace may be added).
                    blocked = self._missing(err)
                    with self._lock:
                        said, self._blocked = self._blocked == blocked, blocked
                    if said:
                        log.debug("Lease %s/%s still missing: %s", s.namespace, s.name, err)
                    else:
                        log.error("%s (%s)", blocked, err)
                else:
                    log.warning("cannot read or take Lease %s/%s yet: %s", s.namespace, s.name, err)
            stop.wait(self._pause())
        return False

    def keep(self, stop: threading.Event, *, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew the Lease every retry period in a daemon thread. When `stop` is set: release it
        and end. When renewing fails for `renew_deadline_s`: stop leading, call `on_lost()` once
        and end (the caller stops its work at once)."""
        thread = threading.Thread(target=self._renew_loop, args=(stop, on_lost), name="leader-renew", daemon=True)
        thread.start()
        return thread

    def _renew_loop(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        s = self.settings
        # Times are those at which a successful attempt began: the renewTime it wrote is from
        # then, and a standby counts the lease from that renewTime.
        last_ok = self._renewed_at if self._renewed_at is not None else time.monotonic()
        last_attempt = last_ok
        while True:
            deadline = last_ok + s.renew_deadline_s
            # The next attempt is a retry period after the previous one *began*, not ended: a
            # renewal that took 3 s must not push the next one 3 s later toward the deadline.
            # And at the deadline at the latest: leadership ends there, not a retry period later.
            due = max(min(last_attempt + self._pause(), deadline), time.monotonic())
            if stop.wait(due - time.monotonic()):
                break
            attempt = last_attempt = time.monotonic()
            late = attempt - due  # the wake-up's lateness: this thread waited for a CPU or the GIL
            reason = f"not renewed within the renew deadline ({s.renew_deadline_s:g}s)"
            renewed = False
            try:
                if attempt < deadline:
                    renewed = self.try_acquire_or_renew(deadline=deadline)
                    if not renewed:
                        reason = f"held by {self._seen[1] if self._seen else 'someone else'}"
            except errors.ApiError as err:
                reason = str(err)
            self._attempted(attempt, late, renewed)
            if renewed:
                last_ok = attempt
                self._set_leading(True, renewed_at=attempt)
                continue
            if self._seen is not None and self._seen[1] not in ("", self.identity):
                log.error("lost Lease %s/%s: %s", s.namespace, s.name, reason)  # someone else took it
            elif time.monotonic() < deadline:
                log.warning("could not renew Lease %s/%s (retrying): %s", s.namespace, s.name, reason)
                continue
            else:
                log.error("lost Lease %s/%s: not renewed for %.1fs: %s", s.namespace, s.name,
                          time.monotonic() - last_ok, reason)
            self._set_leading(False)
            on_lost()
            return
        self.release()

    def _attempted(self, attempt: float, late: float, renewed: bool) -> None:
        """Say how long a renewal attempt took and how late it began (a late start: this
        process did not run the renew thread in time; a long attempt: the server or the GIL)."""
        took = time.monotonic() - attempt
        s = self.settings
        if self._on_renew is not None:
            self._on_renew(took, late)
        if renewed and took + late > s.retry_period_s:
            log.warning("renewing Lease %s/%s took %.2fs and began %.2fs late (the leader steps down %gs after "
                        "its last renewal): a slow API server or a starved process", s.namespace, s.name, took,
                        late, s.renew_deadline_s)
        else:
            log.debug("Lease %s/%s renewal attempt: %.3fs, began %.3fs late, renewed: %s", s.namespace, s.name,
                      took, late, renewed)

    def release(self) -> None:
        """Give the Lease up if this process holds it (holder "", duration 1 s): a standby takes
        over at its next attempt. Failures are logged; the Lease then expires on its own."""
        s = self.settings
        if not self._leading:
            return
        self._set_leading(False)
        try:
            lease = self.leases.get(s.namespace, s.name, timeout_s=s.request_timeout_s)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            wall = time.time()
            spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _micro_time(wall)}
            self.leases.replace(s.namespace, s.name, {**lease, "spec": spec}, timeout_s=s.request_timeout_s)
            log.info("released Lease %s/%s", s.namespace, s.name)
        except errors.ApiError as err:
            log.warning("could not release Lease %s/%s (it expires in %gs): %s", s.namespace, s.name,
                        s.lease_duration_s, err)
