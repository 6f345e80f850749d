"""Settings of the agent: one small dataclass per concern, combined in `AgentSettings`.

Every field has a typed default, its unit and why it has that value. Each field is also a flag
of `elasticgpu agent run` (`--heartbeat-interval-s`) and an environment variable
(`ELASTICGPU_AGENT_HEARTBEAT_INTERVAL_S`); a flag beats the environment, which beats the default.
They are built once, by `from_sources`, and passed down; nothing else reads the environment.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import inspect
import itertools
import os
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elasticgpu import flags

DEFAULT_LEDGER_URL = "sqlite:////var/lib/elasticgpu/ledger.db"

SIMULATED_STATE = {
    "ledger_url": "ledger.db",
    "device_dir": "devices",
    "cdi_dir": "cdi",
    "cri_front_dir": "front",
    "limits_dir": "limits",
    "isolation_dir": "isolation",
    "cri_listen": "cri.sock",
    "device_plugin_dir": "device-plugins",  # a simulated node has no kubelet of its own: no device plugins
    "dra_checkpoint": "dra-checkpoint.json",
}
"""The state paths that `--backend simulated` puts under `simulated_state_dir` when they are not given: the
node's defaults (/var/lib, /var/run/cdi) need root and would touch a real node's runtime. The names under it."""


@dataclass(frozen=True, kw_only=True)
class DiscoverySettings:
    """Where the cards come from."""

    backend: str = "nvml"
    """`nvml` (the NVIDIA driver) or `simulated` (cards described in a YAML file)."""
    simulation: str | None = None
    """YAML file of the simulated backend (cards, links, a timeline of processes and XIDs)."""
    device_dir: str = "/run/elasticgpu/devices"
    """Folder of the simulated backend's stand-in device nodes (`nvidia<minor>`), named in the CDI spec."""
    inject_dir: str | None = None
    """Folder the simulated backend takes injected entries from (JSON/YAML files); None: none."""


@dataclass(frozen=True, kw_only=True)
class LedgerSettings:
    """The ledger database."""

    ledger_url: str = DEFAULT_LEDGER_URL
    """SQLAlchemy URL; an SQLite file on the node's disk by default (survives agent restarts)."""
    usage_retention_s: float = 3600.0
    """Seconds usage samples are kept: enough to look back at an OverLimit, small enough to stay a few MiB."""
    released_retention_s: float = 7 * 86400.0
    """Seconds released allocations are kept for the record before they are pruned."""


@dataclass(frozen=True, kw_only=True)
class KubeSettings:
    """How the agent talks to the API server."""

    kubeconfig: str | None = None
    """kubeconfig file; None: in-cluster service account, then $KUBECONFIG or ~/.kube/config."""
    context: str | None = None
    """kubeconfig context; None: the current one."""
    node_name: str = ""
    """This node's name (the DaemonSet passes spec.nodeName); required. Falls back to $NODE_NAME."""
    field_manager: str = "elasticgpu-agent"
    """Field manager of every write, so managedFields show what the agent owns."""
    request_timeout_s: float = 10.0
    """Seconds one API call may take before it counts as failed and is retried with backoff."""
    watch_timeout_s: int = 60
    """Seconds a watch of the node's GPU objects stays open before it is reopened."""


@dataclass(frozen=True, kw_only=True)
class InventorySettings:
    """How the node's GPU objects and labels are kept true."""

    heartbeat_interval_s: float = 30.0
    """Seconds between heartbeats of a GPU object (its `Heartbeat` condition). The controller should treat
    a heartbeat older than about 4 intervals (120 s) as an agent that is gone. One write per card per interval."""
    rediscover_interval_s: float = 10.0
    """Seconds between discoveries of the cards (a vanished or new card is seen within this)."""
    events_namespace: str = "default"
    """Namespace of the Events about GPU objects (cluster scoped; as the controller does for them)."""
    node_labels_check_s: float = 300.0
    """Seconds between reads of the Node to put back labels someone else removed (one GET; the labels are
    otherwise written only when the cards change)."""


@dataclass(frozen=True, kw_only=True)
class HealthSettings:
    """How XID errors change a card's health."""

    recovery_quiet_s: float = 300.0
    """Seconds without another transient XID (94, contained ECC) after which the card is Healthy again. Only
    transient XIDs heal this way: one that needs a reset (48, 79, 95, 119, ...) keeps the card Unhealthy until
    the reset is seen, however long it is quiet (see `elasticgpu.api.xids`)."""


@dataclass(frozen=True, kw_only=True)
class UsageSettings:
    """How measured usage is sampled and written."""

    sample_interval_s: float = 5.0
    """Seconds between usage samples (NVML's process list; cheap)."""
    usage_write_interval_s: float = 30.0
    """Least seconds between two usage writes of one claim or card in steady state."""
    usage_verify_s: float = 300.0
    """Seconds between reads of a claim whose usage did not change, to write it again if another writer
    replaced the claim's status meanwhile (one GET per claim per interval; cheaper than a write)."""
    usage_change_mib: int = 1024
    """A change of a claim's or card's memory use by at least this many MiB is written at once."""
    proc_root: str = "/proc"
    """Where the host's processes are (the agent's container mounts the host's /proc here)."""


@dataclass(frozen=True, kw_only=True)
class PolicingSettings:
    """What the agent does with a claim over its memory, beyond its class's policy (docs/policing.md)."""

    over_limit_stops: bool = True
    """false: this node's agent never stops a container, whatever its claim's class says (every class acts as
    overLimitAction: Warn here; an operator's brake while a new driver or workload is being looked at)."""
    over_limit_stop_timeout_s: int = 10
    """Seconds the runtime gives a container it stops for its claim's memory between the stop signal and the kill
    (kubelet's own stops use the pod's terminationGracePeriodSeconds; the card's other claims wait meanwhile)."""


@dataclass(frozen=True, kw_only=True)
class MetricsSettings:
    """The Prometheus endpoint."""

    metrics_bind_address: str = ""
    """[host]:port of /metrics as controller-runtime writes it (:9410, 127.0.0.1:9410, [::1]:9410; 0: none).
    Not given: --metrics-address and --metrics-port, the older spelling, decide (:9410)."""
    health_probe_bind_address: str = ""
    """[host]:port of /healthz and /readyz (0: none). Not given: the /metrics server serves them too."""
    metrics_address: str = "0.0.0.0"
    """Deprecated, use --metrics-bind-address: the address of /metrics."""
    metrics_port: int = 9410
    """Deprecated, use --metrics-bind-address: the port of /metrics (DCGM exporter uses 9400); 0: none."""

    def endpoints(self) -> tuple[flags.BindAddress | None, flags.BindAddress | None]:
        """(where /metrics listens, where /healthz and /readyz listen), None for none; the probes on the
        metrics server when their flag is not given. Raises ValueError for an address that does not parse."""
        metrics = flags.BindAddress(host=self.metrics_address, port=self.metrics_port) if self.metrics_port else None
        if self.metrics_bind_address:
            metrics = _bind_address("metrics_bind_address", self.metrics_bind_address)
        probes = _bind_address("health_probe_bind_address", self.health_probe_bind_address) if (
            self.health_probe_bind_address) else metrics  # fmt: skip
        return metrics, probes


def _bind_address(name: str, text: str) -> flags.BindAddress | None:
    try:
        return flags.bind_address(text)
    except (argparse.ArgumentTypeError, ValueError) as e:
        raise ValueError(f"{_env(name)} / {_flag(name)}={text!r}: {e}") from None


@dataclass(frozen=True, kw_only=True)
class CriSettings:
    """The CRI hook: the proxy kubelet uses as its runtime endpoint, and the CDI spec of the cards."""

    cri_proxy: bool = True
    """Run the node hook (false: inventory only; no claim reaches a container on this node)."""
    node_hook: str = "cri-proxy"
    """How claims reach containers: `cri-proxy` (kubelet's --container-runtime-endpoint points at cri_listen) or
    `nri` (the runtime's NRI calls the agent's plugin at each CreateContainer; containerd 2.0+ and CRI-O 1.30+ have
    it on, containerd 1.7 in its config; kubelet is left as it is)."""
    nri_socket: str = "/var/run/nri/nri.sock"
    """The runtime's NRI socket the agent's plugin connects to (node_hook nri)."""
    nri_plugin: str = "elasticgpu-nri-plugin"
    """The NRI plugin's executable (nri-plugin/; a path, or a name looked up in PATH), run as the agent's child."""
    nri_agent_socket: str = "/var/run/elasticgpu/nri-agent.sock"
    """The agent's socket its NRI plugin asks (mode 0600)."""
    cri_listen: str = "/var/run/elasticgpu/cri.sock"
    """The proxy's unix socket (mode 0600): kubelet's --container-runtime-endpoint is unix://<this>."""
    cri_upstream: str = "/run/containerd/containerd.sock"
    """The runtime's own CRI socket the proxy forwards to (CRI-O: /var/run/crio/crio.sock)."""
    cri_front: str = "auto"
    """`nginx`: nginx serves cri_listen and sends only CreateContainer, RemoveContainer and RemovePodSandbox
    through the agent's proxy, every other call straight to the runtime (about 0.2 ms added at p50 instead of 0.6);
    `none`: the proxy serves cri_listen itself; `auto`: nginx when cri_nginx is found, else none."""
    cri_nginx: str = "nginx"
    """The nginx binary of the front (a path, or a name looked up in PATH); 1.22+ with HTTP/2 and gRPC (Debian's)."""
    cri_front_dir: str = "/var/run/elasticgpu/front"
    """Folder of the front's nginx config, pid file and temp folders, and of the proxy's socket behind it."""
    cdi_dir: str = "/var/run/cdi"
    """Folder the runtime reads CDI specs from (containerd 1.7 and CRI-O read /etc/cdi and /var/run/cdi;
    a spec generated at run time belongs in /var/run/cdi)."""
    limits_dir: str = "/var/run/elasticgpu/limits"
    """Folder of the claims' limits files (one folder per claim, mounted read-only at /run/elasticgpu into its
    containers): a resize reaches running containers through them (docs/resize-node.md); empty: none."""
    cdi_form: str = "field"
    """How a container asks the runtime for its CDI devices: `field` (CRI's CDIDevices: containerd >= 1.7.2,
    CRI-O >= 1.28), `annotation` (cdi.k8s.io/..., older runtimes) or `both`."""
    neutralise_unclaimed: bool = True
    """A container without a claim gets NVIDIA_VISIBLE_DEVICES=void (a CUDA image's `all` would otherwise hand
    it every card through the NVIDIA hook). Off only where another device plugin hands out GPUs that way."""
    driver_root: str = "/"
    """Where the NVIDIA driver is installed on the node (`/run/nvidia/driver` with the GPU Operator's driver
    container): its libraries, binaries and firmware of NVML's driver version are mounted read-only into claimed
    containers through the CDI spec. The simulated backend uses its own stand-in instead."""
    host_root: str = "/"
    """Where the agent sees the node's `/` (e.g. `/host` when its DaemonSet mounts the node's root there); the
    spec still names node paths, which the runtime opens."""
    nvidia_ctk: str = "/usr/bin/nvidia-ctk"
    """nvidia-ctk on the node: when present, the spec runs its `update-ldcache` hook (images whose loader does not
    search the library folder by default find the driver too); empty: never."""
    refuse_privileged: bool = False
    """Refuse a privileged container whose pod uses no claim, on a node with cards (an admin's opt-in; its pod gets a
    Warning Event saying what to do). Off by default: a privileged container is root on its node and no hook confines
    it (Pod Security Admission decides who may run one), while a refusal breaks the node's own DaemonSets (CNI, CSI,
    the GPU Operator's) outside the exempt namespaces. Its GPU use is reported as unattributed processes either way.
    When on, namespaces labelled elasticgpu.io/node-gpu-access=true, privileged_namespaces and privileged_pods pass.
    A privileged container WITH a claim is refused whatever this says, unless the claim's class allows it
    (allowPrivileged)."""
    privileged_namespaces: str = "kube-system"
    """Comma-separated namespaces whose privileged containers pass without a claim (kube-proxy and CNI agents run
    privileged in kube-system, where only cluster admins create pods)."""
    privileged_pods: str = ""
    """Comma-separated `<namespace>/<label>=<value>`: privileged containers without a claim pass in pods of that
    namespace carrying that label. The chart sets `<its namespace>/app.kubernetes.io/component=agent-installer`
    (its installer DaemonSet, re-created through this agent at every upgrade). The namespace is the boundary (who
    may create pods there); the label only narrows within it, since whoever creates a pod writes its labels."""
    namespace_cache_ttl_s: float = 30.0
    """Seconds a namespace's elasticgpu.io/node-gpu-access label, read for a container without a claim, is reused
    (one GET per namespace per interval; a label change takes effect within it)."""
    claim_cache_ttl_s: float = 5.0
    """Seconds a claim read from the API server for a CreateContainer is reused (the containers of one pod
    start together: one GET each for the claim and its ElasticGPU, not one per container)."""
    api_ready_window_s: float = 60.0
    """The agent's view of the API server is ready while the API server answered the agent within this many
    seconds; after a longer outage a claim's container is refused as retryable (others still start)."""
    cdi_check_interval_s: float = 30.0
    """Seconds between checks that the CDI spec file is still what the agent wrote (a change of the cards is
    written within the rediscover interval)."""


@dataclass(frozen=True, kw_only=True)
class IsolationSettings:
    """What enforces a slice's size in its containers, per class (docs/isolation.md)."""

    isolation_dir: str = "/var/run/elasticgpu/isolation"
    """Folder of the isolation modes' state on the node: MPS pipe and log folders per card (mps/<uuid>/), HAMi-core's
    preload file and per-container caches (hami-core/). The runtime mounts from it: a node path, as limits_dir."""
    mps: bool = True
    """Offer MPS where the driver's nvidia-cuda-mps-control is found under the driver root (false: never)."""
    hami_core_library: str = ""
    """Node path of HAMi-core's libvgpu.so, installed by the node's admin (elasticgpu never ships or fetches it);
    offered as HAMiCore while the file exists; empty: not offered."""
    mps_stop_timeout_s: float = 10.0
    """Seconds an MPS control daemon has to quit (`quit`) once no MPS claim uses its card, before it is killed."""
    mps_check_interval_s: float = 2.0
    """Seconds between checks that each MPS control daemon in use still runs (one that died is restarted, with
    a backoff doubling from 1 s to 60 s)."""
    mps_shm_size_mib: int = 64
    """MiB of the tmpfs each card's MPS daemon and its MPS containers share as /dev/shm (mounted by the agent at
    <isolation_dir>/mps/<uuid>/shm; NVIDIA's device plugin mounts 64 MiB for its daemons)."""
    mps_daemons_socket: str = ""
    """Unix socket of the node's MPS daemon service (`elasticgpu agent mps-daemons`: the chart's DaemonSet
    elasticgpu-mps), which runs the MPS control daemons outside the agent's cgroup so that they and their clients
    outlive an agent restart; empty: the agent runs them itself, and they end with it (docs/isolation.md)."""
    isolation_idle_grace_s: float = 30.0
    """Seconds a card's MPS daemon and a container's HAMi-core cache are kept after a container was prepared,
    while the runtime does not list the container yet."""


@dataclass(frozen=True, kw_only=True)
class TakeOverSettings:
    """When the agent takes its node's GPUs: not while another GPU allocator is live there (docs/admin-guide.md,
    "Moving a GPU Operator cluster")."""

    other_allocators: str = "wait"
    """`wait`: while a GPU device plugin is registered with kubelet on this node (its socket answers in
    `device_plugin_dir`) or the Node offers `nvidia.com/gpu` (or HAMi's resources) in its allocatable, the agent
    stands by: no NRI plugin, no GPU objects, no labels; it says which allocator in one line and an Event on
    the Node, and takes over once it is gone. `ignore`: take over at once, beside it (a migration you manage:
    both would hand out the same cards)."""
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    """kubelet's device-plugin folder on the node (seen under `host_root`)."""
    allocator_check_interval_s: float = 15.0
    """Seconds between checks for another allocator (kubelet drops a gone plugin's allocatable within ~10 s)."""
    toolkit_configs: str = ("/etc/nvidia-container-runtime/config.toml,"
                            "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml")
    """The NVIDIA container toolkit's config files on the node (plain install, the GPU Operator's toolkit),
    comma-separated, seen under `host_root`: the first that exists says whether the node is exposed to the
    fail-open window (`accept-nvidia-visible-devices-envvar-when-unprivileged`)."""


@dataclass(frozen=True, kw_only=True)
class DraSettings:
    """The DRA driver `gpu.elasticgpu.io` (docs/dra.md): the cards a platform team hands to DRA."""

    dra: bool = False
    """true: publish this node's DRA cards in a ResourceSlice and serve kubelet's DRA plugin API (needs
    Kubernetes 1.34+); false: the agent is no DRA driver and DRA cards of this node are offered to nobody."""
    dra_kubelet_dir: str = "/var/lib/kubelet"
    """kubelet's root folder: the registration socket goes under `plugins_registry/`, the service under `plugins/`."""
    dra_checkpoint: str = "/var/lib/elasticgpu/dra-checkpoint.json"
    """The file that says which ResourceClaims this node prepared (survives agent restarts; keep it on the node)."""


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """Every setting of the agent, one dataclass per concern."""

    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    inventory: InventorySettings = field(default_factory=InventorySettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    usage: UsageSettings = field(default_factory=UsageSettings)
    policing: PolicingSettings = field(default_factory=PolicingSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    cri: CriSettings = field(default_factory=CriSettings)
    isolation: IsolationSettings = field(default_factory=IsolationSettings)
    take_over: TakeOverSettings = field(default_factory=TakeOverSettings)
    dra: DraSettings = field(default_factory=DraSettings)


_CONCERNS: dict[str, type[Any]] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in dataclasses.fields(AgentSettings)
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _env(name: str) -> str:
    return "ELASTICGPU_AGENT_" + name.upper()


def _convert(value: str, default: Any, name: str) -> Any:
    try:
        if isinstance(default, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        kind = ("true or false" if isinstance(default, bool) else "an integer" if isinstance(default, int)
                else "a number")
        raise ValueError(f"{_env(name)} / {_flag(name)}={value!r}: must be {kind}") from None
    return value


def field_docs(cls: type[Any]) -> dict[str, str]:
    """The docstring under each field of a settings dataclass (read from its source), for --help."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for statement, following in itertools.pairwise(body):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def add_arguments(parser: argparse.ArgumentParser, *, concerns: tuple[str, ...] | None = None) -> None:
    """One flag per setting (of the given concerns, default all), each defaulting to "not given"."""
    for concern, cls in _CONCERNS.items():
        if concerns is not None and concern not in concerns:
            continue
        group = parser.add_argument_group(f"{concern} settings")
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            default = f.default
            text = docs.get(f.name, "").replace("%", "%%")  # argparse formats help with %
            group.add_argument(
                _flag(f.name), dest=f.name, default=None, metavar=f.name.split("_")[-1].upper(),
                help=f"{text} [env {_env(f.name)}; default {default!r}]",
            )


def from_sources(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None) -> AgentSettings:
    """Settings from flags (when given), else the environment, else the defaults."""
    env = os.environ if environ is None else environ
    parts: dict[str, Any] = {}
    for concern, cls in _CONCERNS.items():
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            given = getattr(args, f.name, None) if args is not None else None
            raw = given if given is not None else env.get(_env(f.name))
            if raw is not None:
                values[f.name] = _convert(str(raw), f.default, f.name)
        parts[concern] = cls(**values)
    if parts["discovery"].backend == "simulated":

        def given(name: str) -> bool:
            return (args is not None and getattr(args, name, None) is not None) or _env(name) in env

        parts = _simulated_defaults(parts, env, given=given)
    settings = AgentSettings(**parts)
    if not settings.kube.node_name and env.get("NODE_NAME"):
        settings = dataclasses.replace(settings, kube=dataclasses.replace(settings.kube, node_name=env["NODE_NAME"]))
    return settings


def simulated_state_dir(environ: Mapping[str, str], node: str = "") -> str:
    """The folder of a simulated agent's state: `$TMPDIR/elasticgpu-sim-<uid>/<node>` (`/tmp` without
    TMPDIR). Per user, so two users' agents never share a ledger or a socket; per node, so two
    simulated nodes on one machine never do either (issue 36: the second agent silently took the
    first's CRI socket, ledger and CDI file); no root needed. A node name longer than 40 characters
    is shortened with a hash of it: the CRI sockets under it must stay within a unix socket path's 107 bytes."""
    base = os.path.join(environ.get("TMPDIR") or "/tmp", f"elasticgpu-sim-{os.getuid()}")
    name = node or "no-node-name"
    if len(name) > 40:
        name = f"{name[:31]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return os.path.join(base, name)


def _simulated_defaults(parts: dict[str, Any], env: Mapping[str, str], *,
                        given: Callable[[str], bool]) -> dict[str, Any]:  # fmt: skip
    # Only the paths nobody gave: an explicit flag or variable always wins.
    kube = parts.get("kube")
    home = simulated_state_dir(env, getattr(kube, "node_name", "") or env.get("NODE_NAME", ""))
    out = dict(parts)
    for concern, current in parts.items():
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(current):
            if f.name in SIMULATED_STATE and not given(f.name):
                path = os.path.join(home, SIMULATED_STATE[f.name])
                changes[f.name] = f"sqlite:///{path}" if f.name == "ledger_url" else path
        if changes:
            out[concern] = dataclasses.replace(current, **changes)
    return out
