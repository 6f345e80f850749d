"""Start-up and shutdown of the agent: serve the CRI socket, open the parts, run the loops.

kubelet reaches the runtime of every pod of the node through the agent's socket, so the CRI hook
starts first, before anything that can fail on the node: the device backend (NVML), the ledger
and the API client are opened in the background (starting.py), retried with backoff, and until
they are, only claim containers are refused (cri/gated.py). The agent exits (2) only for its own
flags (a CDI form or a front that does not exist, a metrics port that cannot be bound).

Threads, each a loop that never dies (failures are logged and retried with backoff):
- inventory (and its watch of this node's GPU objects): GPU objects, heartbeat, Node labels;
- health: waits for XID events and wakes inventory after a fatal one;
- usage: samples per-process usage, attributes it to claims, writes claim status (rate-limited),
  then polices the claims over their memory (policing/: the runtime stops the container of a claim
  whose class says StopContainer, through the CRI proxy's runtime channel);
- parts: opens the device backend, the ledger and the API client (starting.py), then ends;
- starter: once they are open, makes inventory, health and usage and starts their threads;
- http: /metrics, read at scrape time, /healthz and /readyz (elasticgpu/probe_server.py);
- systemd (under systemd only, service_manager.py): READY=1 once kubelet's socket serves, then
  WATCHDOG=1 while every other loop is alive;
- cri (unless --cri-proxy false): the CDI spec of the cards and the CRI proxy kubelet talks to,
  supervised (cri/supervising.py), with the claim view read from the API server on demand
  (cri/claim_view.py); with --cri-front nginx (or auto and nginx found) nginx serves kubelet's
  socket and sends only the proxy's methods through it (cri/front.py).
A signal (SIGTERM from the kubelet, SIGINT) stops them; the agent then closes what it opened
(the proxy first: calls in flight finish and their ledger writes land before the ledger closes).
"""

from __future__ import annotations

import functools
import logging
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from elasticgpu import flags, probe_server
from elasticgpu.agent import (
    discovery,
    errors,
    health,
    inventory,
    isolation,
    kube,
    metrics,
    mig,
    mps_serving,
    node_checks,
    nri,
    policing,
    service_manager,
    starting,
    taking_over,
    usage,
)
from elasticgpu.agent.cri import front, supervising
from elasticgpu.agent.cri.proxy import ProxySettings
from elasticgpu.agent.discovery import Card
from elasticgpu.agent.injecting import claim_view, driver, gated, hooks, injection
from elasticgpu.agent.injecting.hooks import RuntimeContainer
from elasticgpu.agent.injecting.limits_file import LimitsFiles
from elasticgpu.agent.ledger.store import LedgerStore
from elasticgpu.agent.settings import AgentSettings, CriSettings
from elasticgpu.api import node_handover

if TYPE_CHECKING:
    from elasticgpu.agent.dra import checkpoint as dra_checkpoint

logger = logging.getLogger(__name__)


def _serve_http(settings: AgentSettings, sources: Callable[[], metrics.Sources | None],
                healthz: dict[str, probe_server.Check],
                readyz: dict[str, probe_server.Check]) -> list[probe_server.Endpoints]:  # fmt: skip
    """The /metrics server and the probes' (one server when they share an address); raises `AgentError`."""
    try:
        metrics_at, probes_at = settings.metrics.endpoints()
    except ValueError as e:
        raise errors.AgentError(str(e)) from None
    old = settings.metrics
    if not old.metrics_bind_address and (old.metrics_address, old.metrics_port) != ("0.0.0.0", 9410):
        logger.info("--metrics-address / --metrics-port are deprecated: write --metrics-bind-address %s",
                    f"{old.metrics_address}:{old.metrics_port}" if old.metrics_port else "0")  # fmt: skip
    try:
        servers = probe_server.servers(health=probes_at, metrics=metrics_at, registry=metrics.registry(sources),
                                       healthz=healthz, readyz=readyz)
    except OSError as e:
        raise errors.AgentError(
            f"the agent's HTTP server cannot listen on {_shown(metrics_at)} (metrics) / {_shown(probes_at)} (probes)"
            f" ({e.strerror}): choose another --metrics-bind-address /"
            " --health-probe-bind-address, or 0 for none"
        ) from None
    for server in servers:
        server.start()
        logger.info("%s on http://%s:%d", ", ".join(server.paths), server.host, server.port)
    return servers


def _shown(address: flags.BindAddress | None) -> str:
    return f"{address.host}:{address.port}" if address is not None else "none"


def _api_problem(parts: starting.Parts, window_s: float) -> str | None:
    """Why the API server is not ready for the agent (its client not open, no answer within `window_s`), or None."""
    if (problem := parts.problem_of("kube")) is not None:
        return problem
    agent_kube = parts.kube
    failure = f" ({agent_kube.last_failure})" if agent_kube.last_failure else ""
    if agent_kube.answered_at is None:
        return "the API server has not answered the agent yet" + failure
    silent = time.monotonic() - agent_kube.answered_at
    return f"the API server has not answered the agent for {silent:.0f} s{failure}" if silent > window_s else None


def _front_settings(cri: CriSettings) -> front.FrontSettings | None:
    """nginx in front of the proxy (--cri-front), or None; raises `AgentError` for nginx that is not there."""
    if cri.cri_front not in front.MODES:
        raise errors.AgentError(f"--cri-front / ELASTICGPU_AGENT_CRI_FRONT={cri.cri_front!r} is not a front; use one "
                                f"of {', '.join(front.MODES)}")  # fmt: skip
    if cri.cri_front == "none":
        return None
    binary = front.find_nginx(cri.cri_nginx)
    if binary is None:
        if cri.cri_front == "nginx":
            raise errors.AgentError(
                f"--cri-front nginx: no nginx with HTTP/2 and gRPC at --cri-nginx {cri.cri_nginx!r}; install nginx "
                "(Debian: apt-get install nginx), point --cri-nginx at it, or use --cri-front auto or none"
            )
        logger.info("--cri-front auto: no nginx with HTTP/2 and gRPC found (--cri-nginx %r); the agent's proxy "
                    "serves kubelet itself", cri.cri_nginx)  # fmt: skip
        return None
    state = Path(cri.cri_front_dir)
    return front.FrontSettings(listen=Path(cri.cri_listen), runtime=cri.cri_upstream, hook=state / "hook.sock",
                               state_dir=state, nginx=binary, nginx_version=front.nginx_version(binary))  # fmt: skip


NODE_HOOKS = ("cri-proxy", "nri")
"""--node-hook: the CRI proxy on kubelet's runtime endpoint, or the runtime's NRI (issue 34)."""


def hook_settings(cri: CriSettings) -> supervising.HookSettings:
    """The CRI hook's settings from the agent's; raises `AgentError` for a CDI form that does not exist or a
    `--privileged-pods` entry that cannot be read."""
    try:
        form = injection.CdiForm(cri.cdi_form)
    except ValueError:
        raise errors.AgentError(
            f"--cdi-form / ELASTICGPU_AGENT_CDI_FORM={cri.cdi_form!r} is not a CDI request form; use one of "
            + ", ".join(f.value for f in injection.CdiForm)
        ) from None
    if cri.node_hook not in NODE_HOOKS:
        raise errors.AgentError(f"--node-hook / ELASTICGPU_AGENT_NODE_HOOK={cri.node_hook!r} is not a node hook; use "
                                f"one of {', '.join(NODE_HOOKS)}")  # fmt: skip
    # With NRI kubelet talks to the runtime itself: the proxy serves only the agent (policing's StopContainer,
    # the holders' ListContainers), on a private socket, with no nginx in front.
    nginx_front = _front_settings(cri) if cri.node_hook == "cri-proxy" else None
    listen = Path(cri.cri_front_dir) / "nri-mode-cri.sock" if cri.node_hook == "nri" else Path(cri.cri_listen)
    try:
        privileged_pods = injection.parse_privileged_pods(cri.privileged_pods)
    except ValueError as e:
        raise errors.AgentError(str(e)) from None
    return supervising.HookSettings(
        # Behind the front the proxy listens on its hook socket; alone, on kubelet's.
        proxy=ProxySettings(listen=nginx_front.hook if nginx_front else listen,
                            upstream=cri.cri_upstream),
        front=nginx_front,
        injection=injection.InjectionSettings(
            cdi_form=form, neutralise_unclaimed=cri.neutralise_unclaimed, refuse_privileged=cri.refuse_privileged,
            privileged_namespaces=tuple(n.strip() for n in cri.privileged_namespaces.split(",") if n.strip()),
            privileged_pods=privileged_pods),
        cdi_dir=Path(cri.cdi_dir),
        cdi_check_interval_s=cri.cdi_check_interval_s,
        limits_dir=Path(cri.limits_dir) if cri.limits_dir else None,  # issue 17: a resize reaches running containers
        proxy_hooks=cri.node_hook == "cri-proxy",
    )


STUCK_AFTER_S = 60.0
"""A CRI hook loop that has not gone round for this long is stuck: the watchdog is no longer pinged."""


def _not_alive(threads: list[threading.Thread], hook: supervising.CriHook | None) -> str | None:
    """What is dead or stuck among the agent's loops (their loops never end before the stop), or None."""
    # `parts` ends once every part is open; its loops (inventory, health, usage) join `threads` then.
    dead = [t.name for t in threads if t.name not in ("systemd", "parts") and not t.is_alive()]
    if dead:
        return f"the agent's {', '.join(dead)} loop(s) ended"
    return hook.stuck(time.monotonic(), allowed_s=STUCK_AFTER_S) if hook is not None else None


@dataclass
class _Loops:
    """What the starter made once every part was open (None before)."""

    publisher: inventory.Inventory | None = None
    sources: metrics.Sources | None = None
    limits: LimitsFiles | None = None
    """The CRI hook's claims' limits files: the holders publisher keeps them true to the allocations."""
    runtime: Callable[[], policing.ContainerStopper | None] = lambda: None
    """The runtime client policing stops containers through: the CRI proxy serving now (None while it is
    down; always None with --cri-proxy false, where no claim reaches a container anyway)."""
    list_containers: Callable[[], Sequence[Any]] | None = None
    """The runtime's containers through the CRI hook's proxy: the holders publisher leaves out exited ones."""
    rooms: isolation.IsolationRooms | None = None
    """The node's isolation modes (the CRI hook's); inventory publishes those the node can provide."""
    node_conditions: Callable[[], list[inventory.NodeCondition]] = list
    """The node's conditions (another allocator, the toolkit's fail-open setting, the node hook), on each GPU."""
    hook: supervising.CriHook | None = None
    """The node hook (CRI proxy or NRI), None with --cri-proxy false."""
    dra: Any = None
    """The DRA driver's kubelet plugin (dra/plugin_serving.KubeletPlugin) once it listens; None: not a DRA driver."""
    dra_policy: Callable[[str], policing.Policy | None] = lambda uid: None
    """The over-limit policy the DRA driver kept for a ResourceClaim (by uid) at prepare; None: none kept."""


def _containers(hook: supervising.CriHook) -> list[hooks.RuntimeContainer]:
    """The runtime's containers through the proxy serving now; raises while none serves (between restarts)."""
    proxy = hook.proxy
    if proxy is None:
        raise errors.AgentError("the CRI proxy is not serving: the runtime's containers cannot be listed now")
    return proxy.list_containers()


def _isolation_rooms(settings: AgentSettings, driver_root: Callable[[], str]) -> isolation.IsolationRooms:
    """The node's isolation modes from the settings (docs/isolation.md)."""
    iso = settings.isolation
    state = Path(iso.isolation_dir)
    rooms: list[isolation.Room] = []
    if iso.mps:
        control = mps_serving.control_finder(settings, driver_root)
        daemons: isolation.Daemons = (
            isolation.MpsDaemonsClient(socket_path=Path(iso.mps_daemons_socket), state_dir=state / "mps")
            if iso.mps_daemons_socket else mps_serving.daemons_here(settings, control))
        rooms.append(isolation.MpsRoom(daemons, control=control,
                                       control_setting="looked for under the driver root, --driver-root"))
    rooms.append(isolation.HamiCoreRoom(library=iso.hami_core_library, host_root=settings.cri.host_root,
                                        state_dir=state / "hami-core", idle_grace_s=iso.isolation_idle_grace_s))
    return isolation.IsolationRooms(rooms)


def _open_kube(settings: AgentSettings, node: str) -> kube.AgentKube:
    try:
        api_client = kube.load_api_client(settings.kube.kubeconfig, settings.kube.context)
    except Exception as e:  # the kubernetes package's config errors: say what to fix
        raise errors.AgentError(f"no Kubernetes credentials: {e}; run in a pod with a service account,"
                                " or pass --kubeconfig") from None
    return kube.AgentKube(api_client, node_name=node, field_manager=settings.kube.field_manager,
                          timeout_s=settings.kube.request_timeout_s)  # fmt: skip


def _start_loops(settings: AgentSettings, parts: starting.Parts, loops: _Loops, threads: list[threading.Thread],
                 stop: threading.Event, takeover: taking_over.TakeOver) -> None:  # fmt: skip
    """Once every part is open and the agent may take the node's GPUs (taking_over.py): make inventory, health and
    usage and start their threads. Never raises."""
    while not (parts.ready.wait(0.5) and takeover.allowed.is_set()):
        if stop.is_set():
            return
    backend, ledger, agent_kube = parts.backend, parts.ledger, parts.kube
    tracker = health.HealthTracker(recovery_quiet_s=settings.health.recovery_quiet_s)
    rooms = loops.rooms
    publisher = inventory.Inventory(kube=agent_kube, backend=backend, health=tracker, settings=settings.inventory,
                                    watch_timeout_s=settings.kube.watch_timeout_s, ledger=ledger,
                                    isolation=rooms.offered if rooms is not None else list,
                                    node_conditions=loops.node_conditions)
    sampler = usage.UsageLoop(backend=backend, ledger=ledger, kube=agent_kube, inventory=publisher,
                              settings=settings.usage, ledger_settings=settings.ledger)
    sampler.policing = policing.Enforcer(kube=agent_kube, runtime=lambda: loops.runtime(), settings=settings.policing,
                                         dra_policy=lambda uid: loops.dra_policy(uid))  # fmt: skip
    while not stop.is_set():
        try:
            # The CRI hook's spec and view need the cards before inventory's first pass.
            publisher.snapshot = backend.snapshot()
            break
        except Exception as e:
            logger.warning("discovery's first snapshot failed (%s); retrying in 5 s", e)
            stop.wait(5)
    if stop.is_set():
        return
    snapshot = publisher.snapshot
    logger.info("node %s: %d card(s) from the %s backend: %s", settings.kube.node_name, len(snapshot.cards),
                backend.name, ", ".join(f"{c.index}:{c.uuid} {c.model} {c.memory_mib}MiB" for c in snapshot.cards))
    loops.sources = metrics.Sources(inventory=publisher, usage=sampler, health=tracker, ledger=ledger,
                                    kube=agent_kube)  # fmt: skip
    if publisher.holders is not None:
        publisher.holders.limits = loops.limits  # issue 17: a resize reaches running containers
        publisher.holders.list_containers = loops.list_containers  # issue 23: an exited container holds no card
    loops.publisher = publisher
    store = None
    if settings.dra.dra:
        from elasticgpu.agent import dra  # its protos are compiled only on a node that is a DRA driver

        store = dra.Checkpoint(Path(settings.dra.dra_checkpoint))
        if publisher.holders is not None:
            # status.preparedClaims (issue 48): a card's move back to ElasticGPU waits for the claims kubelet
            # holds prepared on it; set before the publisher's first pass, which must not report "none" on a guess.
            publisher.holders.prepared = lambda: store.entries().values()
            store.on_change(publisher.holders.wake.set)
    started = [
        threading.Thread(target=publisher.run, args=(stop,), name="inventory", daemon=True),
        threading.Thread(target=health.watch_xids, args=(backend, tracker),
                         kwargs={"stop": stop, "on_fatal": publisher.wake.set}, name="health", daemon=True),
        threading.Thread(target=sampler.run, args=(stop,), name="usage", daemon=True),
    ]
    for thread in started:
        thread.start()
    threads.extend(started)
    if store is not None:
        _start_dra(settings, agent_kube, loops, threads, stop, store)


def _start_dra(settings: AgentSettings, agent_kube: kube.AgentKube, loops: _Loops, threads: list[threading.Thread],
               stop: threading.Event, store: dra_checkpoint.Checkpoint) -> None:  # fmt: skip
    """The DRA driver (docs/dra.md): the kubelet plugin's sockets and the ResourceSlice publisher. A plugin that
    cannot listen is retried until it can (kubelet's folder may appear late); the agent's other work goes on."""
    from elasticgpu.agent import dra  # its protos are compiled only on a node that is a DRA driver

    if loops.hook is not None:
        loops.hook.dra_claims = store.claims_of_pod  # containers kubelet prepared through DRA: kept, isolated, recorded
    loops.dra_policy = store.policy_of  # policing of their claims: their DeviceClass's policy, kept at prepare
    preparer = dra.Preparer(node=agent_kube.node_name, read_claim=agent_kube.read_resource_claim,
                                  list_gpus=lambda: agent_kube.list_gpus()[0], store=store,
                                  cdi_dir=Path(settings.cri.cdi_dir))  # fmt: skip
    plugin = dra.KubeletPlugin(preparer, kubelet_dir=Path(settings.dra.dra_kubelet_dir))
    slices = dra.SlicePublisher(agent_kube)
    thread = threading.Thread(target=slices.run, args=(stop,), name="dra-slices", daemon=True)
    thread.start()
    threads.append(thread)
    delay = 1.0
    while not stop.is_set():
        try:
            plugin.start()
            loops.dra = plugin
            return
        except OSError as e:
            logger.warning("the DRA kubelet plugin cannot listen under %s (%s); retrying", plugin.kubelet_dir, e)
            stop.wait(delay)
            delay = min(delay * 2, 30.0)


def main(settings: AgentSettings, *, log_level: str = "info") -> int:
    """Run the agent until SIGTERM or SIGINT; returns the exit code. Raises `AgentError` for what the operator
    fixes in the agent's flags; what the node lacks (NVML, a sound ledger, the API server) never stops it:
    the CRI socket is served first and the rest opened in the background (starting.py)."""
    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    node = settings.kube.node_name
    if not node:
        raise errors.AgentError(
            "the agent needs its node's name: pass --node-name, or set NODE_NAME (a DaemonSet sets it from"
            " spec.nodeName through the downward API)"
        )
    cri_settings = hook_settings(settings.cri) if settings.cri.cri_proxy else None
    if settings.dra.dra and cri_settings is None:
        raise errors.AgentError("--dra true needs the node hook (--cri-proxy true): it writes the cards' CDI spec"
                                " that prepared ResourceClaims name; turn the hook on or --dra off")
    taking_over.check_mode(settings.take_over)
    takeover = taking_over.TakeOver(settings=settings.take_over, node_name=node, host_root=settings.cri.host_root,
                                    events_namespace=settings.inventory.events_namespace)  # fmt: skip
    d = settings.discovery
    parts = starting.Parts(
        backend=starting.Part(f"the device backend ({d.backend})", lambda: discovery.open_backend(
            d.backend, node_name=node, simulation_file=d.simulation, device_dir=d.device_dir,
            inject_dir=d.inject_dir)),
        ledger=starting.Part("the ledger", lambda: LedgerStore.open_or_set_aside(settings.ledger.ledger_url)),
        kube=starting.Part("the API client", lambda: _open_kube(settings, node)),
    )  # fmt: skip
    loops = _Loops()
    if cri_settings is not None:  # without the proxy no claim reaches a container: no mode is offered

        def driver_root() -> str:
            found = parts.backend.driver_root() if parts.backend is not None else None
            return str(found or settings.cri.driver_root)

        loops.rooms = _isolation_rooms(settings, driver_root)
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        stop.set()
        if loops.publisher is not None:
            loops.publisher.wake.set()  # inventory may be waiting for its next pass

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    threads: list[threading.Thread] = []
    nri_state = _Nri()
    hook: supervising.CriHook | None = None
    if cri_settings is not None:
        hook = _cri_hook(settings, cri_settings, parts, loops)
        loops.hook = hook
        loops.limits = hook.limits
        cri_hook = hook
        loops.runtime = lambda: cri_hook.proxy  # issue 25: policing stops containers through the proxy's channel
        loops.list_containers = functools.partial(_containers, hook)
        threads.append(threading.Thread(target=hook.run, args=(stop,), name="cri", daemon=True))
        if settings.cri.node_hook == "nri":
            threads.append(threading.Thread(target=_run_nri, args=(settings, hook, stop, nri_state, takeover),
                                            name="nri", daemon=True))  # fmt: skip
    else:
        logger.info("the CRI proxy is off (--cri-proxy false): inventory only; no claim reaches a container here")
    threads.append(threading.Thread(target=parts.run, args=(stop,), name="parts", daemon=True))
    threads.append(threading.Thread(target=takeover.run, args=(lambda: parts.kube, stop), name="take-over",
                                    daemon=True))  # fmt: skip
    loops.node_conditions = functools.partial(_node_conditions, settings, takeover, hook, nri_state)
    readyz: dict[str, probe_server.Check] = {
        "device-backend": lambda: parts.problem_of("backend"),
        # With NRI the ledger settles with the plugin's synchronize, which waits for the take-over.
        "ledger": lambda: parts.problem_of("ledger") or (
            "not reconciled with the runtime's containers yet" if hook is not None and not (
                settings.cri.node_hook == "nri" and takeover.standing_by) and (
                hook.hooks is None or not hook.hooks.reconciled()) else None),
        "api-server": lambda: _api_problem(parts, settings.cri.api_ready_window_s),
        # Standing by beside another allocator is this agent's job for now: ready (a rollout never waits on it).
        "loops": lambda: None if loops.publisher is not None or takeover.standing_by else (
            "inventory, health and usage are not started yet"),
    }  # fmt: skip
    if hook is not None:
        readyz = {"cri-socket": hook.not_serving, **readyz}
    if hook is not None and settings.cri.node_hook == "nri":
        # kubelet talks to the runtime itself: ready once the runtime calls the agent's plugin.
        readyz = {"nri-plugin": lambda: None if takeover.standing_by else nri_state.not_registered(), **readyz}
    servers: list[probe_server.Endpoints] = []
    manager = service_manager.ServiceManager.from_environment()
    try:
        for thread in list(threads):
            thread.start()  # the CRI hook first: kubelet's socket before anything that can fail
        servers = _serve_http(settings, lambda: loops.sources, {"loops": lambda: _not_alive(threads, hook)}, readyz)
        starter = threading.Thread(target=_start_loops, args=(settings, parts, loops, threads, stop, takeover),
                                   name="starter", daemon=True)  # fmt: skip
        starter.start()
        if manager.enabled:
            watched = hook
            supervisor = threading.Thread(target=manager.run, args=(stop,), kwargs={
                "ready": watched.not_serving if watched is not None else lambda: None,
                "alive": lambda: _not_alive(threads, watched)}, name="systemd", daemon=True)
            supervisor.start()
            threads.append(supervisor)
        stop.wait()
        logger.info("stopping")
        starter.join(timeout=5)
        for thread in list(threads):
            # The CRI hook waits for calls in flight and the ledger writes they queued.
            thread.join(timeout=(cri_settings.grace_s + 10) if thread.name == "cri" and cri_settings else 5)
    finally:
        for server in servers:
            server.shutdown()
        if loops.rooms is not None:
            loops.rooms.close()  # supervision stops; MPS daemons keep serving their containers
        if loops.dra is not None:
            loops.dra.stop()  # prepared claims stay in the checkpoint: the next agent answers for them
        parts.close()
    return 0


def _node_conditions(settings: AgentSettings, takeover: taking_over.TakeOver, hook: supervising.CriHook | None,
                     nri_state: _Nri) -> list[inventory.NodeCondition]:  # fmt: skip
    """The node's conditions on each of its GPUs: another allocator beside us, the toolkit's fail-open setting,
    the node hook in place (`kubectl egpu doctor` and `kubectl egpu handover` read them)."""
    live = takeover.live()
    conflict: inventory.NodeCondition = (
        node_handover.CONDITION_ALLOCATOR_CONFLICT, "True", "OtherAllocatorLive",
        "; ".join(sign.what for sign in live) + ": another GPU allocator is live on this node beside the agent; both"
        " may hand out these cards") if live else (
        node_handover.CONDITION_ALLOCATOR_CONFLICT, "False", "NoOtherAllocator", "no other GPU allocator is live")
    cri = settings.cri
    if not cri.cri_proxy or cri.node_hook != "nri":
        fail_open: inventory.NodeCondition = (
            node_handover.CONDITION_FAIL_OPEN, "False", "NoNri",
            "no NRI hook here: the CRI proxy (or no hook) never lets a container be created past the agent")
    else:
        exposure = node_checks.toolkit_exposure(cri.host_root, settings.take_over.toolkit_configs)
        status, reason = (("True", "ToolkitAcceptsEnvvar") if exposure.exposed else
                          ("False", "ToolkitIgnoresEnvvar") if exposure.exposed is False else
                          ("Unknown", "NoToolkitConfig"))
        fail_open = (node_handover.CONDITION_FAIL_OPEN, status, reason, exposure.message)
    if hook is None:
        problem: str | None = "--cri-proxy false: no claim reaches a container on this node"
    elif cri.node_hook == "nri":
        problem = nri_state.not_registered()
    else:
        problem = hook.not_serving()
    node_hook: inventory.NodeCondition = (
        (node_handover.CONDITION_NODE_HOOK, "False", "NotRegistered", problem) if problem else
        (node_handover.CONDITION_NODE_HOOK, "True", "Registered",
         "the NRI plugin is registered with the runtime" if cri.node_hook == "nri" else "the CRI proxy serves kubelet"))
    return [conflict, fail_open, node_hook]


NRI_RESYNC_S = 60.0
"""How often the NRI front settles the ledger against the runtime's containers as its CRI lists them, and sweeps
what runs without what it should have (nri/serving.py: a lost stop or remove event of NRI)."""


@dataclass
class _Nri:
    """The NRI front while it runs (readiness reads it)."""

    front: nri.NriFront | None = None

    def not_registered(self) -> str | None:
        """Why no claim reaches a container through NRI now (readiness), or None once the plugin is registered
        with the runtime and its synchronize answered."""
        if self.front is None or not self.front.synchronized.is_set():
            return ("the NRI plugin is not registered with the runtime (not started, or the runtime's NRI socket "
                    "does not answer): the runtime creates containers untouched meanwhile")
        return None


def _run_nri(settings: AgentSettings, hook: supervising.CriHook, stop: threading.Event, state: _Nri,
             takeover: taking_over.TakeOver) -> None:  # fmt: skip
    """The NRI front on the CRI hook's core (its GatedHooks: one ledger, one CDI spec, one set of
    isolation rooms), its plugin a supervised child; until `stop`. The hook makes new GatedHooks each time
    its (private) proxy restarts: the front follows them (hooks.FollowingHooks), never keeping closed ones.
    Not registered with the runtime before the agent may take the node's GPUs (taking_over.py): meanwhile the
    runtime creates every container untouched, as the other allocator expects."""
    while not takeover.allowed.wait(0.5):
        if stop.is_set():
            return
    while hook.hooks is None and not stop.wait(0.2):
        pass  # the core's hooks are made with the hook's first round
    if hook.hooks is None:
        return

    def meanwhile(request: injection.ContainerRequest) -> hooks.PreparedCreate:
        if injection.claim_of(request) is not None:
            raise hooks.Refused(
                f"pod {request.pod}, container {request.container!r}: the elasticgpu agent on node "
                f"{hook.view.node_name} is restarting its claim hooks; kubelet retries this container by itself",
                code=grpc.StatusCode.UNAVAILABLE)  # fmt: skip
        return hooks.PreparedCreate(edit=injection.decide(request, hook.view, settings=hook.settings.injection))

    def evict(container: RuntimeContainer, why: str) -> None:
        proxy = hook.proxy
        if proxy is None:
            raise errors.AgentError("the runtime's CRI channel is not open: the container is stopped at the next "
                                    "synchronize")
        proxy.stop_container(container.id, timeout_s=10)

    cri = settings.cri
    following = hooks.FollowingHooks(lambda: hook.hooks, meanwhile=meanwhile)
    front = nri.NriFront(hooks=following, view=hook.view, cdi_dir=Path(cri.cdi_dir), evict=evict,
                         settings=hook.settings.injection)
    server = nri.FrontServer(front, Path(cri.nri_agent_socket)).start()
    binary = shutil.which(cri.nri_plugin) or cri.nri_plugin
    plugin = nri.PluginProcess(nri.PluginSettings(binary=binary, nri_socket=Path(cri.nri_socket),
                                                  agent_socket=Path(cri.nri_agent_socket)),
                               unregistered=front.synchronized.clear)  # fmt: skip
    state.front = front

    def follow() -> None:  # new hooks (the proxy restarted) settle with the front's listing at once
        last = time.monotonic()
        while not stop.wait(0.5):
            following.follow()
            if time.monotonic() - last >= NRI_RESYNC_S:
                # NRI's events are the front's listing: a lost one would keep a row open (issue 44).
                last = time.monotonic()
                try:
                    proxy = hook.proxy
                    front.resync(proxy.list_containers() if proxy is not None else None)
                except Exception as e:
                    logger.warning("the NRI front's resync with the runtime's containers failed (%s); "
                                   "again in %.0f s", e, NRI_RESYNC_S)

    threading.Thread(target=follow, name="nri-follow", daemon=True).start()
    try:
        plugin.run(stop)
    finally:
        state.front = None
        server.close()


def _cri_hook(settings: AgentSettings, cri_settings: supervising.HookSettings, parts: starting.Parts,
              loops: _Loops) -> supervising.CriHook:  # fmt: skip
    """The CRI hook, on parts that may not be open yet (gated.py): it serves at once."""

    def cards() -> Sequence[Card] | None:
        # None until discovery's first snapshot: unknown cards, not "no cards" (issue 23.6).
        return loops.publisher.snapshot.cards if loops.publisher is not None else None

    made: list[claim_view.ClaimView] = []
    lock = threading.Lock()

    def api_view() -> claim_view.ClaimView | None:
        agent_kube = parts.kube
        if agent_kube is None:
            return None
        with lock:
            if not made:
                view = claim_view.ClaimView(
                    kube=agent_kube, node_name=agent_kube.node_name, cards=cards,
                    ttl_s=settings.cri.claim_cache_ttl_s, ready_window_s=settings.cri.api_ready_window_s,
                    namespace_ttl_s=settings.cri.namespace_cache_ttl_s,
                )  # fmt: skip
                view.not_ready = hook.spec_problem  # no claim before the CDI spec names its cards
                made.append(view)
            return made[0]

    def driver_root() -> str:
        found = parts.backend.driver_root() if parts.backend is not None else None
        return str(found or settings.cri.driver_root)

    def driver_version() -> str:
        assert loops.publisher is not None  # asked only once the cards are known (devices_problem)
        return str(loops.publisher.snapshot.driver.driver_version)

    def devices_problem() -> str | None:
        if (problem := parts.problem_of("backend")) is not None:
            return problem
        return None if loops.publisher is not None else "discovery has not run yet"

    def rebuilt() -> None:
        parts.set_aside = None

    locator = driver.DriverLocator(driver_root=driver_root, host_root=settings.cri.host_root,
                                   nvidia_ctk=settings.cri.nvidia_ctk)  # fmt: skip
    view = gated.GatedView(node_name=settings.kube.node_name or "", view=api_view, not_ready=parts.not_ready)
    hook = supervising.CriHook(
        settings=cri_settings, view=view, ledger=lambda: parts.ledger, cards=cards,
        control_paths=lambda: parts.backend.control_device_paths() if parts.backend is not None else (),
        nic_nodes=lambda nic: parts.backend.rdma_device_nodes(nic) if parts.backend is not None else (),
        driver_files=lambda: locator.files(driver_version()), devices_problem=devices_problem,
        owed_rebuild=lambda: parts.set_aside is not None, rebuilt=rebuilt, rooms=loops.rooms,
        wrap=mig.MigRoom(backend=lambda: parts.backend, cards=cards, cdi_dir=cri_settings.cdi_dir).wrap,
    )  # fmt: skip
    return hook
