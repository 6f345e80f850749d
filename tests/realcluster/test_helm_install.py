"""The product installed as a platform team installs it (issue 35): `helm install` of deploy/chart, with
the image built without a registry (image/build.sh) imported into the node's containerd, on the box
(tests/realcluster/box.py: Kubernetes' own control plane, kubelet, kube-proxy and a pod network inside a
network namespace of the test's). Every part of the product runs as the chart's pods: two controller
replicas electing a leader, the webhook Deployment reached by the API server through its Service, the
agent's NRI DaemonSet on the GPU node (simulated cards: the only setting that differs from a real
node, with the node folders moved into the test's own by `agent.daemonset.hostPaths`), the default
class, the PodDisruptionBudgets.

Then, as a user: a claim and a pod that uses it reach Running with the claim's card (`kubectl exec`
through the API server and kubelet shows its environment and limits file); a pod without a claim sees
no card. `helm upgrade` with a changed value rolls every component while the bound claim stays bound
and its pod keeps running; deleting the leader's pod hands the Lease over within its duration;
`helm uninstall` leaves no object of the release and nothing the product made at run time, and no
finalizer of the product (the CRDs and the claims stay: Helm keeps a chart's crds/)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from elasticgpu.api import names
from elasticgpu.demo.chart import chart_values
from tests.helm_binary import Helm, helm_or_skip
from tests.kube_cluster import find_kubectl
from tests.product_image import ImageUnavailable, ProductImage, find_image, import_image
from tests.realcluster.box import Box
from tests.realcluster.test_agent_node import SIMULATION

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "chart"
RELEASE = "elasticgpu"
SYSTEM = "elasticgpu-system"
INSTALL_TIMEOUT = "8m"
WITHIN_S = 180.0
LEASE = "elasticgpu-controller"
CONFIGURATION = "elasticgpu-pods"
WEBHOOK_SECRET = "elasticgpu-webhook-tls"
LIMITS_FILE = "/run/elasticgpu/limits.json"
SLEEP = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
CUSTOM = (names.GROUP, names.VERSION)
PRODUCT_SELECTOR = "app.kubernetes.io/name=elasticgpu"


@dataclass
class Release:
    helm: Helm
    box: Box
    image: ProductImage
    values: Path
    env: dict[str, str]  # KUBECONFIG for helm

    def helm_run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.helm.run(*args, env=self.env, timeout=timeout, check=False)


def _wait(check: Callable[[], Any], what: str, timeout_s: float = WITHIN_S, explain: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        if result := check():
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s\n{explain()}")
        time.sleep(1)


def _kubectl(box: Box, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    kubectl = find_kubectl()
    if kubectl is None:
        pytest.skip("kubectl not found: run `bash testserver/build.sh` (it unpacks one) or set ELASTICGPU_KUBECTL_BIN")
    return subprocess.run([str(kubectl), "--kubeconfig", str(box.kubeconfig), *args], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def diagnose(box: Box) -> str:
    """What a platform team would look at: the product's pods, the namespace's Events, each pod's log tail."""
    parts = []
    for args in (("get", "pods", "-A", "-o", "wide"), ("-n", SYSTEM, "get", "events", "--sort-by=.lastTimestamp")):
        done = _kubectl(box, *args)
        parts.append(f"$ kubectl {' '.join(args)}\n{done.stdout[-4000:]}{done.stderr[-1000:]}")
    pods = _kubectl(box, "-n", SYSTEM, "get", "pods", "-o", "name").stdout.split()
    for pod in pods:
        done = _kubectl(box, "-n", SYSTEM, "logs", pod, "--all-containers", "--tail", "25")
        parts.append(f"$ kubectl logs {pod}\n{done.stdout[-3000:]}{done.stderr[-500:]}")
    return "\n".join(parts)


def _values(box: Box, home: Path) -> dict[str, Any]:
    """The chart's defaults but for the node: simulated cards, the test containerd's NRI socket and CDI
    folder, the agent's ledger and state in the test's own folder (the machine's are left alone); the
    same values as `elasticgpu demo --cluster real --install chart` (elasticgpu/demo/chart.py)."""
    return chart_values(box.runtime, home, SIMULATION)


@pytest.fixture(scope="module")
def release(box: Box, box_api_client: client.ApiClient) -> Iterator[Release]:
    helm = helm_or_skip()
    try:
        image = find_image()
    except ImageUnavailable as e:
        pytest.skip(f"no product image: {e}")
    began = time.monotonic()
    import_image(image, ctr=box.runtime.ctr, address=box.runtime.socket)
    imported_s = time.monotonic() - began
    core = client.CoreV1Api(box_api_client)
    # The GPU node's label, as NVIDIA's GPU feature discovery puts it, and the opt-in label the platform
    # engineer puts on a node chosen for the agent (the DaemonSet's nodeSelector; issue 46).
    core.patch_node(box.node, {"metadata": {"labels": {"nvidia.com/gpu.present": "true",
                                                       "elasticgpu.io/agent": "true"}}})
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="eghelm-", dir="/tmp")))
        values = home / "values.yaml"
        values.write_text(yaml.safe_dump(_values(box, home)))
        env = {"KUBECONFIG": str(box.kubeconfig)}
        running = Release(helm, box, image, values, env)
        stack.callback(_uninstall_quietly, running)
        installed = running.helm_run("install", RELEASE, str(CHART), "-n", SYSTEM, "--create-namespace",
                                     "-f", str(values), "--wait", "--timeout", INSTALL_TIMEOUT)  # fmt: skip
        assert installed.returncode == 0, f"helm install failed:\n{installed.stderr}\n{diagnose(box)}"
        # helm's --wait sees the webhook's pods Ready; the API server reaches them through the Service once
        # kube-proxy has programmed its endpoints (a moment later, in any cluster): until then a pod that
        # names a claim is refused (failurePolicy Fail), which is what a user would meet, not a bug to hide.
        probe = _pod("probe", box.runtime.image, "probe")
        _wait(lambda: _gated(core, "default", probe), "the chart's webhook gates a pod that names a claim",
              timeout_s=60, explain=lambda: diagnose(box))  # fmt: skip
        print(f"\nhelm install: image import {imported_s:.1f} s, install --wait "
              f"{time.monotonic() - began - imported_s:.1f} s")  # fmt: skip
        yield running


def _gated(core: client.CoreV1Api, namespace: str, pod: dict[str, Any], *, refusals: list[str] | None = None) -> bool:
    """A dry-run create of `pod` comes back with the webhook's scheduling gate (False while the webhook
    cannot be reached: the API server refuses the pod; `refusals` gets what it said)."""
    try:
        made = core.create_namespaced_pod(namespace, pod, dry_run="All")
    except client.ApiException as err:
        if refusals is not None:
            refusals.append(f"{time.strftime('%H:%M:%S')} HTTP {err.status}: {str(err.body)[:300]}")
        return False
    gated = [g.name for g in made.spec.scheduling_gates or []] == [names.SCHEDULING_GATE]
    if not gated and refusals is not None:
        refusals.append(f"{time.strftime('%H:%M:%S')} created without the gate: {made.spec.scheduling_gates}")
    return gated


class _CreatingPods:
    """Creates `pod` (a dry run, which the webhook answers as a real create) about twice a second on a thread of
    its own, as users do, and keeps what the API server refused."""

    def __init__(self, core: client.CoreV1Api, pod: dict[str, Any]) -> None:
        self.core, self.pod = core, pod
        self.made = 0
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="creating-pods", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def more(self, count: int) -> None:
        """Return once `count` more creates were answered (or the thread stopped)."""
        target = self.made + len(self.refused) + count
        while self.made + len(self.refused) < target and self._thread.is_alive():
            time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            if _gated(self.core, "default", self.pod, refusals=self.refused):
                self.made += 1
            self._stop.wait(0.5)


def _uninstall_quietly(release: Release) -> None:
    if release.helm_run("status", RELEASE, "-n", SYSTEM).returncode == 0:
        release.helm_run("uninstall", RELEASE, "-n", SYSTEM, "--wait", "--timeout", "3m")
    with contextlib.suppress(client.ApiException):
        _delete_namespace(release.box)


def _delete_namespace(box: Box) -> None:
    _kubectl(box, "delete", "namespace", SYSTEM, "--ignore-not-found", "--wait=false")


COMPONENT_SELECTORS = {
    # The controller's pods carry its own name (the Deployment's selector, immutable since 0.1.0's first install).
    "controller": "app.kubernetes.io/name=elasticgpu-controller",
    "webhook": f"{PRODUCT_SELECTOR},app.kubernetes.io/component=webhook",
    "agent": f"{PRODUCT_SELECTOR},app.kubernetes.io/component=agent",
}


def _product_pods(core: client.CoreV1Api, component: str) -> list[Any]:
    selector = COMPONENT_SELECTORS[component]
    return [p for p in core.list_namespaced_pod(SYSTEM, label_selector=selector).items
            if p.metadata.deletion_timestamp is None]  # fmt: skip


def _ready(pod: Any) -> bool:
    return pod.status.phase == "Running" and all(s.ready for s in pod.status.container_statuses or [])


def _lease_holder(box_api_client: client.ApiClient) -> tuple[str, int]:
    lease = client.CoordinationV1Api(box_api_client).read_namespaced_lease(LEASE, SYSTEM)
    return lease.spec.holder_identity or "", lease.spec.lease_duration_seconds or 0


def test_every_component_runs_as_the_charts_pods(release: Release, box_api_client: client.ApiClient) -> None:
    apps = client.AppsV1Api(box_api_client)
    core = client.CoreV1Api(box_api_client)
    for name, replicas in (("elasticgpu-controller", 2), ("elasticgpu-webhook", 2)):
        deployment = apps.read_namespaced_deployment(name, SYSTEM)
        assert deployment.status.ready_replicas == replicas, (name, deployment.status)
    agent = apps.read_namespaced_daemon_set("elasticgpu-agent", SYSTEM)
    assert agent.status.number_ready == agent.status.desired_number_scheduled == 1, agent.status
    for component, replicas in (("controller", 2), ("webhook", 2), ("agent", 1)):
        pods = _product_pods(core, component)
        assert len(pods) == replicas, (component, [p.metadata.name for p in pods])
        for pod in pods:
            assert _ready(pod), (pod.metadata.name, pod.status)
            assert {c.image for c in pod.spec.containers} == {release.image.name}, pod.spec.containers
            if component != "agent":  # the agent is root on the node by design (its DaemonSet's header)
                (container,) = pod.spec.containers
                assert container.security_context.read_only_root_filesystem, container.security_context
                user = container.security_context.run_as_user or pod.spec.security_context.run_as_user
                assert user == 65532, (pod.metadata.name, user)
    # One leader among the two controller pods (the holder identity starts with its pod's name).
    controllers = [p.metadata.name for p in _product_pods(core, "controller")]
    holder, _ = _wait(lambda: (h := _lease_holder(box_api_client))[0] and h, "a controller holds the Lease")
    assert [c for c in controllers if holder.startswith(f"{c}_")], (holder, controllers)
    # The agent's GPU objects, published through its pod-bound token; the default class.
    gpus = client.CustomObjectsApi(box_api_client).list_cluster_custom_object(*CUSTOM, names.PLURAL_GPU)["items"]
    assert {g["spec"]["nodeName"] for g in gpus} == {release.box.node}, gpus
    classes = client.CustomObjectsApi(box_api_client).list_cluster_custom_object(*CUSTOM, names.PLURAL_CLASS)
    assert [c for c in classes["items"] if c["metadata"].get("annotations", {}).get(names.ANNOTATION_DEFAULT_CLASS)
            == "true"], classes  # fmt: skip
    # The PodDisruptionBudgets of the release.
    budgets = client.PolicyV1Api(box_api_client).list_namespaced_pod_disruption_budget(SYSTEM).items
    assert budgets and all(b.status.current_healthy >= 1 for b in budgets), budgets


def _claim(name: str, cores: int = 50) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "metadata": {"name": name},
            "spec": {"resources": {"requests": {names.RESOURCE_CORE: cores,
                                                names.RESOURCE_MEMORY: "1Gi"}}}}  # fmt: skip


def _pod(name: str, image: str, claim: str | None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {names.claim_annotation("main"): claim} if claim else {}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [
            {"name": "main", "image": image, "imagePullPolicy": "Never", "command": SLEEP}]},
    }  # fmt: skip


@pytest.fixture(scope="module")
def team(release: Release, box_api_client: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(box_api_client)
    name = f"team-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)


def _running(core: client.CoreV1Api, namespace: str, name: str, box: Box) -> Any:
    def running() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        assert pod.status.phase in ("Pending", "Running"), (name, pod.status)
        return pod if pod.status.phase == "Running" else None

    return _wait(running, f"pod {namespace}/{name} Running", explain=lambda: diagnose(box))


def _exec(box: Box, namespace: str, pod: str, *command: str) -> str:
    done = _kubectl(box, "-n", namespace, "exec", pod, "--", *command)
    assert done.returncode == 0, (command, done.stderr)
    return done.stdout


def _env(box: Box, namespace: str, pod: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in _exec(box, namespace, pod, "env").splitlines() if "=" in line)


def _bound(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    status = custom.get_namespaced_custom_object(*CUSTOM, namespace, names.PLURAL_CLAIM, name).get("status") or {}
    return status if status.get("phase") == "Bound" else None


def _binding(status: dict[str, Any] | None) -> dict[str, Any]:
    """What binds the claim (the agent's usage report beside it changes as it samples)."""
    assert status is not None, "not Bound"
    return {key: status.get(key) for key in ("phase", "nodeName", "gpus", "allocatedResources")}


def start_claim_pod(box: Box, api: client.ApiClient, namespace: str, name: str) -> tuple[Any, dict[str, Any]]:
    """A user's claim and a pod that names it, Running; the pod and the claim's status."""
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    custom.create_namespaced_custom_object(*CUSTOM, namespace, names.PLURAL_CLAIM, _claim(name))
    created = core.create_namespaced_pod(namespace, _pod(name, box.runtime.image, name))
    assert [g.name for g in created.spec.scheduling_gates or []] == [names.SCHEDULING_GATE], created.spec
    pod = _running(core, namespace, name, box)
    status = _wait(lambda: _bound(custom, namespace, name), f"claim {namespace}/{name} Bound")
    return pod, status


def test_a_users_claim_pod_runs_with_its_card_and_a_plain_pod_sees_none(
    release: Release, box_api_client: client.ApiClient, team: str
) -> None:
    box = release.box
    pod, status = start_claim_pod(box, box_api_client, team, "first")
    assert pod.spec.node_name == box.node and status["nodeName"] == box.node, status
    (card,) = status["gpus"]
    env = _env(box, team, "first")
    assert env.get("NVIDIA_VISIBLE_DEVICES") == card, env
    assert env.get("ELASTICGPU_LIMITS_FILE") == LIMITS_FILE, env
    limits = json.loads(_exec(box, team, "first", "cat", LIMITS_FILE))
    assert (limits["claim"], limits["cores"], limits["memoryMiB"]) == (f"{team}/first", 50, 1024), limits
    core = client.CoreV1Api(box_api_client)
    core.create_namespaced_pod(team, _pod("plain", box.runtime.image, None))
    _running(core, team, "plain", box)
    plain = _env(box, team, "plain")
    assert plain.get("NVIDIA_VISIBLE_DEVICES") == "void", plain
    assert "ELASTICGPU_LIMITS_FILE" not in plain, plain
    assert not [d for d in _exec(box, team, "plain", "ls", "/dev").split() if d.startswith("nvidia")]
    core.delete_namespaced_pod("plain", team)


def _refusals(core: client.CoreV1Api, namespace: str) -> list[str]:
    """Warning Events on the users' pods: a container the agent refused, a pod that failed to start."""
    return [f"{e.involved_object.name}: {e.reason}: {e.message}" for e in core.list_namespaced_event(namespace).items
            if e.type == "Warning" and e.involved_object.kind == "Pod" and e.reason not in NO_CLUSTER_DNS]  # fmt: skip


NO_CLUSTER_DNS = {"MissingClusterDNS"}
"""kubelet's word for the box having no cluster DNS (nothing of the product resolves names: see box.py)."""


def test_helm_upgrade_rolls_every_component_while_claims_stay_bound(
    release: Release, box_api_client: client.ApiClient, team: str
) -> None:
    box = release.box
    core = client.CoreV1Api(box_api_client)
    custom = client.CustomObjectsApi(box_api_client)
    before = {c: {p.metadata.name for p in _product_pods(core, c)} for c in ("controller", "webhook", "agent")}
    assert all(before.values()), before
    bound = _bound(custom, team, "first")
    assert bound, "the claim of the previous test is not Bound"
    user_pod = core.read_namespaced_pod("first", team)
    # Users create pods all along the rollout: not one may be refused (issue 44: a replaced webhook replica
    # stopped at once while kube-proxy still sent it the API server's calls: "connection refused").
    creating = _CreatingPods(client.CoreV1Api(box_api_client), _pod("probe", box.runtime.image, "probe"))
    creating.start()
    try:
        # A value every pod template carries: the rollout replaces every pod of the product.
        upgraded = release.helm_run("upgrade", RELEASE, str(CHART), "-n", SYSTEM, "--reuse-values", "--set",
                                    "image.pullPolicy=Never", "--wait", "--timeout", INSTALL_TIMEOUT)  # fmt: skip
        assert upgraded.returncode == 0, f"helm upgrade failed:\n{upgraded.stderr}\n{diagnose(box)}"

        def rolled() -> bool:
            now = {c: _product_pods(core, c) for c in before}
            return all(pods and all(_ready(p) and p.metadata.name not in before[c] for p in pods)
                       for c, pods in now.items())  # fmt: skip

        _wait(rolled, "every product pod replaced and ready", explain=lambda: diagnose(box))
        creating.more(10)  # and a few after the last replaced replica went
    finally:
        creating.stop()
    assert creating.made >= 10, creating.made
    assert not creating.refused, f"{len(creating.refused)} of {creating.made + len(creating.refused)} pod" \
        f" creates refused while the webhook rolled: {creating.refused[:3]}\n{diagnose(box)}"
    for pod in _product_pods(core, "agent"):
        assert {c.image_pull_policy for c in pod.spec.containers} == {"Never"}
    # The bound claim kept its card, its pod its container.
    assert _binding(_bound(custom, team, "first")) == _binding(bound)
    still = core.read_namespaced_pod("first", team)
    assert still.metadata.uid == user_pod.metadata.uid and still.status.phase == "Running"
    assert [s.restart_count for s in still.status.container_statuses] == [0]
    # The upgraded product binds and injects: a new claim pod runs with its card.
    _, second = start_claim_pod(box, box_api_client, team, "second")
    assert _env(box, team, "second").get("NVIDIA_VISIBLE_DEVICES") == second["gpus"][0]
    assert not _refusals(core, team), _refusals(core, team)


def test_deleting_the_leader_hands_over_within_the_lease(release: Release, box_api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(box_api_client)

    def held_by_a_pod() -> tuple[str, int] | None:
        # After the upgrade's roll the Lease may still name a replaced pod for a moment.
        holder, duration = _lease_holder(box_api_client)
        pods = [p.metadata.name for p in _product_pods(core, "controller")
                if holder and holder.startswith(f"{p.metadata.name}_")]  # fmt: skip
        return (pods[0], duration) if pods else None

    leader, duration = _wait(held_by_a_pod, "a running controller pod holds the Lease")
    deleted = time.monotonic()
    # As `kubectl delete pod` does: the default grace period, the controller's own SIGTERM handling.
    core.delete_namespaced_pod(leader, SYSTEM)

    def handed_over() -> str | None:
        now, _ = _lease_holder(box_api_client)
        return now if now and not now.startswith(f"{leader}_") else None

    new_holder = _wait(handed_over, "another controller holds the Lease", timeout_s=duration + 30,
                       explain=lambda: diagnose(release.box))  # fmt: skip
    took = time.monotonic() - deleted
    print(f"\nLease {LEASE}: {leader} deleted, {new_holder} holds it after {took:.1f} s (duration {duration} s)")
    assert took <= duration + 5, f"hand-over took {took:.1f} s, the Lease's duration is {duration} s"


def _left_of(box: Box, objects: list[dict[str, Any]]) -> list[str]:
    """What is still there of the release's objects, of what the product made at run time (webhook
    configuration, Secret, Lease) and of the uninstall hook's own objects (deleted once it succeeded);
    only what every namespace has may stay."""
    left = []
    for doc in objects:
        kind, meta = doc["kind"], doc["metadata"]
        args = ["get", f"{kind}.{doc['apiVersion'].split('/')[0]}" if "/" in doc["apiVersion"] else kind,
                meta["name"], "--ignore-not-found", "-o", "name"]  # fmt: skip
        if meta.get("namespace") or kind not in CLUSTER_KINDS:
            args += ["-n", meta.get("namespace", SYSTEM)]
        found = _kubectl(box, *args)
        assert found.returncode == 0, (args, found.stderr)
        if found.stdout.strip():
            left.append(found.stdout.strip())
    swept = _kubectl(box, "get", ",".join(CLUSTER_SWEEP), "-o", "name")
    left += [line for line in swept.stdout.split() if "elasticgpu" in line]
    swept = _kubectl(box, "-n", SYSTEM, "get", ",".join(NAMESPACE_SWEEP), "-o", "name")
    assert swept.returncode == 0, swept.stderr
    return left + [line for line in swept.stdout.split() if line not in EVERY_NAMESPACE_HAS]


def test_helm_uninstall_leaves_no_object_of_the_product_and_no_finalizer(
    release: Release, box_api_client: client.ApiClient, team: str
) -> None:
    box = release.box
    manifest = release.helm_run("get", "manifest", RELEASE, "-n", SYSTEM)
    assert manifest.returncode == 0, manifest.stderr
    objects = [d for d in yaml.safe_load_all(manifest.stdout) if d]
    assert len(objects) > 20, len(objects)
    custom = client.CustomObjectsApi(box_api_client)
    claims_before = custom.list_namespaced_custom_object(*CUSTOM, team, names.PLURAL_CLAIM)["items"]
    assert {c["metadata"]["name"] for c in claims_before} >= {"first", "second"}
    uninstalled = release.helm_run("uninstall", RELEASE, "-n", SYSTEM, "--wait", "--timeout", "5m")
    assert uninstalled.returncode == 0, f"helm uninstall failed:\n{uninstalled.stderr}\n{diagnose(box)}"
    # The release's pods go after their owners, by the garbage collector (helm deletes in the background).
    left: list[str] = []

    def nothing_left() -> bool:
        left[:] = _left_of(box, objects)
        return not left

    with contextlib.suppress(AssertionError):
        _wait(nothing_left, "nothing of the product left", timeout_s=90)
    assert not left, f"left after helm uninstall: {left}"
    # The CRDs and the users' claims stay (Helm keeps crds/), with no finalizer of the product left...
    claims = custom.list_namespaced_custom_object(*CUSTOM, team, names.PLURAL_CLAIM)["items"]
    assert {c["metadata"]["name"] for c in claims} == {c["metadata"]["name"] for c in claims_before}
    own = (names.FINALIZER_CLAIM_PROTECTION, names.FINALIZER_EGPU_PROTECTION)
    egpus = custom.list_cluster_custom_object(*CUSTOM, names.PLURAL_ELASTIC_GPU)["items"]
    stuck = [o["metadata"]["name"] for o in claims + egpus if set(o["metadata"].get("finalizers") or []) & set(own)]
    assert not stuck, stuck
    # ...so deleting one completes with nobody to answer it.
    custom.delete_namespaced_custom_object(*CUSTOM, team, names.PLURAL_CLAIM, "second")

    def gone() -> bool:
        try:
            custom.get_namespaced_custom_object(*CUSTOM, team, names.PLURAL_CLAIM, "second")
        except client.ApiException as e:
            return e.status == 404
        return False

    _wait(gone, "the claim deleted after the uninstall", timeout_s=30)
    # Pods that name a claim are no longer refused: no webhook configuration is left to call nobody.
    core = client.CoreV1Api(box_api_client)
    core.create_namespaced_pod(team, _pod("after", box.runtime.image, "first"), dry_run="All")


CLUSTER_SWEEP = ("clusterroles", "clusterrolebindings", "validatingadmissionpolicies",
                 "validatingadmissionpolicybindings", "mutatingwebhookconfigurations", "priorityclasses")
NAMESPACE_SWEEP = ("pods", "deployments", "daemonsets", "replicasets", "services", "endpointslices", "configmaps",
                   "secrets", "serviceaccounts", "roles", "rolebindings", "leases", "poddisruptionbudgets", "jobs")
EVERY_NAMESPACE_HAS = {"configmap/kube-root-ca.crt", "serviceaccount/default"}
CLUSTER_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass",
                 "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingWebhookConfiguration",
                 "ValidatingWebhookConfiguration", names.KIND_CLASS, names.KIND_GPU,
                 names.KIND_ELASTIC_GPU}  # fmt: skip
"""Kinds of the release that are cluster-scoped (no -n for kubectl)."""


def test_the_namespace_helm_created_deletes_with_nothing_stuck(box: Box) -> None:
    """helm leaves the namespace of --create-namespace; deleting it completes (no object in it is held by
    a finalizer of the product)."""
    _delete_namespace(box)
    _wait(lambda: not _kubectl(box, "get", "namespace", SYSTEM, "--ignore-not-found", "-o", "name").stdout.strip(),
          f"namespace {SYSTEM} deleted", timeout_s=120, explain=lambda: diagnose(box))  # fmt: skip
