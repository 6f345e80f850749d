"""`elasticgpu demo`: the phases in order, each with a deadline, timed; the exit code.

    cluster     the local API server from the cache (or the one of --kubeconfig), the CRDs
    components  namespace, simulated nodes, containerd (root, when built), one agent per node,
                the controller, the webhook; waits for the cards and for the webhook to gate
    scenario    classes, claims, pods (see `scenario`); waits until the claims are Bound and the
                pods' scheduling gates are lifted, and until the claim that cannot fit says why
    containers  each pod's container on its claim's node, through that node's agent (or, with
                no runtime, the agent's injection decision); checks it sees its claim's card(s)
    cleanup     everything deleted and stopped, the temp dir removed

Exit 0 only if every claim reached its container (or, without a runtime, the agent's decision
names the claim's card); else 1 with one line saying what did not happen. Nothing outside the
temporary directory is written on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elasticgpu import user_errors
from elasticgpu.api import names
from elasticgpu.demo import containers, scenario, showing
from elasticgpu.demo.run_frame import INTERRUPTED, OWNER_FILE, TMP_PREFIX, Interrupts, Phases, sweep_stale_dirs
from elasticgpu.testbed import components, free_ports, kube, local_cluster, local_runtime, processes
from elasticgpu.testbed.processes import DemoError

if TYPE_CHECKING:
    from elasticgpu.testbed import real_cluster

ADMISSION = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


class Demo:
    """One run: its temp dir, its children, its cluster and what it created there."""

    def __init__(self, args: argparse.Namespace, say: Callable[[str], None]) -> None:
        self.args = args
        self.say = say
        self.directory = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
        try:
            # Who owns the folder: a later run removes it if this process died without cleaning up.
            (self.directory / OWNER_FILE).write_text(str(os.getpid()))
            self._setup(args)
        except BaseException:  # Ctrl-C in the middle of this: the caller has no Demo to clean up
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def _setup(self, args: argparse.Namespace) -> None:
        children_tmp = self.directory / "tmp"
        children_tmp.mkdir()
        self.children = processes.Children(tmp=children_tmp)
        self.external = bool(args.kubeconfig)
        run_id = uuid.uuid4().hex[:6]
        prefix = f"egpu-demo-{run_id}-" if self.external else "demo-"
        namespace = f"elasticgpu-demo-{run_id}" if self.external else "elasticgpu-demo"
        self.scenario = scenario.Scenario(
            namespace=namespace, run_id=run_id, prefix=prefix, shared_cluster=self.external
        )
        self.webhook_configuration = f"elasticgpu-demo-{run_id}"
        self.kubeconfig = Path(args.kubeconfig).expanduser() if self.external else self.directory / "kubeconfig"
        self.real = not self.external and getattr(args, "cluster", "local") == "real"
        self.owned = contextlib.ExitStack()  # the real control plane the demo started (stopped last)
        self.kube: kube.DemoKube | None = None
        self.runtime: local_runtime.LocalRuntime | None = None
        self.plane: real_cluster.ControlPlane | None = None  # --cluster real's control plane
        self.agent_paths: dict[str, components.AgentPaths] = {}
        self.created: list[str] = []  # paths of cluster-scoped objects to delete (external cluster)
        self.first_seen: float | None = None
        self.metrics_targets: dict[str, list[str]] = {}
        """With `args.metrics` (tests/observability, scripts/dashboard-picture.py): the
        127.0.0.1:port of each component's /metrics, by the job name the chart's Services give."""

    # cluster ---------------------------------------------------------------------------------------

    def start_cluster(self) -> None:
        """The local API server (or the given cluster), and the CRDs."""
        from elasticgpu.api import kinds

        if self.real:
            from elasticgpu.testbed import real_cluster

            try:
                plane = self.owned.enter_context(real_cluster.running_control_plane())
                self.plane = plane
            except real_cluster.ControlPlaneUnavailable as error:
                raise DemoError(f"--cluster real: {error}") from None
            self.kubeconfig = plane.kubeconfig
        elif not self.external:
            binaries = local_cluster.find_binaries(build_if_missing=True)
            if binaries is None:
                raise DemoError(
                    f"no API server to run: `bash {local_cluster.BUILD_SCRIPT}` failed or is missing; "
                    "or pass --kubeconfig of a cluster"
                )
            local_cluster.start(self.directory, self.children, server_bin=binaries[0], etcd_bin=binaries[1])
        self.kube = kube.DemoKube(str(self.kubeconfig), context=self.args.context)
        self.kube.get("/version")
        missing = []
        for info in kinds.KINDS:
            try:
                self.kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{info.crd_name}")
            except kube.NotFound:
                missing.append(info.crd_name)
        if missing:  # on a cluster that has them, the installed ones stay as they are
            from elasticgpu.crd_installer import apply_crds

            for line in apply_crds(kubeconfig=str(self.kubeconfig), context=self.args.context):
                self.say(f"  {line}")

    # components ------------------------------------------------------------------------------------

    def start_components(self) -> None:
        """Namespace, nodes, runtime, agents, controller, webhook; waits until cards and webhook are there."""
        k, s = self._kube(), self.scenario
        k.create("/api/v1/namespaces", s.namespace_body())
        # A real cluster refuses pods until the namespace's default ServiceAccount exists.
        processes.wait_until(
            lambda: k.get(f"/api/v1/namespaces/{s.namespace}/serviceaccounts/default"),
            f"the default ServiceAccount of namespace {s.namespace}",
            timeout_s=30,
        )
        for node in s.nodes:
            self.created.append(f"/api/v1/nodes/{node}")
            k.create("/api/v1/nodes", s.node_body(node))
            k.patch_status(f"/api/v1/nodes/{node}", s.node_status())
        reason = "--no-runtime given" if self.args.no_runtime else local_runtime.unavailable_reason()
        if reason is None:
            self.runtime = local_runtime.start(self.directory / "rt", self.children, nodes=s.nodes)
            self.say("  containerd: running (its CRI behind each node's agent proxy)")
        else:
            self.say(f"  containerd: not available ({reason}); the demo shows the agents' injection decisions")
        agents = []
        if not self.args.no_agent:
            for node in s.nodes:
                paths = components.AgentPaths.under(
                    self.directory, node, self.runtime.cdi_dirs[node] if self.runtime else None
                )
                paths.simulation.write_text(s.simulation())
                self.agent_paths[node] = paths
                agents.append(
                    components.start_agent(
                        self.children,
                        node=node,
                        kubeconfig=self.kubeconfig,
                        paths=paths,
                        events_namespace=s.namespace,
                        runtime_socket=self.runtime.socket if self.runtime else None,
                        log_dir=self.directory,
                        metrics_port=self._metrics_port("elasticgpu-agent-metrics"),
                    )
                )
        controller = components.start_controller(  # a sandbox's serves every namespace: the user's too
            self.children, kubeconfig=self.kubeconfig, namespace=None if getattr(self.args, "sandbox", False)
            else s.namespace, log_dir=self.directory,
            metrics_port=self._metrics_port("elasticgpu-controller-metrics"),
        )
        webhook, _ = components.start_webhook(
            self.children,
            kubeconfig=self.kubeconfig,
            namespace=s.namespace,
            configuration=self.webhook_configuration,
            log_dir=self.directory,
            metrics_port=self._metrics_port("elasticgpu-webhook-metrics"),
        )
        self.say(f"  started: controller, webhook, {len(agents)} node agent(s) (simulated cards: {s.model})")
        everyone = [*agents, controller, webhook]
        if agents:
            wanted = len(s.nodes) * scenario.CARDS_PER_NODE
            processes.wait_until(
                lambda: len(self.gpus()) >= wanted,
                f"the agents to publish {wanted} GPU objects",
                timeout_s=components.START_TIMEOUT_S,
                children=everyone,
            )
        if self.runtime is not None:
            for node, paths in self.agent_paths.items():
                processes.wait_until(
                    paths.cri_socket.exists,
                    f"the CRI proxy socket of the agent of {node}",
                    timeout_s=components.START_TIMEOUT_S,
                    children=everyone,
                )

        def gates() -> bool:  # the API server calls the webhook once it has seen its configuration
            probe = k.create(f"/api/v1/namespaces/{s.namespace}/pods", s.probe_pod_body(), dry_run=True)
            return any(g.get("name") == names.SCHEDULING_GATE for g in probe["spec"].get("schedulingGates") or [])

        processes.wait_until(
            gates,
            "the webhook to gate pods that use claims",
            timeout_s=components.START_TIMEOUT_S,
            children=everyone,
            interval_s=0.5,
        )
        self.everyone = everyone

    def _metrics_port(self, job: str) -> int:
        """A free loopback port for a component's /metrics, noted under `job`; 0 (none) unless
        the run was asked for metrics."""
        if not getattr(self.args, "metrics", False):
            return 0
        port = free_ports.free_port()
        self.metrics_targets.setdefault(job, []).append(f"127.0.0.1:{port}")
        return port

    def gpus(self) -> list[dict[str, Any]]:
        """The GPU objects of the demo's nodes."""
        return self._kube().gpus(f"{names.LABEL_NODE} in ({','.join(self.scenario.nodes)})")

    # scenario --------------------------------------------------------------------------------------

    def apply_scenario(self) -> dict[str, dict[str, Any]]:
        """Classes, claims and pods; waits for binding and gates. Returns the bound claims by name."""
        k, s = self._kube(), self.scenario
        ns = f"/namespaces/{s.namespace}"
        for body in s.class_bodies():
            self.created.append(f"{kube.CUSTOM}/{names.PLURAL_CLASS}/{body['metadata']['name']}")
            k.create(f"{kube.CUSTOM}/{names.PLURAL_CLASS}", body)
        for body in s.claim_bodies():
            k.create(f"{kube.CUSTOM}{ns}/{names.PLURAL_CLAIM}", body)
        for use in s.uses:
            pod = k.create(f"/api/v1{ns}/pods", s.pod_body(use))
            if not any(g.get("name") == names.SCHEDULING_GATE for g in pod["spec"].get("schedulingGates") or []):
                raise DemoError(
                    f"pod {s.namespace}/{use.pod} was admitted without the scheduling gate "
                    f"{names.SCHEDULING_GATE}: the webhook did not see it"
                )
        bound: dict[str, dict[str, Any]] = {}
        for use in s.uses:

            def ready(use: scenario.PodUse = use) -> bool:
                try:
                    claim = k.claim(s.namespace, use.claim)
                except kube.NotFound:
                    return False
                if (claim.get("status") or {}).get("phase") != "Bound":
                    return False
                gated = any(
                    g.get("name") == names.SCHEDULING_GATE
                    for g in k.pod(s.namespace, use.pod)["spec"].get("schedulingGates") or []
                )
                bound[use.claim] = claim
                return not gated

            def hopeless(use: scenario.PodUse = use) -> str:
                # With no agent, no card is ever published: once the controller has said why the
                # claim waits, the failure is certain (it once took the whole --timeout-s, 101 s).
                if not self.args.no_agent or self.gpus():
                    return ""
                status = (k.claim(s.namespace, use.claim).get("status") or {})
                if status.get("phase") == "Bound" or not status.get("reason"):
                    return ""
                return "no node agent runs (--no-agent), so no card is ever published and no claim can bind"

            try:
                processes.wait_until(
                    ready,
                    f"claim {use.claim} Bound and pod {use.pod} ungated",
                    timeout_s=self.args.timeout_s,
                    children=self.everyone,
                    hopeless=hopeless,
                )
            except DemoError as error:
                raise DemoError(f"{error}; {self.why(use.claim)}") from None
        processes.wait_until(
            lambda: (k.claim(s.namespace, s.unfit_claim).get("status") or {}).get("reason"),
            f"claim {s.unfit_claim} to say why it is not bound",
            timeout_s=self.args.timeout_s,
            children=self.everyone,
        )
        return bound

    def why(self, claim_name: str) -> str:
        """The claim's phase, reason and message (what `kubectl describe` would tell)."""
        try:
            status = self._kube().claim(self.scenario.namespace, claim_name).get("status") or {}
        except DemoError as error:
            return f"claim {claim_name}: {error}"
        return (
            f"claim {claim_name} is {status.get('phase') or 'Pending'}"
            f" ({status.get('reason') or 'no reason yet'}: {status.get('message') or 'no message'})"
        )

    # containers ------------------------------------------------------------------------------------

    def see_containers(self, bound: dict[str, dict[str, Any]]) -> list[containers.Sight]:
        """Each scenario container's sight of its claim; DemoError if one does not see its card(s)."""
        k, s = self._kube(), self.scenario
        sights = []
        for use in s.uses:
            claim = bound[use.claim]
            node = str(claim["status"].get("nodeName") or "")
            pod = k.pod(s.namespace, use.pod)
            if self.runtime is not None:
                sight = containers.run_container(
                    self.agent_paths[node].cri_socket,
                    self.runtime.image,
                    pod,
                    scenario.CONTAINER,
                    claim=use.claim,
                    node=node,
                )
            else:
                node_gpus = [g for g in self.gpus() if g["spec"].get("nodeName") == node]
                sight = containers.decide(
                    self.kubeconfig, node_gpus, pod, scenario.CONTAINER, claim=use.claim, node=node
                )
            if self.first_seen is None:
                self.first_seen = sight.seen_at
            wanted = ",".join(str(g) for g in claim["status"].get("gpus") or [])
            seen = sight.env.get("NVIDIA_VISIBLE_DEVICES", "")
            if not wanted or seen != wanted:
                raise DemoError(
                    f"pod {use.pod}, container {scenario.CONTAINER}: claim {use.claim} holds {wanted or 'no card'} "
                    f"but the container sees NVIDIA_VISIBLE_DEVICES={seen or '(unset)'}"
                )
            if not sight.devices:
                raise DemoError(
                    f"pod {use.pod}, container {scenario.CONTAINER}: claim {use.claim} holds {wanted} "
                    "but no device of it reached the container"
                )
            sights.append(sight)
        return sights

    # showing and cleanup ---------------------------------------------------------------------------

    def show(self, sights: list[containers.Sight]) -> None:
        """The tables, the claims' cards, and why the unfit claim waits."""
        showing.show_run(self._kube(), self.scenario, sights, self.say)
        self.say(f"as expected, {self.why(self.scenario.unfit_claim)}")

    def cleanup(self) -> None:
        """Stop every child and remove the temp dir; on a cluster the demo does not own, delete what it
        made there: the scenario while the controller still runs, the rest once the agents (which would
        publish their GPU objects again) are stopped."""
        k = self.kube
        if k is not None and self.external:
            self._delete_scenario(k)
        if self.runtime is not None:
            with contextlib.suppress(Exception):
                self.runtime.stop()
        self.children.stop_all()
        if k is not None and self.real:
            k.close()
            k = None
        self.owned.close()  # after every child of the demo: they talk to its API server until they stop
        if k is not None:
            if self.external:
                with contextlib.suppress(DemoError):
                    k.delete(f"{ADMISSION}/{self.webhook_configuration}")
                for gpu in self._safe_gpus():
                    with contextlib.suppress(DemoError):
                        k.delete(f"{kube.CUSTOM}/{names.PLURAL_GPU}/{gpu['metadata']['name']}")
                for path in reversed(self.created):
                    with contextlib.suppress(DemoError):
                        k.delete(path)
            k.close()
        if self.args.keep:
            self.say(f"kept {self.directory} (logs of every component)")
        else:
            shutil.rmtree(self.directory, ignore_errors=True)

    def abandon(self) -> None:
        """`cleanup` with nothing that can block, for the watchdog of `Interrupts` when cleanup after
        Ctrl-C does not finish: every child's process group SIGKILLed, containerd's shims and mounts
        released, the folders removed, and one line saying so. On a cluster the demo does not own,
        what it made there stays (its names start with elasticgpu-demo)."""
        started = list(self.children.started)
        if self.plane is not None:
            started += self.plane.children.started
        for child in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGKILL)
        if self.runtime is not None:
            self.runtime.kill()
        if self.plane is not None:
            shutil.rmtree(self.plane.directory, ignore_errors=True)
        where = "" if not self.external else f"; what it made on {self.kubeconfig} stays"
        if self.args.keep:
            left = f"kept {self.directory}"
        else:
            shutil.rmtree(self.directory, ignore_errors=True)
            left = "removed its files"
        self.say(f"elasticgpu demo: interrupted: its cleanup hung; killed everything it started and {left}{where}")

    def _delete_scenario(self, k: kube.DemoKube) -> None:
        """Pods and claims first, while the controller still runs: it lifts the claims' finalizers once
        their pods are gone and deletes their ElasticGPUs (reclaim Delete). Then the namespace.

        The demo is the kubelet of its nodes: it removes its pods' sandboxes through each agent (so
        the agents stop reporting the claims as running) and then confirms the pods' deletion
        (grace 0), as kubelet does; a real API server keeps a bound pod until its kubelet has."""
        s = self.scenario
        claims = f"{kube.CUSTOM}/namespaces/{s.namespace}/{names.PLURAL_CLAIM}"
        egpus = f"{kube.CUSTOM}/{names.PLURAL_ELASTIC_GPU}?labelSelector={names.LABEL_CLAIM_NAMESPACE}%3D{s.namespace}"
        if self.runtime is not None:
            for node, paths in self.agent_paths.items():
                try:
                    containers.remove_pod_sandboxes(paths.cri_socket, s.namespace)
                except DemoError as error:  # the agent or containerd already gone: nothing left to report
                    self.say(f"node {node}: {error}")
        with contextlib.suppress(DemoError):
            for use in s.uses:
                k.delete(f"/api/v1/namespaces/{s.namespace}/pods/{use.pod}", grace_period_s=0)
            for claim in k.get(claims).get("items") or []:
                k.delete(f"{claims}/{claim['metadata']['name']}")
            processes.wait_until(
                lambda: not k.get(claims).get("items") and not k.get(egpus).get("items"),
                "the demo's claims and ElasticGPUs to go",
                timeout_s=60,
            )
        with contextlib.suppress(DemoError):
            k.delete(f"/api/v1/namespaces/{s.namespace}")

    def _safe_gpus(self) -> list[dict[str, Any]]:
        try:
            return self.gpus()
        except DemoError:
            return []

    def _kube(self) -> kube.DemoKube:
        if self.kube is None:
            raise DemoError("no cluster connection")
        return self.kube


def _one_line(text: str) -> str:
    return " ".join(text.split())


def run(args: argparse.Namespace) -> int:
    """Handler of `elasticgpu demo`: 0 when every claim reached its container, else 1 with the reason."""
    out = showing.console()

    def say(text: str, style: str | None = None) -> None:
        out.print(text, markup=False, style=style)

    if args.kubeconfig and getattr(args, "cluster", "local") == "real":
        print("elasticgpu demo: error: --cluster real starts its own cluster; drop it or --kubeconfig", file=sys.stderr)
        return user_errors.EXIT_USAGE
    chart = getattr(args, "install", "processes") == "chart"
    if chart and (args.kubeconfig or getattr(args, "cluster", "local") != "real"):
        print("elasticgpu demo: error: --install chart installs the chart on a cluster it starts itself: "
              "give --cluster real (and no --kubeconfig)", file=sys.stderr)  # fmt: skip
        return user_errors.EXIT_USAGE
    if chart and (args.no_runtime or args.no_agent):
        # The chart's agent DaemonSet and the node's containerd are what the chart demo shows: not optional.
        print("elasticgpu demo: error: --no-runtime and --no-agent are for --install processes", file=sys.stderr)
        return user_errors.EXIT_USAGE
    interrupts = Interrupts()
    interrupts.install()
    try:
        if chart:
            from elasticgpu.demo import chart as chart_demo

            return chart_demo.run(args, out, say, interrupts)
        return _run(args, out, say, interrupts)
    except KeyboardInterrupt:  # before the run had anything to clean up
        say("elasticgpu demo: interrupted (nothing was left behind)", "red")
        return INTERRUPTED
    finally:
        interrupts.restore()


def _run(args: argparse.Namespace, out: Any, say: Callable[..., None], interrupts: Interrupts) -> int:
    sweep_stale_dirs()
    phases = Phases()
    demo = Demo(args, say)
    interrupts.abandon = demo.abandon
    failure: str | None = None
    told: user_errors.UserError | None = None
    try:
        with phases.phase("cluster"):
            where = (
                f"({args.kubeconfig})"
                if demo.external
                else "(Kubernetes' own control plane, testcluster/build.sh)"
                if demo.real
                else "(the project's local test server, cached build)"
            )
            say(f"1/4 API server and CRDs {where}", "bold")
            demo.start_cluster()
        with phases.phase("components"):
            say("2/4 node agents (simulated cards), controller, webhook", "bold")
            demo.start_components()
        with phases.phase("scenario (bind + lift gates)"):
            say("3/4 classes, claims and pods: slice, whole card, inline request, one that cannot fit", "bold")
            bound = demo.apply_scenario()
        with phases.phase("containers"):
            say("4/4 each pod's container on its claim's node, through the node agent", "bold")
            sights = demo.see_containers(bound)
        demo.show(sights)
    except DemoError as error:
        failure = str(error)
    except KeyboardInterrupt:
        failure = "interrupted"
        interrupts.count = max(interrupts.count, 1)  # from here on, a Ctrl-C only counts: cleanup runs to its end
    except Exception as error:  # a bug or an answer nobody foresaw: still one line, still cleaned up
        # A mistake of the user's (a missing kubeconfig, a server that does not answer) gets the
        # same one line and exit 2 as every other command, once everything is cleaned up (below).
        told = user_errors.translate(error, args)
        failure = f"{type(error).__name__}: {error} (run again with --keep to keep every component's log)"
    finally:
        interrupts.shielded = True
        with phases.phase("cleanup"):
            demo.cleanup()
    interrupts.finish()
    if told is not None:
        print(f"elasticgpu demo: error: {told}", file=sys.stderr)
        return user_errors.EXIT_USAGE
    if interrupts.count:
        left = f"kept {demo.directory}" if args.keep else "removed its files"
        say(f"elasticgpu demo: interrupted: stopped everything it started and {left}", "red")
        return INTERRUPTED
    total = time.monotonic() - phases.started
    out.print()
    out.print(showing.timings_table(phases.done, total))
    if demo.first_seen is not None:
        seen = "inside a container" if demo.runtime else "in an injection decision"
        say(f"first claim seen {seen}: {demo.first_seen - phases.started:.1f} s after start")
    if failure is not None:
        say(f"elasticgpu demo: FAILED: {_one_line(failure)}", "red")
        return 1
    if not demo.external:  # the `$ kubectl get` lines above were asked of a cluster that is gone now
        say("(that cluster is gone now: `elasticgpu sandbox up` keeps one to run such commands in)")
    if demo.runtime is not None:
        say("elasticgpu demo: OK: every claim reached its container", "green")
    else:
        say(
            "elasticgpu demo: OK: the agents' decisions give every claim's card to its container "
            "(no container runtime here to run them)",
            "green",
        )
    return 0
