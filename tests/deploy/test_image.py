"""The product image built without a registry (image/build.sh) runs what the chart runs, as the chart runs it.

Every container of every workload the chart renders (the nri and the cri-proxy node hooks both, the
helm-only hooks included) is run from the imported archive in a real containerd, through CRI as kubelet
would: the image by the name the chart uses, the manifest's command and args, its environment, its
volumes (scratch folders; a ConfigMap's files as the chart renders them) and its securityContext
(runAsUser, readOnlyRootFilesystem). Each runs as far as it can without a cluster: `--help` appended
where the process is this project's CLI, the installer once against a scratch node, the cleanup Job up to
its in-cluster configuration. Beside each, a probe with the same securityContext says which UID the
process has and whether it can write to its root. A command missing from the image, a process that runs
as root where the manifest says 65532, or a root a 65532 process could write, fails here.

deploy/Containerfile builds the same image where a registry is reachable: its USER, ENTRYPOINT and CMD
must be the archive's.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import socket
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import helm_python
import pytest
import yaml

from elasticgpu.agent import settings as agent_settings
from elasticgpu.agent.cri import api
from tests.containerd_runtime import RuntimeUnavailable, TestRuntime, running_containerd, sandbox_config
from tests.product_image import ImageUnavailable, ProductImage, find_image, import_image

pb = api.pb
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "chart"
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
NAMESPACE = "elasticgpu-system"
NODE = "node-1"
IMAGE_USER = 65532
RENDERS: tuple[dict[str, Any], ...] = ({}, {"agent": {"nodeHook": "cri-proxy"}})
"""The chart's defaults (the agent as a DaemonSet, agent.nodeHook=nri) and the CRI proxy's node hook
(the agent installer instead): between them every workload the chart has."""
POD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}
RUN_TIMEOUT_S = 120.0
PROBE = ("import errno, os\n"
         "try:\n    open('/.elasticgpu-write-probe', 'w').close()\n"
         "except OSError as e:\n    print('write', errno.errorcode[e.errno])\n"
         "else:\n    print('write ok')\n"
         "print('uid', os.getuid(), 'gid', os.getgid())")


@dataclass(frozen=True)
class Workload:
    """One container of the chart, with what a kubelet would give it."""

    where: str  # "DaemonSet/elasticgpu-agent: agent"
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    run_as_user: int | None
    read_only_root: bool
    mounts: dict[str, tuple[dict[str, Any], bool]]  # container path -> (the pod's volume, read-only)
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> data


def _field(ref: dict[str, Any], *, namespace: str) -> str:
    """What the downward API gives a fieldRef here."""
    return {"spec.nodeName": NODE, "metadata.namespace": namespace}.get(ref["fieldPath"], "unset")


def chart_workloads() -> list[Workload]:
    """Every container (and init container) of every pod template the chart renders, once."""
    found: dict[str, Workload] = {}
    for values in RENDERS:
        chart = helm_python.Chart.load(CHART)
        try:
            rendered = chart.render(values, name="elasticgpu", namespace=NAMESPACE)
        finally:
            chart.close()
        objects = [doc for template, text in rendered.items() if template.endswith(".yaml")
                   for doc in yaml.safe_load_all(text) if doc]
        config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
        for o in objects:
            if o["kind"] not in POD_KINDS:
                continue
            spec = o["spec"]["template"]["spec"]
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            for c in spec.get("initContainers", []) + spec["containers"]:
                where = f"{o['kind']}/{o['metadata']['name']}: {c['name']}"
                context = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
                env = {e["name"]: e["value"] if "value" in e
                       else _field(e["valueFrom"]["fieldRef"], namespace=NAMESPACE) for e in c.get("env", [])}
                found[where] = Workload(
                    where=where, image=c["image"], command=list(c.get("command", [])), args=list(c.get("args", [])),
                    env=env, run_as_user=context.get("runAsUser"),
                    read_only_root=bool(context.get("readOnlyRootFilesystem")),
                    mounts={m["mountPath"]: (volumes[m["name"]], bool(m.get("readOnly")))
                            for m in c.get("volumeMounts", [])},
                    config_maps=config_maps)
    return sorted(found.values(), key=lambda w: w.where)


WORKLOADS = chart_workloads()


# --- running a container to its end through CRI ---

@dataclass
class Ran:
    exit_code: int
    output: str


class Pods:
    """Sandboxes and containers on the test containerd, as kubelet makes them, each run to its end."""

    def __init__(self, runtime: TestRuntime, scratch: Path) -> None:
        self.channel = grpc.insecure_channel(runtime.endpoint)
        self.stub = api.services.RuntimeServiceStub(self.channel)
        self.scratch = scratch
        self.sandboxes: list[str] = []

    def close(self) -> None:
        for sandbox_id in self.sandboxes:
            with contextlib.suppress(grpc.RpcError):
                self.stub.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=30)
                self.stub.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=30)
        self.channel.close()

    def run(self, image: str, *, command: list[str] | None = None, args: list[str] | None = None,
            env: dict[str, str] | None = None, run_as_user: int | None = None, read_only_root: bool = False,
            mounts: dict[str, Path] | None = None, read_only_mounts: frozenset[str] = frozenset()) -> Ran:
        """One container in a pod of its own, started and waited for; its exit code and log."""
        name = f"img-{uuid.uuid4().hex[:8]}"
        logs = self.scratch / name
        logs.mkdir()
        sandbox = sandbox_config(name=name, namespace=NAMESPACE, uid=str(uuid.uuid4()))
        sandbox.log_directory = str(logs)
        sandbox_id = self.stub.RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox), timeout=60).pod_sandbox_id
        self.sandboxes.append(sandbox_id)
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="main"), image=pb.ImageSpec(image=image),
            command=command or [], args=args or [], log_path="main.log",
            envs=[pb.KeyValue(key=k, value=v.encode()) for k, v in (env or {}).items()],
            mounts=[pb.Mount(container_path=c, host_path=str(h), readonly=c in read_only_mounts)
                    for c, h in (mounts or {}).items()],
            labels={"io.kubernetes.container.name": "main", "io.kubernetes.pod.name": name,
                    "io.kubernetes.pod.namespace": NAMESPACE, "io.kubernetes.pod.uid": sandbox.metadata.uid},
        )
        if run_as_user is not None:  # kubelet sets it from the securityContext; unset, the image's User holds
            config.linux.security_context.run_as_user.value = run_as_user
        config.linux.security_context.readonly_rootfs = read_only_root
        container_id = self.stub.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox), timeout=60,
        ).container_id
        self.stub.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=60)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            status = self.stub.ContainerStatus(pb.ContainerStatusRequest(container_id=container_id), timeout=10).status
            if status.state == pb.CONTAINER_EXITED:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{command} {args} still runs after {RUN_TIMEOUT_S:.0f} s: "
                                     f"{_log(logs / 'main.log')}")
            time.sleep(0.2)
        return Ran(status.exit_code, _log(logs / "main.log"))


def _log(path: Path) -> str:
    """The text of a CRI container log (`TIME STREAM P|F TEXT` lines; P: a partial line)."""
    if not path.exists():
        return ""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4:
            out.append(parts[3] + ("" if parts[2] == "P" else "\n"))
    return "".join(out)


# --- the fixtures ---

@pytest.fixture(scope="module")
def product_image() -> ProductImage:
    try:
        return find_image()
    except ImageUnavailable as e:
        pytest.skip(f"no product image (image/build.sh): {e}")


@pytest.fixture(scope="module")
def image_config(product_image: ProductImage) -> dict[str, Any]:
    """The image configuration (its `config` object) inside the archive."""
    with tarfile.open(product_image.archive) as archive:
        def read(path: str) -> Any:
            member = archive.extractfile(path)
            assert member is not None, path
            return json.load(member)

        index = read("index.json")
        (entry,) = index["manifests"]
        assert entry["annotations"]["io.containerd.image.name"] == product_image.name
        manifest = read("blobs/sha256/" + entry["digest"].split(":", 1)[1])
        config: dict[str, Any] = read("blobs/sha256/" + manifest["config"]["digest"].split(":", 1)[1])["config"]
        return config


@contextlib.contextmanager
def _runtime_with_image(image: ProductImage, containerd: str, tmp: Path) -> Iterator[Pods]:
    """A private containerd with the archive imported, as `ctr -n k8s.io images import` does on a node."""
    with contextlib.ExitStack() as stack:
        try:
            runtime = stack.enter_context(running_containerd(containerd=containerd))
        except RuntimeUnavailable as e:
            pytest.skip(f"no test container runtime (containerd {containerd}): {e}")
        import_image(image, ctr=runtime.ctr, address=runtime.socket)
        pods = Pods(runtime, tmp)
        stack.callback(pods.close)
        yield pods


@pytest.fixture(scope="module")
def pods(product_image: ProductImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pods]:
    """containerd 1.7 with the product image imported as a node without a registry has it."""
    with _runtime_with_image(product_image, "1.7", tmp_path_factory.mktemp("image-pods")) as made:
        yield made


# --- how each command of the chart runs without a cluster ---

@dataclass
class Plan:
    """The manifest's container made runnable here: what to add, and what its end must show."""

    args: list[str]
    env: dict[str, str]
    check: Callable[[Ran], None]
    after: Callable[[Pods, Path], None] | None = None  # a further check once it ended (given the scratch node)


def _help(ran: Ran) -> None:
    assert ran.exit_code == 0 and "usage: elasticgpu" in ran.output, ran.output


def _prepare_volumes(work: Workload, scratch: Path) -> tuple[dict[str, Path], frozenset[str]]:
    """A scratch folder per volume mount (a ConfigMap's files written in it); the node's /dev stays the
    runtime's."""
    mounts: dict[str, Path] = {}
    read_only = set()
    for path, (volume, ro) in work.mounts.items():
        if path == "/dev":
            continue
        host = scratch / volume["name"]
        host.mkdir(exist_ok=True)
        if "configMap" in volume:
            for key, text in work.config_maps[volume["configMap"]["name"]].items():
                (host / key).write_text(text)
        mounts[path] = host
        if ro:
            read_only.add(path)
    return mounts, frozenset(read_only)


def _listening_socket(mounts: dict[str, Path], path: str) -> socket.socket:
    """A unix socket listening at `path` as the container sees it, in the folder mounted there."""
    folder = path.rsplit("/", 1)[0]
    assert folder in mounts, f"{path}: no volume is mounted at {folder}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(mounts[folder] / path.rsplit("/", 1)[1]))
    server.listen(1)
    return server


def plan(work: Workload) -> Plan:
    """How to run `work`'s command here. A command the chart gains must be added here, or this fails."""
    if not work.command:  # the image's entrypoint, the CLI: its arguments, then --help
        return Plan(args=[*work.args, "--help"], env={}, check=_help)
    if work.command[:2] == ["/bin/sh", "/elasticgpu-agent-pod/agent-pod.sh"]:
        # Checks the node (no host service, NRI's socket there, NVML), then execs `elasticgpu agent run`
        # with these arguments.
        return Plan(args=["--help"], env={}, check=_help)
    if work.command[:2] == ["/bin/sh", "/installer/install-agent.sh"]:
        # Once, against the scratch node, systemctl replaced (the script's own settings for tests).
        def installed(ran: Ran) -> None:
            assert ran.exit_code == 0, ran.output
            assert "waiting for /etc/elasticgpu/kubeconfig" in ran.output, ran.output

        return Plan(args=[], env={"ELASTICGPU_INSTALLER_ONCE": "1", "ELASTICGPU_SYSTEMCTL": "true"},
                    check=installed, after=_installed_python_runs)
    if work.command[:3] == ["elasticgpu", "agent", "mps-daemons"]:
        # The MPS daemon service (DaemonSet elasticgpu-mps): the CLI by name, its settings parsed, then --help.
        return Plan(args=["--help"], env={}, check=_help)
    if work.command[:2] == ["elasticgpu", "after-uninstall"]:
        # helm uninstall's hook: the CLI by name on the image's PATH, its arguments parsed, then --help.
        return Plan(args=["--help"], env={}, check=_help)
    raise AssertionError(f"{work.where} runs {shlex.join(work.command)}: tell plan() how to run it without a cluster")


def _installed_python_runs(pods: Pods, node: Path) -> None:
    """The installer put the image's Python on the node: it runs there, with the project, on the
    node's own root (here the test runtime's busybox, which has no Python of its own)."""
    opt = node / "opt" / "elasticgpu"
    assert (opt / "bin" / "python").exists(), sorted(p.name for p in opt.iterdir())
    ran = pods.run("elasticgpu.local/busybox:test", command=["/opt/elasticgpu/bin/python", "-c",
                   "import elasticgpu.cli, elasticgpu.agent.cri.api, numpy; print('agent imports')"],
                   mounts={"/opt/elasticgpu": opt})
    assert ran.exit_code == 0 and "agent imports" in ran.output, ran.output


# --- the tests ---

def test_the_archive_is_the_image_the_chart_runs(product_image: ProductImage) -> None:
    assert WORKLOADS, "the chart renders no workloads"
    assert {w.image for w in WORKLOADS} == {product_image.name}, [(w.where, w.image) for w in WORKLOADS]


def test_the_containerfile_and_the_script_agree(image_config: dict[str, Any]) -> None:
    """User, entry point and command: deploy/Containerfile's and the archive's are the same."""
    final_stage = re.split(r"^FROM ", CONTAINERFILE.read_text(), flags=re.MULTILINE)[-1]

    def instruction(name: str) -> str:
        found: list[str] = re.findall(rf"^{name} (.+)$", final_stage, flags=re.MULTILINE)
        assert found, f"deploy/Containerfile's last stage has no {name}"
        return found[-1].strip()

    assert instruction("USER") == image_config["User"] == f"{IMAGE_USER}:{IMAGE_USER}"
    assert json.loads(instruction("ENTRYPOINT")) == image_config["Entrypoint"]
    assert json.loads(instruction("CMD")) == image_config["Cmd"]


def test_the_image_runs_its_default_command_as_65532(pods: Pods, product_image: ProductImage) -> None:
    """No securityContext at all: the image's own User, Entrypoint and Cmd."""
    _help(pods.run(product_image.name))
    probe = pods.run(product_image.name, command=["python3", "-c", PROBE])
    assert probe.exit_code == 0, probe.output
    assert f"uid {IMAGE_USER} gid {IMAGE_USER}" in probe.output, probe.output
    assert "write EACCES" in probe.output, probe.output  # the root belongs to root


@pytest.mark.parametrize("work", WORKLOADS, ids=[w.where for w in WORKLOADS])
def test_each_command_of_the_chart_runs_in_the_image_as_its_manifest_says(
        work: Workload, pods: Pods, product_image: ProductImage, tmp_path: Path) -> None:
    how = plan(work)
    node = tmp_path / "node"
    node.mkdir()
    mounts, read_only = _prepare_volumes(work, node)
    env = {**work.env, **how.env}
    with contextlib.ExitStack() as stack:
        if nri := env.get("ELASTICGPU_AGENT_NRI_SOCKET"):
            stack.enter_context(_listening_socket(mounts, nri))
        ran = pods.run(work.image, command=work.command, args=how.args or work.args, env=env,
                       run_as_user=work.run_as_user, read_only_root=work.read_only_root, mounts=mounts,
                       read_only_mounts=read_only)
    how.check(ran)
    if how.after is not None:
        how.after(pods, mounts.get("/host", node))
    probe = pods.run(work.image, command=["python3", "-c", PROBE], run_as_user=work.run_as_user,
                     read_only_root=work.read_only_root, mounts=mounts, read_only_mounts=read_only)
    uid = IMAGE_USER if work.run_as_user is None else work.run_as_user
    assert f"uid {uid} " in probe.output, (work.where, probe.output)
    if work.read_only_root:
        assert "write EROFS" in probe.output, (work.where, probe.output)
    else:
        assert ("write ok" if uid == 0 else "write EACCES") in probe.output, (work.where, probe.output)


def test_the_controller_and_webhook_run_as_65532_on_a_read_only_root() -> None:
    """What the issue asks of the image is what the manifests ask of the runtime (the probe above holds
    each to it): the processes that serve run as 65532 on a read-only root."""
    serving = [w for w in WORKLOADS if w.where.startswith(("Deployment/", "Job/"))]
    assert serving and all(w.run_as_user == IMAGE_USER and w.read_only_root for w in serving), serving


def test_containerd_2_imports_and_runs_it(product_image: ProductImage, tmp_path: Path) -> None:
    with _runtime_with_image(product_image, "2", tmp_path) as on_2:
        _help(on_2.run(product_image.name))


def test_the_agents_nri_plugin_is_in_the_image_where_the_agent_looks_for_it(pods: Pods,
                                                                            product_image: ProductImage) -> None:
    """The DaemonSet's agent (agent.nodeHook=nri) runs its NRI plugin by the name its settings give, looked up
    in PATH: without the binary in the image the agent could not register with the runtime."""
    plugin = agent_settings.CriSettings().nri_plugin
    look_up = f'test -x "$(command -v {plugin})" && command -v {plugin}'
    found = pods.run(product_image.name, command=["/bin/sh", "-c", look_up])
    assert found.exit_code == 0, found.output
    installed = found.output.strip().splitlines()[-1]
    # The Containerfile puts it at the same path.
    copied = re.search(rf"^COPY --from=\S+ \S+ {re.escape(installed)}$", CONTAINERFILE.read_text(), re.MULTILINE)
    assert copied, installed
