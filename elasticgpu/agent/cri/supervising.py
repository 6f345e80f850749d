"""The CRI hook inside the running agent: the CDI spec kept true, the proxy kept serving.

One thread (`CriHook.run`) with two duties, each retried on its own with backoff, so that
neither stops the other (kubelet needs the socket even when the spec cannot be written):

    CDI spec   written at start from discovery's cards (`Card.minor`, `Card.device_path`) and
               the backend's control devices; written again when they change (a card appeared,
               vanished, nvidia-uvm was created), and checked every `cdi_check_interval_s`
               (someone removed or edited the file). Until it has been written, claims are
               refused as retryable (`spec_problem`, read by the view).
    proxy      a `CriProxy` with fresh hooks (gated.GatedHooks: `ClaimHooks` once the ledger is
               open; a restarted proxy reconciles again before it takes claims); restarted
               when starting it fails (the listen path is taken,
               the folder cannot be made) or when its socket vanished or was replaced (a
               cleaned /var/run): kubelet could no longer reach it.
    front      with `settings.front` (--cri-front nginx, or auto with nginx found): nginx on
               kubelet's socket (front.py), sending the proxy's three methods to the proxy, now
               on its hook socket, and every other call straight to the runtime. Restarted with
               backoff when it exits (a kill -9) or its socket vanished or was replaced; its
               calls to a proxy that is restarting get UNAVAILABLE, which kubelet retries.
               Without it the proxy listens on kubelet's socket itself (as before the front).

    ledger     the agent serves the socket before its ledger, device backend and API client are
               open (starting.py): until then only claim containers are refused (gated.py).
               Once the ledger is open, the start-up reconciliation (after a rebuild, for a
               ledger that replaced a corrupt one) runs from this loop, retried with backoff.

A failure is logged once, at warning, with what to fix; the same failure again is logged at
debug, and its end at info. `run` returns when `stop` is set, after stopping the front (its calls
in flight are cut: nginx in one process has no graceful stop), then the proxy (calls in flight
get `grace_s`) and finishing the ledger writes its hooks queued.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from elasticgpu.agent import isolation, rdma
from elasticgpu.agent.cri import front
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.discovery import Card
from elasticgpu.agent.injecting import cdi, dra_containers, driver, gated, injection, limits_file
from elasticgpu.agent.ledger.store import LedgerStore
from elasticgpu.agent.rdma import spec_file as rdma_spec
from elasticgpu.agent.repeated_failures import RepeatedFailure

log = logging.getLogger(__name__)


@dataclass
class _Retry:
    """Failures of one duty in a row and when to try again; said once (`RepeatedFailure`)."""

    what: str
    first_s: float
    longest_s: float
    next_at: float = 0.0
    said: RepeatedFailure = field(init=False)

    def __post_init__(self) -> None:
        self.said = RepeatedFailure(self.what, log)

    @property
    def failures(self) -> int:
        return self.said.failures

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def failed(self, error: BaseException, now: float) -> None:
        delay = min(self.longest_s, self.first_s * 2 ** self.failures)
        self.next_at = now + delay
        self.said.failed(error, retry_in_s=delay)

    def succeeded(self) -> None:
        self.said.worked()
        self.next_at = 0.0


@dataclass(frozen=True, kw_only=True)
class HookSettings:
    """How the agent runs its CRI hook."""

    proxy: ProxySettings
    """The Python proxy; it listens on kubelet's socket, or on the hook socket behind the front."""
    front: front.FrontSettings | None = None
    """nginx on kubelet's socket (None: the proxy alone serves kubelet)."""
    injection: injection.InjectionSettings = field(default_factory=injection.InjectionSettings)
    cdi_dir: Path = Path("/var/run/cdi")
    cdi_check_interval_s: float = 30.0
    tick_s: float = 0.5
    """Seconds between looks at the socket and the cards (a stat and a tuple compare)."""
    backoff_s: tuple[float, float] = (0.5, 30.0)
    """First and longest wait after a failure of a duty (doubling)."""
    grace_s: float = 5.0
    """Seconds calls in flight get to finish when the agent stops."""
    limits_dir: Path | None = None
    """Folder of the claims' limits files, mounted read-only into claim containers so that a resize
    reaches them while they run (docs/resize-node.md); None: no limits files."""
    proxy_hooks: bool = True
    """The proxy calls the core's hooks (kubelet's endpoint). False with --node-hook nri: the proxy only
    serves the agent (policing, listings) and passes through; the NRI front calls the core's hooks,
    attaches its own listing (the OCI spec's annotations) and runs the start-up reconciliation."""


class CriHook:
    """The CDI spec and the supervised proxy (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: HookSettings,
        view: injection.AgentView,
        ledger: LedgerStore | Callable[[], LedgerStore | None],
        cards: Callable[[], Sequence[Card] | None],
        control_paths: Callable[[], Sequence[str]],
        nic_nodes: Callable[[str], Sequence[tuple[str, str]]] = lambda nic: (),
        driver_files: Callable[[], driver.DriverFiles] | None = None,
        devices_problem: Callable[[], str | None] = lambda: None,
        owed_rebuild: Callable[[], bool] = lambda: False,
        rebuilt: Callable[[], None] = lambda: None,
        rooms: isolation.IsolationRooms | None = None,
        wrap: gated.Wrap | None = None,
    ) -> None:
        """`wrap`: hooks around the claim hooks (the agent's MIG room; see gated.GatedHooks);
        `rooms`: the node's isolation modes (None: mode None only; the agent owns and closes them);
        `ledger`: the ledger, or how to get it once it is open (None before); `driver_files`: the
        driver's files for the spec's mounts (None: device nodes only); `devices_problem`: why the
        cards are not known yet (the spec is not written meanwhile: an empty one would replace a
        good one), or None; `owed_rebuild` and `rebuilt`: see gated.GatedHooks."""
        self.settings = settings
        self.rooms = rooms
        self._wrap = wrap
        self._driver_files = driver_files
        self._view = view
        self.view = view
        """The agent's view (the NRI front's Events use it too)."""
        self._ledger: Callable[[], LedgerStore | None] = (
            (lambda: ledger) if isinstance(ledger, LedgerStore) else ledger
        )
        self._devices_problem = devices_problem
        self._owed_rebuild = owed_rebuild
        self._rebuilt = rebuilt
        self._cards = cards
        # RDMA NICs (agent/rdma): those under the cards' PCIe roots that have a verbs device node.
        self._nic_devices: tuple[rdma.NicDevices, ...] = ()
        self._nic_nodes = nic_nodes
        self.nics = rdma.NodeNics(lambda: (n.name for n in self._nic_devices), node=view.node_name)
        self._control_paths = control_paths
        self.dra_claims: Callable[[str], Sequence[dra_containers.DraClaim]] = lambda pod_uid: ()
        """The ResourceClaims the DRA driver prepared for a pod, by uid (set by the agent when it is a DRA driver)."""
        first, longest = settings.backoff_s
        self._spec_retry = _Retry("writing the CDI spec into " + str(settings.cdi_dir), first, longest)
        self._proxy_retry = _Retry(f"the CRI proxy on {settings.proxy.listen}", first, longest)
        self._settle_retry = _Retry("reconciling the ledger with the runtime's containers", first, longest)
        self._front_retry = _Retry(
            f"the CRI front (nginx) on {settings.front.listen}" if settings.front else "", first, longest
        )
        self._spec_inputs: tuple[object, ...] | None = None
        self._spec_checked = 0.0
        self._spec_problem: str | None = "the CDI spec of this node's cards is not written yet"
        self._socket: tuple[int, int] | None = None  # (device, inode) of the socket we bound
        self.proxy: CriProxy | None = None
        """The proxy serving now (None between a failure and its restart)."""
        self.hooks: gated.GatedHooks | None = None
        """The claim hooks of the proxy serving now."""
        self.limits = limits_file.LimitsFiles(settings.limits_dir) if settings.limits_dir is not None else None
        """The claims' limits files (the holders publisher keeps them true to the allocations), or None."""
        self.proxy_starts = 0
        """Proxies started (1 + restarts), for tests and logs."""
        self.front: front.NginxFront | None = None
        """The front serving now (None without one, or between a failure and its restart)."""
        self.front_starts = 0
        """Fronts started (1 + restarts), for tests and logs."""
        self._front_started = 0.0
        self.last_tick = time.monotonic()
        """When the loop last went round (the watchdog's sign that it is not stuck)."""

    def spec_problem(self) -> str | None:
        """Why claims cannot be given now on the spec's side (not written, last write failed), or None."""
        return self._spec_problem

    def stuck(self, now: float, *, allowed_s: float) -> str | None:
        """Why the loop looks stuck (no round for `allowed_s` seconds), or None."""
        idle = now - self.last_tick
        if idle > allowed_s:
            return f"the CRI hook's loop has not gone round for {idle:.0f} s"
        return None

    def not_serving(self) -> str | None:
        """Why kubelet's socket is not served now (readiness), or None when it is: the front
        (with one) and the proxy are up, their sockets in place."""
        if self.proxy is None:
            return f"the CRI proxy on {self.settings.proxy.listen} is not running"
        if self.settings.front is not None and (self.front is None or not self.front.alive()):
            return f"the CRI front (nginx) on {self.settings.front.listen} is not running"
        return None

    # --- the loop ---

    def run(self, stop: threading.Event) -> None:
        """Keep spec, proxy and front until `stop`, then stop the front and the proxy. Never raises."""
        self._log_mode()
        try:
            while not stop.is_set():
                now = self.last_tick = time.monotonic()
                if self._spec_retry.due(now) and (problem := self._devices_problem()) is not None:
                    self._spec_problem = f"the cards are not known yet ({problem})"
                elif self._spec_retry.due(now):
                    try:
                        self._keep_spec(now)
                        self._spec_retry.succeeded()
                    except Exception as e:
                        self._spec_problem = f"the CDI spec cannot be written into {self.settings.cdi_dir} ({e})"
                        self._spec_retry.failed(e, now)
                if self._proxy_retry.due(now):
                    try:
                        self._keep_proxy()
                        self._proxy_retry.succeeded()
                    except Exception as e:
                        self._stop_proxy()
                        self._proxy_retry.failed(e, now)
                if self.hooks is not None and not self.hooks.reconciled() and self._settle_retry.due(now):
                    try:
                        if self.hooks.settle():
                            self._settle_retry.succeeded()
                    except Exception as e:
                        self._settle_retry.failed(e, now)
                if self.settings.front is not None and self._front_retry.due(now):
                    try:
                        if self._keep_front(self.settings.front, now):
                            self._front_retry.succeeded()
                    except Exception as e:
                        self._stop_front()
                        self._front_retry.failed(e, now)
                stop.wait(self.settings.tick_s)
        finally:
            self._stop_front()  # first: no new call reaches a proxy that is stopping
            self._stop_proxy()

    def _log_mode(self) -> None:
        f = self.settings.front
        if f is None:
            log.info("CRI front: none; the agent's proxy serves kubelet on %s and forwards to %s",
                     self.settings.proxy.listen, self.settings.proxy.upstream)  # fmt: skip
        else:
            log.info("CRI front: nginx (%s) serves kubelet on %s: %s go to the agent's proxy on %s, every other call "
                     "to the runtime on %s", f.nginx, f.listen, ", ".join(sorted(m.rsplit("/", 1)[-1]
                     for m in front.HOOKED_METHODS)), f.hook, f.runtime)  # fmt: skip

    # --- the CDI spec ---

    def _keep_spec(self, now: float) -> None:
        cards = tuple(self._cards() or ())  # None: discovery has not run (the spec waits on devices_problem)
        control = tuple(self._control_paths())
        files = self._driver_files() if self._driver_files is not None else None
        inputs = (tuple((c.uuid, c.minor, c.device_path, c.nics) for c in cards), control, files)
        if inputs == self._spec_inputs and now - self._spec_checked < self.settings.cdi_check_interval_s:
            return
        written = cdi.write_spec(self.settings.cdi_dir, cdi.card_devices(cards), cdi.control_nodes(control), files)
        self._nic_devices = rdma_spec.nic_devices(cards, self._nic_nodes)
        if rdma_spec.write_spec(self.settings.cdi_dir, self._nic_devices):
            log.info("RDMA CDI spec written into %s: %s", self.settings.cdi_dir,
                     ", ".join(n.name for n in self._nic_devices) or "no NIC")
        if written:
            log.info("CDI spec written into %s: %d card(s) (%s), control devices %s", self.settings.cdi_dir,
                     len(cards), ", ".join(c.uuid for c in cards) or "none", ", ".join(control) or "none")
        self._spec_inputs, self._spec_checked, self._spec_problem = inputs, now, None

    # --- the proxy ---

    def _keep_proxy(self) -> None:
        if self.proxy is not None:
            if self._socket_intact():
                return
            log.warning("the CRI proxy's socket %s vanished or was replaced; kubelet cannot reach it: restarting "
                        "the proxy", self.settings.proxy.listen)
            self._stop_proxy()
        started: list[CriProxy] = []
        hooks = gated.GatedHooks(view=self._view, ledger=self._ledger, settings=self.settings.injection,
                                 owed_rebuild=self._owed_rebuild, rebuilt=self._rebuilt, limits=self.limits,
                                 rooms=self.rooms, wrap=self._wrap, nics=self.nics,
                                 dra_claims=lambda pod_uid: self.dra_claims(pod_uid),
                                 container_env=lambda container_id: started[0].container_env(container_id))
        proxy = CriProxy(self.settings.proxy, container_hooks=hooks) if self.settings.proxy_hooks else CriProxy(
            self.settings.proxy)
        started.append(proxy)
        try:
            proxy.start()  # leaves nothing behind when it fails
        except BaseException:
            hooks.close()
            raise
        self.proxy, self.hooks = proxy, hooks
        self.proxy_starts += 1
        found = os.stat(self.settings.proxy.listen)
        self._socket = (found.st_dev, found.st_ino)

    # --- the front ---

    def _keep_front(self, settings: front.FrontSettings, now: float) -> bool:
        """Start nginx, or check the one running; True once it has served a longest backoff."""
        if self.front is not None:
            if self.front.alive() and self.front.socket_intact():
                # Failures are forgotten only after a while up: an nginx that dies soon after
                # each start is restarted at ever longer intervals, not every half second.
                return now - self._front_started >= self.settings.backoff_s[1]
            code = self.front.exit_code()
            what = (f"exited (status {code})" if code is not None
                    else "lost its socket (removed or replaced)")  # fmt: skip
            self._stop_front()
            # Raised, so the restart waits the backoff.
            raise front.FrontError(f"nginx {what}; kubelet cannot reach the runtime until it is restarted")
        started = front.NginxFront(settings)
        started.start()  # leaves nothing running when it fails
        self.front, self._front_started = started, now
        self.front_starts += 1
        return False

    def _stop_front(self) -> None:
        stopping, self.front = self.front, None
        if stopping is not None:
            try:
                stopping.stop()
                log.info("CRI front (nginx) on %s stopped", stopping.settings.listen)
            except Exception:
                log.exception("stopping the CRI front (nginx) on %s failed", stopping.settings.listen)

    def _socket_intact(self) -> bool:
        try:
            found = os.lstat(self.settings.proxy.listen)
        except FileNotFoundError:
            return False
        return stat.S_ISSOCK(found.st_mode) and (found.st_dev, found.st_ino) == self._socket

    def _stop_proxy(self) -> None:
        proxy, hooks = self.proxy, self.hooks
        self.proxy, self.hooks, self._socket = None, None, None
        if proxy is not None:
            try:
                proxy.stop(self.settings.grace_s)
                log.info("CRI proxy on %s stopped", self.settings.proxy.listen)
            except Exception:
                log.exception("stopping the CRI proxy on %s failed", self.settings.proxy.listen)
        if hooks is not None:
            hooks.close()
