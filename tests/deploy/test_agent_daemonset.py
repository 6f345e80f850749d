"""The agent as an ordinary DaemonSet pod (agent.nodeHook=nri, issue 34 item 2): what the chart renders
for it (the node hook switch, the pod's identity, mounts, privileges, environment, probes, the metrics
Service), each against what the agent reads and writes, and the pod's start script (the ConfigMap of
deploy/agent-daemonset.yaml) run against a scratch node.

Every hostPath, privilege and host namespace of the pod is listed here with the reason it is there; a new
one fails these tests until it is added with its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from elasticgpu.agent import settings as agent_settings
from elasticgpu.cli import build_parser
from tests.deploy.test_chart import CRI_PROXY, _containers, _objects, _one, _render

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "elasticgpu-system"

MOUNTS = {
    # container path: (node path, read-only, propagation), and why.
    # The runtime's NRI socket, its folder (a new socket at each start of the runtime).
    "/var/run/nri": ("/var/run/nri", False, None),
    "/var/lib/elasticgpu": ("/var/lib/elasticgpu", False, None),  # the ledger, outliving the pod
    # Limits files and isolation state, mounted by the runtime by node path; the MPS shm tmpfs must reach the node.
    "/var/run/elasticgpu": ("/var/run/elasticgpu", False, "Bidirectional"),
    "/var/run/cdi": ("/var/run/cdi", False, None),  # the CDI spec the runtime reads
    "/dev": ("/dev", False, None),  # NVML's /dev/nvidia*, MIG capability nodes made after the start
    # the driver's files under the driver root, the proxy mode's unit file; the driver container's mount later
    "/host": ("/", True, "HostToContainer"),
}
PENDING_SETTINGS = {"ELASTICGPU_AGENT_NODE_HOOK", "ELASTICGPU_AGENT_NRI_SOCKET"}
"""The NRI front's settings (`--node-hook`, `--nri-socket`), which issue 34 item 1 adds to the agent."""


def _daemonset(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return _one(_objects(values), "DaemonSet", "elasticgpu-agent")


def _agent_container(daemonset: dict[str, Any]) -> dict[str, Any]:
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _known_settings() -> set[str]:
    return {
        "ELASTICGPU_AGENT_" + f.name.upper()
        for concern in dataclasses.fields(agent_settings.AgentSettings)
        for f in dataclasses.fields(concern.default_factory())  # type: ignore[misc]
    }


def test_nri_is_the_default_and_the_proxy_the_other_mode() -> None:
    default = {(d["kind"], d["metadata"]["name"]) for d in _objects()}
    assert ("DaemonSet", "elasticgpu-agent") in default
    assert ("DaemonSet", "elasticgpu-agent-installer") not in default
    proxy = {(d["kind"], d["metadata"]["name"]) for d in _objects(CRI_PROXY)}
    assert ("DaemonSet", "elasticgpu-agent-installer") in proxy
    assert ("DaemonSet", "elasticgpu-agent") not in proxy
    # Both modes share the identity, its RBAC and the policies that scope it.
    for objects in (default, proxy):
        assert {("ServiceAccount", "elasticgpu-agent"), ("ClusterRoleBinding", "elasticgpu-agent")} <= objects
    with pytest.raises(helm_python.HelmError, match=re.escape('agent.nodeHook is "proxy": use nri')):
        _render({"agent": {"nodeHook": "proxy"}})


def test_the_pod_is_the_agent_identity_on_gpu_nodes_with_nothing_per_node() -> None:
    daemonset = _daemonset()
    pod = daemonset["spec"]["template"]["spec"]
    # Its identity is the ServiceAccount the policies judge, through the token kubelet mounts (bound to
    # the pod, naming its node): no kubeconfig, no Secret.
    assert pod["serviceAccountName"] == "elasticgpu-agent" and pod["automountServiceAccountToken"] is True
    assert not [v for v in pod["volumes"] if "secret" in v]
    assert pod["nodeSelector"] == {"elasticgpu.io/agent": "true"}  # nodes opt in (issue 46)
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["priorityClassName"] == "system-node-critical"
    # Host namespaces: the pid one only (NVML reports node pids, mapped to containers through /proc).
    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    # No surge: two agents on a node would share its ledger and both register with its runtime.
    assert daemonset["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                                   "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}  # fmt: skip
    labels = pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # Values: another pool, no priority class.
    pod = _daemonset({"agent": {"daemonset": {"nodeSelector": {"pool": "gpu", "elasticgpu.io/agent": None},
                                              "priorityClassName": ""}}})["spec"]["template"]["spec"]  # fmt: skip
    assert pod["nodeSelector"] == {"pool": "gpu"} and "priorityClassName" not in pod
    assert pod_labels["app.kubernetes.io/component"] == "agent"


def test_each_mount_and_privilege_is_one_the_agent_needs() -> None:
    daemonset = _daemonset()
    pod = daemonset["spec"]["template"]["spec"]
    container = _agent_container(daemonset)
    volumes = {v["name"]: v for v in pod["volumes"]}
    host_mounts = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            host_mounts[mount["mountPath"]] = (volume["hostPath"]["path"], mount.get("readOnly", False),
                                               mount.get("mountPropagation"))  # fmt: skip
        else:
            # The pod's own: the NVML link folder, /tmp, the start script.
            assert set(volume) & {"emptyDir", "configMap"}, volume
    assert host_mounts == MOUNTS
    # The folders are the agent's own defaults, at their node paths (the runtime opens them by that path).
    defaults = agent_settings.AgentSettings()
    assert Path(defaults.ledger.ledger_url.removeprefix("sqlite:///")).parent == Path("/var/lib/elasticgpu")
    assert defaults.cri.cdi_dir in MOUNTS
    for folder in (defaults.cri.limits_dir, defaults.isolation.isolation_dir):
        assert Path(folder).parent == Path("/var/run/elasticgpu")
    # Each node path is named, with its reason, in the header of the plain manifest.
    header = "".join(line for line in (REPO / "deploy" / "agent-daemonset.yaml").read_text().splitlines(True)
                     if line.startswith("#"))  # fmt: skip
    for path in ("/var/run/nri", "/var/lib/elasticgpu", "/var/run/elasticgpu", "/var/run/cdi", "/dev", "/host",
                 "privileged", "hostPID", "Root"):  # fmt: skip
        assert path in header, path
    # Privileged (the device cgroup of /dev/nvidia*, Bidirectional propagation) as root, on a read-only root.
    assert container["securityContext"] == {"privileged": True, "runAsUser": 0, "runAsNonRoot": False,
                                            "readOnlyRootFilesystem": True}  # fmt: skip
    # The NRI socket's folder follows agent.nriSocket.
    moved = _agent_container(_daemonset({"agent": {"nriSocket": "/run/crio/nri/nri.sock"}}))
    assert {m["mountPath"] for m in moved["volumeMounts"]} >= {"/run/crio/nri"}
    assert _env(moved)["ELASTICGPU_AGENT_NRI_SOCKET"] == "/run/crio/nri/nri.sock"


def test_moved_host_paths_are_mounted_at_their_node_paths_and_given_to_the_agent() -> None:
    paths = {"ledger": "/data/egpu", "state": "/run/egpu/", "cdi": "/etc/cdi"}
    daemonset = _daemonset({"agent": {"daemonset": {"hostPaths": paths}}})
    pod = daemonset["spec"]["template"]["spec"]
    container = _agent_container(daemonset)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted = {m["mountPath"].rstrip("/"): volumes[m["name"]]["hostPath"]["path"].rstrip("/")
               for m in container["volumeMounts"] if "hostPath" in volumes[m["name"]]}  # fmt: skip
    for folder in paths.values():
        assert mounted[folder.rstrip("/")] == folder.rstrip("/"), mounted
    assert not {"/var/lib/elasticgpu", "/var/run/elasticgpu", "/var/run/cdi"} & set(mounted), mounted
    settings = agent_settings.from_sources(None, {k: v for k, v in _env(container).items() if isinstance(v, str)})
    assert settings.ledger.ledger_url == "sqlite:////data/egpu/ledger.db"
    assert settings.cri.cdi_dir == "/etc/cdi"
    assert settings.cri.limits_dir == "/run/egpu/limits"
    assert settings.isolation.isolation_dir == "/run/egpu/isolation"
    assert settings.cri.nri_agent_socket == "/run/egpu/nri-agent.sock"
    # The defaults are the agent's own.
    defaults = agent_settings.AgentSettings()
    env = _env(_agent_container(_daemonset()))
    assert env["ELASTICGPU_AGENT_LEDGER_URL"] == defaults.ledger.ledger_url
    assert (env["ELASTICGPU_AGENT_CDI_DIR"], env["ELASTICGPU_AGENT_LIMITS_DIR"]) == (defaults.cri.cdi_dir,
                                                                                 defaults.cri.limits_dir)  # fmt: skip
    assert env["ELASTICGPU_AGENT_ISOLATION_DIR"] == defaults.isolation.isolation_dir
    assert env["ELASTICGPU_AGENT_NRI_AGENT_SOCKET"] == defaults.cri.nri_agent_socket
    with pytest.raises(helm_python.HelmError, match=re.escape("agent.env.ELASTICGPU_AGENT_CDI_DIR: the chart")):
        _render({"agent": {"env": {"ELASTICGPU_AGENT_CDI_DIR": "/x"}}})


def test_the_environment_is_the_agents_settings_and_the_node_comes_from_the_downward_api() -> None:
    values = {"agent": {"env": {"ELASTICGPU_AGENT_REFUSE_PRIVILEGED": "true"},
                        "daemonset": {"driverRoot": "/run/nvidia/driver"}}}
    container = _agent_container(_daemonset(values))
    env = _env(container)
    assert env["ELASTICGPU_AGENT_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["ELASTICGPU_AGENT_NODE_HOOK"] == "nri"
    assert env["ELASTICGPU_AGENT_NRI_SOCKET"] == "/var/run/nri/nri.sock"
    assert env["ELASTICGPU_AGENT_HOST_ROOT"] == "/host" and "/host" in MOUNTS
    assert env["ELASTICGPU_AGENT_DRIVER_ROOT"] == "/run/nvidia/driver"
    assert env["ELASTICGPU_AGENT_REFUSE_PRIVILEGED"] == "true"
    # The agent's own pods pass its privileged rule (a user's entries are kept beside).
    assert env["ELASTICGPU_AGENT_PRIVILEGED_PODS"] == (f"{NAMESPACE}/app.kubernetes.io/component=agent,"
                                                       f"{NAMESPACE}/app.kubernetes.io/component=mps")
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), names
    assert set(names) - _known_settings() <= PENDING_SETTINGS, set(names) - _known_settings()
    # The settings parse as the agent parses them.
    settings = agent_settings.from_sources(None, {k: v for k, v in env.items() if isinstance(v, str)})
    assert settings.cri.host_root == "/host" and settings.cri.refuse_privileged is True
    # A setting the chart owns cannot be given twice.
    with pytest.raises(helm_python.HelmError, match=re.escape("agent.env.ELASTICGPU_AGENT_NRI_SOCKET: the chart")):
        _render({"agent": {"env": {"ELASTICGPU_AGENT_NRI_SOCKET": "/x.sock"}}})


def test_the_mps_daemons_run_in_a_daemonset_of_their_own_that_the_agent_reaches() -> None:
    """Issue 44: the MPS control daemons live in elasticgpu-mps's cgroup, not the agent's, so an agent rollout
    leaves them alone; the agent asks them over the socket both pods name, in the isolation folder both mount."""
    values = {"agent": {"env": {"ELASTICGPU_AGENT_MPS_SHM_SIZE_MIB": "128"},
                        "daemonset": {"hostPaths": {"state": "/run/egpu"}, "driverRoot": "/run/nvidia/driver"}}}
    objects = _objects(values)
    agent = _env(_agent_container(_one(objects, "DaemonSet", "elasticgpu-agent")))
    mps_set = _one(objects, "DaemonSet", "elasticgpu-mps")
    pod = mps_set["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["elasticgpu", "agent", "mps-daemons"]
    assert build_parser().parse_args(["agent", "mps-daemons"]).handler is not None
    mine = agent_settings.from_sources(None, {k: v for k, v in _env(container).items() if isinstance(v, str)})
    theirs = agent_settings.from_sources(None, {k: v for k, v in agent.items() if isinstance(v, str)})
    assert mine.isolation.mps_daemons_socket == theirs.isolation.mps_daemons_socket \
        == "/run/egpu/isolation/mps-daemons.sock"
    assert mine.isolation.isolation_dir == theirs.isolation.isolation_dir == "/run/egpu/isolation"
    assert mine.isolation.mps_shm_size_mib == 128 and mine.cri.driver_root == "/run/nvidia/driver"
    assert mine.cri.host_root == "/host"
    # Its mounts reach the node where the runtime mounts the card folders from; no token, and no rolling update.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/run/egpu"]["mountPropagation"] == "Bidirectional"
    assert pod["automountServiceAccountToken"] is False and pod["hostPID"] is True
    # RollingUpdate: with OnDelete, Helm 4's `upgrade --wait` (kstatus) waits for pods nobody deletes.
    assert mps_set["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    assert pod["nodeSelector"] == _one(objects, "DaemonSet", "elasticgpu-agent")["spec"]["template"]["spec"][
        "nodeSelector"]
    # Off: the agent runs the daemons itself again (they end with it).
    off = _objects({"agent": {"mps": {"enabled": False}}})
    assert not [o for o in off if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "elasticgpu-mps"]
    assert "ELASTICGPU_AGENT_MPS_DAEMONS_SOCKET" not in _env(_agent_container(_one(off, "DaemonSet",
                                                                                   "elasticgpu-agent")))


def test_probes_and_metrics_are_on_the_port_the_agent_serves() -> None:
    daemonset = _daemonset({"agent": {"metricsPort": 9555}})
    container = _agent_container(daemonset)
    env = _env(container)
    metrics, probes = agent_settings.MetricsSettings(
        metrics_bind_address=env["ELASTICGPU_AGENT_METRICS_BIND_ADDRESS"]).endpoints()  # fmt: skip
    assert metrics is not None and probes is not None and metrics.port == probes.port == 9555
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http-metrics": 9555}
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "http-metrics"}, probe
    # The script ends in the agent's own command line.
    assert container["command"] == ["/bin/sh", "/elasticgpu-agent-pod/agent-pod.sh"]
    assert build_parser().parse_args(["agent", "run"]).command == "agent"


@pytest.mark.parametrize("values", [{}, CRI_PROXY], ids=["nri", "cri-proxy"])
def test_the_metrics_service_selects_the_pods_the_agent_serves_from(values: dict[str, Any]) -> None:
    objects = _objects(values)
    service = _one(objects, "Service", "elasticgpu-agent-metrics")
    name = "elasticgpu-agent" if not values else "elasticgpu-agent-installer"
    labels = _one(objects, "DaemonSet", name)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    others = [d for d in objects if d["kind"] in ("Deployment", "DaemonSet") and d["metadata"]["name"] != name]
    for other in others:
        assert not service["spec"]["selector"].items() <= other["spec"]["template"]["metadata"]["labels"].items()
    assert [c for c in _containers(objects) if c["name"] in ("agent", "installer")]


# --- The start script ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _listening(path: Path) -> Iterator[None]:
    """A unix socket at `path`, as the runtime's NRI socket is."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        server.listen(1)
        yield
    finally:
        server.close()


class Node:
    """A scratch node (its / seen at host/), the pod's folders, and the script's environment."""

    def __init__(self) -> None:
        # A short path: a unix socket's name is at most 107 bytes.
        self.base = Path(tempfile.mkdtemp(prefix="egpu-pod-", dir="/tmp"))
        self.host = self.base / "host"
        self.host.mkdir()
        self.socket = self.base / "nri" / "nri.sock"
        self.socket.parent.mkdir()
        docs = yaml.safe_load_all((REPO / "deploy" / "agent-daemonset.yaml").read_text())
        (config,) = [d for d in docs if d and d["kind"] == "ConfigMap"]
        self.script = self.base / "agent-pod.sh"
        self.script.write_text(config["data"]["agent-pod.sh"])
        self.env = {
            "PATH": "/usr/bin:/bin",
            "ELASTICGPU_AGENT_NODE_NAME": "gpu-node-1",
            "ELASTICGPU_AGENT_HOST_ROOT": str(self.host),
            "ELASTICGPU_AGENT_NRI_SOCKET": str(self.socket),
            "ELASTICGPU_AGENT_DRIVER_ROOT": "/",
            "ELASTICGPU_NVML_DIR": str(self.base / "nvml"),
            # The stand-in agent says what it was given.
            "ELASTICGPU_AGENT_COMMAND": f"sh {self.base / 'agent'} run",
        }
        (self.base / "agent").write_text('echo ran "$LD_LIBRARY_PATH" "$*"\n')

    def start(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", str(self.script), *args], env=self.env, capture_output=True, text=True,
                              timeout=30)  # fmt: skip

    def driver(self, root: str, folder: str) -> Path:
        lib = self.host / root.strip("/") / folder / "libnvidia-ml.so.550.54.15"
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_text("")
        (lib.parent / "libnvidia-ml.so.1").symlink_to(lib.name)
        return lib.parent / "libnvidia-ml.so.1"

    def cleanup(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def node() -> Iterator[Node]:
    made = Node()
    try:
        yield made
    finally:
        made.cleanup()


def test_a_node_without_nri_is_refused_with_the_fix(node: Node) -> None:
    done = node.start()
    assert done.returncode == 4, done.stderr
    assert f"elasticgpu-agent[gpu-node-1]: no NRI socket at {node.socket}" in done.stderr
    assert '[plugins."io.containerd.nri.v1.nri"] disable = false' in done.stderr
    assert "agent.nodeHook=cri-proxy" in done.stderr and "ran" not in done.stdout


@pytest.mark.parametrize("name", ["elasticgpu-agent.service", "elasticgpu-mps.service"])
def test_a_node_that_runs_the_proxy_modes_host_service_is_refused(node: Node, name: str) -> None:
    # The MPS daemons' unit alone (left behind) would serve the same socket and card folders as elasticgpu-mps.
    unit = node.host / "etc" / "systemd" / "system" / name
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\n")
    with _listening(node.socket):
        done = node.start()
    assert done.returncode == 3, done.stderr
    assert "this node runs the agent as a host service" in done.stderr and f"/etc/systemd/system/{name}" in done.stderr
    assert "Moving a node between the proxy and NRI" in done.stderr and "ran" not in done.stdout


@pytest.mark.parametrize(("root", "folder"), [("/", "usr/lib/x86_64-linux-gnu"),
                                              ("/run/nvidia/driver", "usr/lib64"),
                                              ("/home/kubernetes/bin/nvidia", "lib64")])  # fmt: skip
def test_the_agent_starts_with_nvml_alone_on_its_library_path(node: Node, root: str, folder: str) -> None:
    library = node.driver(root, folder)
    node.env["ELASTICGPU_AGENT_DRIVER_ROOT"] = root
    node.env["LD_LIBRARY_PATH"] = "/opt/keep"
    with _listening(node.socket):
        done = node.start("--log-format", "json")
    assert done.returncode == 0, done.stderr
    nvml = node.base / "nvml"
    assert done.stdout.strip() == f"ran {nvml}:/opt/keep run --log-format json"
    assert os.readlink(nvml / "libnvidia-ml.so.1") == str(library)
    # Only NVML: never the driver's whole folder (the node's libc would replace the image's).
    assert os.listdir(nvml) == ["libnvidia-ml.so.1"]
    assert f"NVML: /{root.strip('/') + '/' if root != '/' else ''}{folder}/libnvidia-ml.so.1" in done.stderr


def test_without_a_driver_the_agent_still_starts_and_says_where_it_looked(node: Node) -> None:
    (node.base / "nvml").mkdir()
    (node.base / "nvml" / "libnvidia-ml.so.1").symlink_to("/gone")  # a driver removed since the last start
    with _listening(node.socket):
        done = node.start()
    assert done.returncode == 0, done.stderr
    assert "no libnvidia-ml.so.1 under the driver root / on this node" in done.stderr
    assert os.listdir(node.base / "nvml") == [] and done.stdout.startswith("ran ")
