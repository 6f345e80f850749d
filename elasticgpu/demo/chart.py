"""`elasticgpu demo --cluster real --install chart`: the product as it will run, installed by its chart.

    box         a one-node Kubernetes in a network namespace of its own (`box`: Kubernetes' own
                control plane, the node's containerd with NRI, kubelet, kube-proxy, a pod network)
    install     the product image (image/build.sh, no registry) imported into the node's containerd,
                then `helm install` of deploy/chart with the values of a node of simulated cards
                (`chart_values`: the only settings that differ from a real GPU node)
    scenario    the same classes, claims and pods as the process demo (`scenario`), now real pods
                of busybox that kubelet runs; waits until each claim is Bound and its pod Running
    containers  what each container sees, read from its log through the API server and kubelet
                (the pod prints its environment and /dev at start); checks it names the claim's card
    uninstall   the pods and claims deleted while the product runs, then `helm uninstall`
    cleanup     the box removed (every process, mount, cgroup and the network namespace)

Why a box and not `--cluster real` alone: the chart's pods need a kubelet, a container runtime with
NRI, a pod network and Services, which the plain control plane of `--cluster real` lacks; the box has
them, inside a network namespace so that nothing of this machine's network is touched.
Exit 0 only when every claim reached its container and helm installed and uninstalled the release.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from elasticgpu.api import names
from elasticgpu.demo import containers, scenario, showing
from elasticgpu.demo.run_frame import INTERRUPTED, OWNER_FILE, TMP_PREFIX, Interrupts, Phases, sweep_stale_dirs
from elasticgpu.testbed import box, helm, kube, processes, product_image, real_cluster
from elasticgpu.testbed.containerd import NodeRuntime
from elasticgpu.testbed.processes import DemoError

CHART = real_cluster.REPO_ROOT / "deploy" / "chart"
RELEASE = "elasticgpu"
SYSTEM = "elasticgpu-system"
INSTALL_TIMEOUT = "8m"
"""helm's --wait: two controller and two webhook replicas and the agent Ready (~1 min on 2 busy cores)."""
HELM_TIMEOUT_S = 600.0
GPU_NODE_LABEL = {"nvidia.com/gpu.present": "true", "elasticgpu.io/agent": "true"}
"""What NVIDIA's GPU feature discovery puts on a GPU node, and the opt-in label of the agent DaemonSet's
nodeSelector (issue 46)."""
END_MARK = "--- seen"
SEE = [
    "/bin/sh", "-c",
    f"env; echo '--- dev'; ls /dev; echo '{END_MARK}'; trap 'exit 0' TERM; while :; do sleep 1; done",
]  # fmt: skip
"""Each scenario container's command: what it sees goes to its log (read through the API server), then it waits."""


def chart_values(runtime: NodeRuntime, home: Path, simulation: str) -> dict[str, Any]:
    """The chart's defaults but for the node: simulated cards (`simulation`, the agent's YAML), the node
    containerd's NRI socket and CDI folder, the agent's ledger and state under `home` (the machine's are
    left alone). The tests install the chart with the same values (tests/realcluster/test_helm_install.py)."""
    if runtime.nri_socket is None:
        raise DemoError("the node's containerd runs without NRI: the agent DaemonSet has no socket to join")
    state = home / "state"
    simulation_file = home / "simulation.yaml"
    simulation_file.write_text(simulation)
    cdi = str(runtime.cdi_dir)
    return {
        "agent": {
            "nriSocket": str(runtime.nri_socket),
            "daemonset": {"hostPaths": {"ledger": str(home / "ledger"), "state": str(state), "cdi": cdi}},
            "env": {
                "ELASTICGPU_AGENT_BACKEND": "simulated",
                # The node's / is the pod's /host (read-only): the simulation file is read from there.
                "ELASTICGPU_AGENT_SIMULATION": f"/host{simulation_file}",
                # The stand-in device nodes at a node path (the runtime binds them into containers by it).
                "ELASTICGPU_AGENT_DEVICE_DIR": str(state / "devices"),
                "ELASTICGPU_AGENT_HEARTBEAT_INTERVAL_S": "5",
            },
        },
    }


def read_sight(log: str, pod: str, container: str, claim: str, node: str) -> containers.Sight | None:
    """What the container printed at start (`SEE`), or None while its log does not hold all of it yet."""
    if END_MARK not in log or "--- dev" not in log:
        return None
    env_part, rest = log.split("--- dev", 1)
    env = dict(line.split("=", 1) for line in env_part.splitlines() if "=" in line)
    devices = [d for d in rest.split(END_MARK, 1)[0].split() if d.startswith("nvidia")]
    shown = {k: v for k, v in env.items() if k in containers.SEEN_ENV}
    return containers.Sight(pod, container, claim, node, env=shown, devices=devices, seen_at=time.monotonic())


class ChartDemo:
    """One run on the box: what it started (closed in reverse by `cleanup`) and what it made there."""

    def __init__(self, args: argparse.Namespace, say: Callable[..., None], directory: Path) -> None:
        self.args, self.say, self.directory = args, say, directory
        self.owned = contextlib.ExitStack()
        self.scenario = scenario.Scenario(namespace="elasticgpu-demo", run_id=uuid.uuid4().hex[:6], prefix="demo-")
        self.box: box.Box | None = None
        self.kube: kube.DemoKube | None = None
        self.helm: helm.Helm | None = None
        self.installed = False
        self.first_seen: float | None = None

    def _kube(self) -> kube.DemoKube:
        if self.kube is None:
            raise DemoError("no cluster connection")
        return self.kube

    def start_box(self) -> None:
        """The box, up with its node Ready and the `kubernetes` Service reachable from inside."""
        try:
            self.box = self.owned.enter_context(box.running_box())
        except (box.BoxUnavailable, real_cluster.ControlPlaneUnavailable) as error:
            raise DemoError(f"--install chart needs the box: {error}") from None
        except box.BoxError as error:
            raise DemoError(str(error)) from None
        self.kube = kube.DemoKube(str(self.box.kubeconfig))
        self.owned.callback(self.kube.close)  # closed before the box goes (last in, first out)
        steps = ", ".join(f"{k} {v:.0f} s" for k, v in self.box.timings.items())
        self.say(f"  node {self.box.node} Ready, pods on {self.box.pod_subnet} ({steps})")

    def install(self) -> None:
        """Import the image into the node's containerd, label the node a GPU node, `helm install`."""
        found = helm.find_helm()
        if isinstance(found, str):
            raise DemoError(f"--install chart needs helm: {found}")
        self.helm = found
        self.say("  the product image of this checkout (bash image/build.sh: cached, a first build takes minutes)")
        try:
            image = product_image.this_checkouts_image()
        except product_image.ImageUnavailable as error:
            raise DemoError(f"--install chart needs the product image: {error}") from None
        running = self._box()
        began = time.monotonic()
        try:
            product_image.import_image(image, ctr=running.runtime.ctr, address=running.runtime.socket)
        except RuntimeError as error:
            raise DemoError(str(error)) from None
        self.say(f"  image {image.name} imported into the node's containerd ({time.monotonic() - began:.0f} s)")
        k = self._kube()
        k.request("PATCH", f"/api/v1/nodes/{running.node}", body={"metadata": {"labels": GPU_NODE_LABEL}},
                  content_type="application/merge-patch+json")  # fmt: skip
        home = self.directory / "node"
        home.mkdir()
        values = self.directory / "values.yaml"
        values.write_text(yaml.safe_dump(chart_values(running.runtime, home, self.scenario.simulation())))
        command = ("install", RELEASE, str(CHART), "-n", SYSTEM, "--create-namespace", "-f", str(values),
                   "--wait", "--timeout", INSTALL_TIMEOUT)  # fmt: skip
        # The file goes with the run's folder: its text is shown, not its path (issue 50).
        self.say(f"  $ helm {' '.join(command[:6])} -f values.yaml --wait   (values.yaml: the chart's defaults"
                 " but for this node of simulated cards; a real GPU node needs none of it)")
        for line in values.read_text().splitlines():
            self.say(f"      {line}")
        began = time.monotonic()
        done = self._helm(*command)
        if done.returncode != 0:
            raise DemoError(f"helm install failed: {done.stderr.strip()}")
        self.installed = True
        self.say(f"  release {RELEASE} deployed in {time.monotonic() - began:.0f} s: {self._product_pods()}")

    def _box(self) -> box.Box:
        if self.box is None:
            raise DemoError("no box")
        return self.box

    def _helm(self, *args: str) -> Any:
        assert self.helm is not None
        return self.helm.run(*args, env={"KUBECONFIG": str(self._box().kubeconfig)}, timeout=HELM_TIMEOUT_S,
                             check=False)  # fmt: skip

    def _product_pods(self) -> str:
        pods = self._kube().get(f"/api/v1/namespaces/{SYSTEM}/pods").get("items") or []
        ready = [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return f"{len(ready)} pods Running ({', '.join(sorted(ready))})"

    def apply_scenario(self) -> dict[str, dict[str, Any]]:
        """Classes, claims and pods; waits until each claim is Bound and its pod Running."""
        k, s = self._kube(), self.scenario
        ns = f"/namespaces/{s.namespace}"
        k.create("/api/v1/namespaces", s.namespace_body())
        processes.wait_until(lambda: k.get(f"/api/v1{ns}/serviceaccounts/default"),
                             f"the default ServiceAccount of namespace {s.namespace}", timeout_s=60)  # fmt: skip

        def gates() -> bool:
            # helm's --wait sees the webhook's pods Ready; the API server reaches them through the Service
            # once kube-proxy has its endpoints: until then a pod that names a claim is refused.
            probe = k.create(f"/api/v1{ns}/pods", self._pod(s.probe_pod_body()), dry_run=True)
            return any(g.get("name") == names.SCHEDULING_GATE for g in probe["spec"].get("schedulingGates") or [])

        processes.wait_until(gates, "the chart's webhook to gate pods that use claims", timeout_s=self.args.timeout_s,
                             interval_s=0.5)  # fmt: skip
        for body in s.class_bodies():
            k.create(f"{kube.CUSTOM}/{names.PLURAL_CLASS}", body)
        for body in s.claim_bodies():
            k.create(f"{kube.CUSTOM}{ns}/{names.PLURAL_CLAIM}", body)
        for use in s.uses:
            pod = k.create(f"/api/v1{ns}/pods", self._pod(s.pod_body(use)))
            if not any(g.get("name") == names.SCHEDULING_GATE for g in pod["spec"].get("schedulingGates") or []):
                raise DemoError(f"pod {s.namespace}/{use.pod} was admitted without the scheduling gate "
                                f"{names.SCHEDULING_GATE}: the chart's webhook did not see it")  # fmt: skip
        bound: dict[str, dict[str, Any]] = {}
        for use in s.uses:

            def ready(use: scenario.PodUse = use) -> bool:
                try:
                    claim = k.claim(s.namespace, use.claim)
                except kube.NotFound:
                    return False
                if (claim.get("status") or {}).get("phase") != "Bound":
                    return False
                bound[use.claim] = claim
                return (k.pod(s.namespace, use.pod).get("status") or {}).get("phase") == "Running"

            processes.wait_until(ready, f"claim {use.claim} Bound and pod {use.pod} Running",
                                 timeout_s=self.args.timeout_s)  # fmt: skip
        processes.wait_until(lambda: (k.claim(s.namespace, s.unfit_claim).get("status") or {}).get("reason"),
                             f"claim {s.unfit_claim} to say why it is not bound",
                             timeout_s=self.args.timeout_s)  # fmt: skip
        return bound

    def _pod(self, body: dict[str, Any]) -> dict[str, Any]:
        """A scenario pod as a real pod of the box: the busybox the node's containerd holds already (the
        box has no registry to pull from), printing what it sees (`SEE`)."""
        (main,) = body["spec"]["containers"]
        main.update(image=self._box().runtime.image, imagePullPolicy="Never", command=SEE)
        return body

    def see_containers(self, bound: dict[str, dict[str, Any]]) -> list[containers.Sight]:
        """Each container's log, read through the API server; DemoError if one does not see its card(s)."""
        k, s = self._kube(), self.scenario
        sights = []
        for use in s.uses:
            status = bound[use.claim]["status"]
            node = str(status.get("nodeName") or "")

            def logged(use: scenario.PodUse = use, node: str = node) -> containers.Sight | None:
                log = k.logs(s.namespace, use.pod, scenario.CONTAINER)
                return read_sight(log, use.pod, scenario.CONTAINER, use.claim, node)

            sight = processes.wait_until(logged, f"the log of {use.pod}/{scenario.CONTAINER}",
                                         timeout_s=self.args.timeout_s)  # fmt: skip
            if self.first_seen is None:
                self.first_seen = sight.seen_at
            wanted = ",".join(str(g) for g in status.get("gpus") or [])
            seen = sight.env.get("NVIDIA_VISIBLE_DEVICES", "")
            if not wanted or seen != wanted:
                raise DemoError(f"pod {use.pod}: claim {use.claim} holds {wanted or 'no card'} but the container "
                                f"sees NVIDIA_VISIBLE_DEVICES={seen or '(unset)'}")  # fmt: skip
            if not sight.devices:
                raise DemoError(f"pod {use.pod}: claim {use.claim} holds {wanted} but no device reached the container")
            sights.append(sight)
        return sights

    def show(self, sights: list[containers.Sight]) -> None:
        """The claims as kubectl shows them, what each container saw, and why the unfit claim waits."""
        k, s, out = self._kube(), self.scenario, showing.console()
        out.print()
        claims_path = f"{kube.CUSTOM}/namespaces/{s.namespace}/{names.PLURAL_CLAIM}"
        out.print(showing.server_table(f"$ kubectl get egpuc -n {s.namespace}", k.table(claims_path)))
        out.print()
        out.print(showing.server_table(f"$ kubectl get pods -n {SYSTEM}", k.table(f"/api/v1/namespaces/{SYSTEM}/pods")))
        out.print()
        claims = k.get(f"{kube.CUSTOM}/namespaces/{s.namespace}/{names.PLURAL_CLAIM}").get("items") or []
        isolation = {c["metadata"]["name"]: (c.get("status") or {}).get("isolation", "") for c in claims}
        out.print(showing.sights_table(sights, isolation))
        out.print()
        for sight in sights:
            self.say(f"ok claim {sight.claim} -> {sight.env.get('NVIDIA_VISIBLE_DEVICES')} on {sight.node}, "
                     f"seen by pod {sight.pod}/{sight.container} (its log, through the API server)")  # fmt: skip
        status = k.claim(s.namespace, s.unfit_claim).get("status") or {}
        self.say(f"as expected, claim {s.unfit_claim} is {status.get('phase') or 'Pending'} "
                 f"({status.get('reason')}: {status.get('message')})")  # fmt: skip

    def uninstall(self) -> None:
        """The scenario's pods and claims deleted while the product runs (it releases their cards), then
        `helm uninstall --wait`."""
        k, s = self._kube(), self.scenario
        claims = f"{kube.CUSTOM}/namespaces/{s.namespace}/{names.PLURAL_CLAIM}"
        for use in s.uses:
            k.delete(f"/api/v1/namespaces/{s.namespace}/pods/{use.pod}")
        for claim in k.get(claims).get("items") or []:
            k.delete(f"{claims}/{claim['metadata']['name']}")
        processes.wait_until(lambda: not k.get(claims).get("items"), "the demo's claims to go",
                             timeout_s=self.args.timeout_s)  # fmt: skip
        began = time.monotonic()
        done = self._helm("uninstall", RELEASE, "-n", SYSTEM, "--wait", "--timeout", "3m")
        if done.returncode != 0:
            raise DemoError(f"helm uninstall failed: {done.stderr.strip()}")
        self.installed = False
        self.say(f"  $ helm uninstall {RELEASE} -n {SYSTEM}: done in {time.monotonic() - began:.0f} s")

    def cleanup(self) -> None:
        """A release still installed (the run failed) is uninstalled quietly; then the box goes."""
        if self.installed and self.helm is not None:
            with contextlib.suppress(Exception):
                self._helm("uninstall", RELEASE, "-n", SYSTEM, "--wait", "--timeout", "2m")
        self.owned.close()


def run(args: argparse.Namespace, out: Any, say: Callable[..., None], interrupts: Interrupts) -> int:
    """The chart demo's phases, timed; 0 when every claim reached its container and the release came and went."""
    sweep_stale_dirs()
    phases = Phases()
    directory = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
    (directory / OWNER_FILE).write_text(str(os.getpid()))
    demo = ChartDemo(args, say, directory)
    failure: str | None = None
    try:
        with phases.phase("box"):
            say("1/5 the box: Kubernetes' own control plane, kubelet, containerd (NRI), kube-proxy, a pod network",
                "bold")  # fmt: skip
            demo.start_box()
        with phases.phase("install"):
            say("2/5 the product image into the node's containerd; helm install of deploy/chart (simulated cards)",
                "bold")  # fmt: skip
            demo.install()
        with phases.phase("scenario (bind + Running)"):
            say("3/5 classes, claims and busybox pods: slice, whole card, inline request, one that cannot fit", "bold")
            bound = demo.apply_scenario()
        with phases.phase("containers"):
            say("4/5 what each container sees: its log, through the API server", "bold")
            sights = demo.see_containers(bound)
        demo.show(sights)
        with phases.phase("uninstall"):
            say("5/5 the pods and claims deleted; helm uninstall", "bold")
            demo.uninstall()
    except DemoError as error:
        failure = str(error)
    except KeyboardInterrupt:
        failure = "interrupted"
        interrupts.count = max(interrupts.count, 1)  # from here on, a Ctrl-C only counts: cleanup runs to its end
    except Exception as error:  # a bug or an answer nobody foresaw: still one line, still cleaned up
        failure = f"{type(error).__name__}: {error}"
    finally:
        interrupts.shielded = True
        with phases.phase("cleanup (the box removed)"):
            demo.cleanup()
            if args.keep:
                say(f"kept {directory}")
            else:
                shutil.rmtree(directory, ignore_errors=True)
    if interrupts.count:
        say("elasticgpu demo: interrupted: stopped everything it started and removed the box", "red")
        return INTERRUPTED
    total = time.monotonic() - phases.started
    out.print()
    out.print(showing.timings_table(phases.done, total))
    if demo.first_seen is not None:
        say(f"first claim seen inside a container: {demo.first_seen - phases.started:.1f} s after start")
    if failure is not None:
        say(f"elasticgpu demo: FAILED: {' '.join(failure.split())}", "red")
        return 1
    say("elasticgpu demo: OK: the chart's pods gave every claim's card to its container; the release is gone", "green")
    return 0
