"""Existing GPU workloads run unchanged (issue 45, item 2): the published manifests of real projects
(tests/realcluster/manifests/: vLLM's Deployment, a KubeRay worker pod, a JupyterHub single-user pod of a
GPU profile, HAMi's examples, the device plugin's time-slicing Deployment), as they ask `nvidia.com/gpu`
(HAMi: with `gpumem`, `gpumem-percentage`, `gpucores`; time-slicing: `nvidia.com/gpu.shared`), applied in a
namespace that opted in (`elasticgpu.io/translate-resources: "true"`) on the box with the chart installed as
pods and `translation.enabled=true`.

Each workload reaches Running with the cards its request means (whole cards for `nvidia.com/gpu: N`, a share
of one card for HAMi's fractions, a quarter of a card per time-slicing replica) and nobody else's: its
container sees exactly its claim's card, a whole card serves no other claim, and no card holds more than it
has. A Deployment scaled to 3 gets three claims on three cards and gives them back when scaled to 1 and to
0. A namespace without the label is untouched: its pod keeps its `nvidia.com/gpu` and stays Pending, as on a
cluster without elasticgpu. HAMi's "a slice on each of two cards" has no translation and is refused at
create, naming the container.

Skips (naming what to build) without the box, helm or the product image; skips when the chart has no
`translation` values (a checkout without the webhook translation)."""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from elasticgpu.api import names, pod_claims
from elasticgpu.api.quantities import parse_memory_mib
from elasticgpu.demo.chart import chart_values
from tests.helm_binary import helm_or_skip
from tests.kube_cluster import RawResponse, find_kubectl, kube_request
from tests.product_image import ImageUnavailable, ProductImage, import_image, this_checkouts_image
from tests.realcluster import box as chart_box
from tests.realcluster.box import Box
from tests.realcluster.test_helm_install import CHART, INSTALL_TIMEOUT, RELEASE, SYSTEM, Release, diagnose

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(900)]
"""The first test also pays the fixtures (box, helm install; this checkout's image: scripts/test.sh builds it before the
run, a cold build here alone can take most of the run's hard limit of 960 s on a busy machine)."""

MANIFESTS = Path(__file__).resolve().parent / "manifests"
TEST_IMAGE = "TEST_IMAGE"
"""What the manifests say in place of their published image; the test writes the box's image there."""
CARDS = 10
CARD_MIB = 81920
SIMULATION = (
    f"driver: {{version: 550.54.15, cuda: '12.4'}}\n"
    f"cards: [{{model: A100, memory: {CARD_MIB}, numa: 0, count: {CARDS}}}]\n"
)
"""Ten cards: every manifest of the first test at once (six cards) and the scaled Deployment's three."""
WITHIN_S = 240.0
LABEL_TRANSLATE = "elasticgpu.io/translate-resources"
ANNOTATION_TRANSLATED = "elasticgpu.io/translated"
CUSTOM = (names.GROUP, names.VERSION)
GPU_RESOURCE_PREFIX = "nvidia.com/"


# What each manifest's GPU containers must get: (pod name prefix, container) -> (cards, cores, memory MiB);
# cards = whole cards (cores 100 each); cards 0 = a share of one card.
WHOLE = (1, 100, None)
EXPECTED: dict[str, dict[tuple[str, str], tuple[int, int | None, int | None]]] = {
    "vllm-deployment.yaml": {("mistral-7b-", "mistral-7b"): WHOLE},
    "kuberay-worker-pod.yaml": {("raycluster-worker-small-group-", "machine-learning"): WHOLE},
    "jupyterhub-singleuser-pod.yaml": {("jupyter-jovyan", "notebook"): WHOLE},
    # HAMi: gpumem-percentage of the card (A100 80 GiB), gpucores as percent of its compute.
    "hami-sharing-pods.yaml": {("gpu-pod1", "ubuntu-container"): (0, 60, CARD_MIB * 40 // 100),
                               ("gpu-pod2", "ubuntu-container"): (0, 40, CARD_MIB * 60 // 100)},
    # HAMi: 3000 MiB of one card and no cores named: a best-effort share (no compute reserved).
    "hami-memory-deployment.yaml": {("cuda-sample-vector-add-", "cuda-sample-vector-add"): (0, None, 3000)},
    # The chart's table: one time-slicing replica is 25% of a card (memory in proportion), five replicas.
    "time-slicing-deployment.yaml": {("time-slicing-verification-", "cuda-sample-vector-add"):
                                     (0, 25, CARD_MIB // 4)},
}  # fmt: skip
PODS_OF = {"hami-sharing-pods.yaml": 2, "time-slicing-deployment.yaml": 5}
"""Pods a manifest makes (1 where not named)."""


def load(name: str, image: str) -> list[dict[str, Any]]:
    """The documents of manifest `name`, the test's image written where they say TEST_IMAGE (the node pulls
    nothing: imagePullPolicy Never)."""
    documents = [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]
    for doc in documents:
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc.get("spec", {})
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            assert container["image"] == TEST_IMAGE, f"{name}: container {container['name']} names another image"
            container["image"], container["imagePullPolicy"] = image, "Never"
    return documents


PLURALS = {"Pod": ("api/v1", "pods"), "Secret": ("api/v1", "secrets"), "Deployment": ("apis/apps/v1", "deployments")}


def create(api: client.ApiClient, namespace: str, doc: dict[str, Any], *, dry_run: bool = False) -> RawResponse:
    """POST one document into `namespace` as kubectl sends it (the YAML's numbers stay numbers: `nvidia.com/gpu: 1`
    is the published form, which the API server reads as a quantity); any status."""
    group, plural = PLURALS[doc["kind"]]
    return kube_request(api, "POST", f"/{group}/namespaces/{namespace}/{plural}", body=doc,
                        query=[("dryRun", "All")] if dry_run else None)  # fmt: skip


def apply(api: client.ApiClient, namespace: str, documents: list[dict[str, Any]], box: Box) -> None:
    """Create each document in `namespace`, as `kubectl apply -f` does for new objects (no retry: a user's
    `kubectl apply` that the webhook fails is a failure here too)."""
    for doc in documents:
        made = create(api, namespace, doc)
        assert made.status == 201, \
            f"{doc['kind']} {doc['metadata']['name']}: HTTP {made.status}: {made.body[:1000]!r}\n{diagnose(box)}"


def _wait(check: Callable[[], Any], what: str, *, timeout_s: float = WITHIN_S, explain: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        if result := check():
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s\n{explain()}")
        time.sleep(1)


def _kubectl(box: Box, *args: str) -> str:
    import subprocess

    kubectl = find_kubectl()
    if kubectl is None:
        pytest.skip("kubectl not found: run `bash testserver/build.sh` (it unpacks one) or set ELASTICGPU_KUBECTL_BIN")
    done = subprocess.run([str(kubectl), "--kubeconfig", str(box.kubeconfig), *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


def _env(box: Box, namespace: str, pod: str, container: str) -> dict[str, str]:
    out = _kubectl(box, "-n", namespace, "exec", pod, "-c", container, "--", "env")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _chart_translates() -> bool:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return isinstance(values.get("translation"), dict) and "enabled" in values["translation"]


def _wait_namespace_gone(core: client.CoreV1Api, name: str) -> None:
    """A namespace of an earlier module's release may still be terminating: helm cannot install into it."""

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except client.ApiException as e:
            return e.status == 404
        return False

    _wait(gone, f"namespace {name} of an earlier release deleted", timeout_s=180)


@pytest.fixture(scope="module")
def translating_image() -> ProductImage:
    """This checkout's product image, got before the box starts (a build when the code changed takes minutes: past
    the run's hard limit, a box already started would be left behind); skips when a prerequisite is missing."""
    if not _chart_translates():
        pytest.skip("deploy/chart/values.yaml has no `translation` values: this checkout has no webhook translation "
                    "of device-plugin resources (issue 45)")  # fmt: skip
    chart_box.skip_unless_the_chart_can_run()
    try:
        return this_checkouts_image()
    except ImageUnavailable as e:
        pytest.skip(f"no product image: {e}")


@pytest.fixture(scope="module")
def translating(translating_image: ProductImage, box: Box, box_api_client: client.ApiClient) -> Iterator[Release]:
    """The chart installed with `translation.enabled=true` (the rest as test_helm_install.py installs it), on a
    node of ten simulated cards."""
    helm = helm_or_skip()
    image = translating_image
    core = client.CoreV1Api(box_api_client)
    _wait_namespace_gone(core, SYSTEM)
    import_image(image, ctr=box.runtime.ctr, address=box.runtime.socket)
    core.patch_node(box.node, {"metadata": {"labels": {"nvidia.com/gpu.present": "true",
                                                       "elasticgpu.io/agent": "true"}}})  # fmt: skip
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="egtranslate-", dir="/tmp")))
        values = chart_values(box.runtime, home, SIMULATION)
        values["translation"] = {"enabled": True}
        values_file = home / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        running = Release(helm, box, image, values_file, {"KUBECONFIG": str(box.kubeconfig)})
        stack.callback(_uninstall, running)
        installed = running.helm_run("install", RELEASE, str(CHART), "-n", SYSTEM, "--create-namespace",
                                     "-f", str(values_file), "--wait", "--timeout", INSTALL_TIMEOUT)  # fmt: skip
        assert installed.returncode == 0, f"helm install failed:\n{installed.stderr}\n{diagnose(box)}"
        _wait(lambda: _cards_published(box_api_client), f"the agent publishes the node's {CARDS} cards",
              explain=lambda: diagnose(box))  # fmt: skip
        yield running


def _uninstall(release: Release) -> None:
    if release.helm_run("status", RELEASE, "-n", SYSTEM).returncode == 0:
        release.helm_run("uninstall", RELEASE, "-n", SYSTEM, "--wait", "--timeout", "3m")
    with contextlib.suppress(AssertionError):
        _kubectl(release.box, "delete", "namespace", SYSTEM, "--ignore-not-found", "--wait=false")


def _cards_published(api: client.ApiClient) -> bool:
    gpus = client.CustomObjectsApi(api).list_cluster_custom_object(*CUSTOM, names.PLURAL_GPU)["items"]
    return len(gpus) >= CARDS


@contextlib.contextmanager
def team(api: client.ApiClient, *, translate: bool) -> Iterator[str]:
    """A namespace of the users', opted in to translation or not; deleted at the end (its claims go with it)."""
    core = client.CoreV1Api(api)
    name = f"{'migrated' if translate else 'untouched'}-{uuid.uuid4().hex[:6]}"
    labels = {LABEL_TRANSLATE: "true"} if translate else {}
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)


def _webhook_translates(api: client.ApiClient, namespace: str, image: str) -> bool:
    """A dry-run create of HAMi's first pod comes back translated (False while the webhook is not reached yet:
    the API server refuses the pod, or kube-proxy has not programmed the Service)."""
    (pod, _) = load("hami-sharing-pods.yaml", image)
    made = create(api, namespace, pod, dry_run=True)
    return made.status == 201 and ANNOTATION_TRANSLATED in (made.json()["metadata"].get("annotations") or {})


def _until_the_webhook_translates(api: client.ApiClient, namespace: str, box: Box) -> None:
    """helm's --wait sees the webhook's pods Ready; the API server reaches them once kube-proxy has programmed the
    Service (a moment later, as in any cluster)."""
    _wait(lambda: _webhook_translates(api, namespace, box.runtime.image), "the chart's webhook translates a pod",
          timeout_s=90, explain=lambda: diagnose(box))  # fmt: skip


def test_every_manifest_names_its_source_and_asks_what_the_tests_expect() -> None:
    """The test data as the tests read it (no cluster): a first line naming where the file came from, the test
    image in every container, and the GPU resources each expected container asks."""
    files = sorted(p.name for p in MANIFESTS.glob("*.yaml"))
    assert set(EXPECTED) | {"hami-two-cards-refused.yaml"} == set(files), files
    for name in files:
        first = (MANIFESTS / name).read_text().splitlines()[0]
        assert first.startswith("# From ") and ("commit " in first or "https://" in first), (name, first)
        documents = load(name, "busybox:test")
        for (_, container), (cards, _, _) in EXPECTED.get(name, {}).items():
            asked = _asked(documents, container)
            assert asked and all(a.startswith(GPU_RESOURCE_PREFIX) for a in asked), (name, container, asked)
            # A whole card is asked as `nvidia.com/gpu` alone; a share names a fraction or a time-sliced replica.
            assert (asked == {names.RESOURCE_NVIDIA_GPU}) == bool(cards), (name, container, asked)


# --- what a pod got ---


def _pods(core: client.CoreV1Api, namespace: str, prefix: str) -> list[Any]:
    return [p for p in core.list_namespaced_pod(namespace).items
            if p.metadata.name.startswith(prefix) and p.metadata.deletion_timestamp is None]  # fmt: skip


def _claim_status(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        claim = custom.get_namespaced_custom_object(*CUSTOM, namespace, names.PLURAL_CLAIM, name)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
    status = claim.get("status") or {}
    return status if status.get("phase") == "Bound" else None


def _size(status: dict[str, Any]) -> tuple[int, int | None, int]:
    """(whole cards, cores, memory MiB) of a Bound claim."""
    allocated = status.get("allocatedResources") or status.get("capacity") or {}
    cards = int(allocated.get(names.RESOURCE_NVIDIA_GPU, 0))
    cores = allocated.get(names.RESOURCE_CORE)
    memory = parse_memory_mib(allocated.get(names.RESOURCE_MEMORY, 0), field="status.allocatedResources")
    return cards, None if cores is None else int(cores), memory


def _check_translated(pod: Any, container: str, asked: set[str]) -> str:
    """The pod's record of its translation names what the container asked, its request annotation is there, and
    the container asks no GPU extended resource any more; returns the container's claim name."""
    annotations = pod.metadata.annotations or {}
    assert ANNOTATION_TRANSLATED in annotations, (pod.metadata.name, annotations)
    record = json.loads(annotations[ANNOTATION_TRANSLATED])
    assert container in record, (pod.metadata.name, record)
    written = json.dumps(record[container])
    assert all(name in written for name in asked), (pod.metadata.name, asked, record)
    assert names.inline_request_annotation(container) in annotations, (pod.metadata.name, annotations)
    spec = next(c for c in pod.spec.containers if c.name == container)
    left = {**(spec.resources.limits or {}), **(spec.resources.requests or {})}
    assert not [r for r in left if r.startswith(GPU_RESOURCE_PREFIX)], (pod.metadata.name, left)
    return pod_claims.inline_claim_name(pod.metadata.name, container)


def _asked(documents: list[dict[str, Any]], container: str) -> set[str]:
    for doc in documents:
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc.get("spec", {})
        for c in spec.get("containers", []):
            if c["name"] == container:
                resources = c.get("resources", {})
                return {r for part in ("limits", "requests") for r in resources.get(part, {})
                        if r.startswith(GPU_RESOURCE_PREFIX)}  # fmt: skip
    raise AssertionError(f"no container {container}")


def _running(core: client.CoreV1Api, namespace: str, prefix: str, count: int, box: Box) -> list[Any]:
    def running() -> list[Any] | None:
        pods = _pods(core, namespace, prefix)
        return pods if len(pods) == count and all(p.status.phase == "Running" for p in pods) else None

    return _wait(running, f"{count} pod(s) {namespace}/{prefix}* Running",  # type: ignore[no-any-return]
                 explain=lambda: diagnose(box) + _kubectl(box, "-n", namespace, "get", "pods,events"))  # fmt: skip


def _allocations(api: client.ApiClient) -> dict[str, list[tuple[str, int, int, bool]]]:
    """Card uuid -> its reservations (namespace/claim, cores, memory MiB, exclusive), from the GPU objects' status."""
    out: dict[str, list[tuple[str, int, int, bool]]] = {}
    for gpu in client.CustomObjectsApi(api).list_cluster_custom_object(*CUSTOM, names.PLURAL_GPU)["items"]:
        held = []
        for allocation in (gpu.get("status") or {}).get("allocations") or []:
            ref = allocation.get("claimRef") or {}
            held.append((f"{ref.get('namespace', '')}/{ref.get('name', '')}", int(allocation.get("cores", 0)),
                         int(allocation.get("memory", 0)), bool(allocation.get("exclusive"))))  # fmt: skip
        out[gpu["spec"]["uuid"]] = held
    return out


def test_each_published_manifest_runs_with_the_cards_its_request_means_and_nobody_elses(
    translating: Release, box_api_client: client.ApiClient
) -> None:
    box = translating.box
    core, custom = client.CoreV1Api(box_api_client), client.CustomObjectsApi(box_api_client)
    with team(box_api_client, translate=True) as namespace:
        _until_the_webhook_translates(box_api_client, namespace, box)
        documents = {name: load(name, box.runtime.image) for name in EXPECTED}
        for docs in documents.values():
            apply(box_api_client, namespace, docs, box)
        claims: dict[str, tuple[str, str, str, tuple[int, int | None, int | None]]] = {}  # claim -> pod, ctr, file
        for name, expected in EXPECTED.items():
            for (prefix, container), size in expected.items():
                count = PODS_OF.get(name, 1) if len(expected) == 1 else 1
                for pod in _running(core, namespace, prefix, count, box):
                    claim = _check_translated(pod, container, _asked(documents[name], container))
                    claims[claim] = (pod.metadata.name, container, name, size)
        bound = {claim: _wait(lambda c=claim: _claim_status(custom, namespace, c), f"claim {namespace}/{claim} Bound")
                 for claim in claims}  # fmt: skip
        cards_of: dict[str, set[str]] = {}
        for claim, (pod, container, name, (cards, cores, memory)) in claims.items():
            status = bound[claim]
            got_cards, got_cores, got_memory = _size(status)
            where = f"{name}: pod {pod} container {container} (claim {claim}: {status.get('allocatedResources')})"
            if cards:
                assert (got_cards, got_cores, len(status["gpus"])) == (cards, 100 * cards, cards), where
            else:
                assert got_cards == 0 and len(status["gpus"]) == 1, where
                assert got_cores == cores, where
            if memory is not None:
                assert got_memory == memory, where
            # The container sees its claim's cards, and only those.
            seen = _env(box, namespace, pod, container).get("NVIDIA_VISIBLE_DEVICES", "")
            assert sorted(seen.split(",")) == sorted(status["gpus"]), (where, seen)
            cards_of[claim] = set(status["gpus"])
        # Nobody else's: a whole card serves its claim alone; no card holds more cores or memory than it has.
        for claim, (_, _, name, (cards, _, _)) in claims.items():
            if cards:
                others = [c for c, held in cards_of.items() if c != claim and held & cards_of[claim]]
                assert not others, f"{name}: the whole card of {claim} also serves {others}"
        for card, held in _allocations(box_api_client).items():
            assert sum(h[1] for h in held) <= 100 and sum(h[2] for h in held) <= CARD_MIB, (card, held)
            assert not any(h[3] for h in held) or len(held) == 1, f"card {card} reserved whole and shared: {held}"
        # HAMi's two pods "could share the same GPU": 60% + 40% of cores and 40% + 60% of memory fit one card.
        hami = [cards_of[c] for c, v in claims.items() if v[2] == "hami-sharing-pods.yaml"]
        assert len(hami) == 2, claims


def test_a_deployment_scaled_to_three_gets_three_claims_and_gives_them_back(
    translating: Release, box_api_client: client.ApiClient
) -> None:
    box = translating.box
    core, apps = client.CoreV1Api(box_api_client), client.AppsV1Api(box_api_client)
    custom = client.CustomObjectsApi(box_api_client)
    prefix, container = "mistral-7b-", "mistral-7b"

    def claims_in(namespace: str) -> list[dict[str, Any]]:
        items = custom.list_namespaced_custom_object(*CUSTOM, namespace, names.PLURAL_CLAIM)["items"]
        return [c for c in items if not c["metadata"].get("deletionTimestamp")]

    def reserved_for(namespace: str) -> set[str]:
        return {claim for held in _allocations(box_api_client).values() for claim, *_ in held
                if claim.startswith(f"{namespace}/")}  # fmt: skip

    with team(box_api_client, translate=True) as namespace:
        _until_the_webhook_translates(box_api_client, namespace, box)
        apply(box_api_client, namespace, load("vllm-deployment.yaml", box.runtime.image), box)
        _running(core, namespace, prefix, 1, box)
        apps.patch_namespaced_deployment_scale("mistral-7b", namespace, {"spec": {"replicas": 3}})
        pods = _running(core, namespace, prefix, 3, box)
        wanted = {_check_translated(p, container, {names.RESOURCE_NVIDIA_GPU}) for p in pods}
        bound = {c: _wait(lambda c=c: _claim_status(custom, namespace, c), f"claim {c} Bound") for c in wanted}
        cards = [card for status in bound.values() for card in status["gpus"]]
        assert len(cards) == len(set(cards)) == 3, bound  # three replicas, three cards, one each
        for count in (1, 0):
            apps.patch_namespaced_deployment_scale("mistral-7b", namespace, {"spec": {"replicas": count}})
            if count:
                _running(core, namespace, prefix, count, box)
            else:
                _wait(lambda: not _pods(core, namespace, prefix), "every replica gone")
            # The claims of the replicas that went are deleted with them and their cards are free again.
            _wait(lambda n=count: len(claims_in(namespace)) == n and len(reserved_for(namespace)) == n,
                  f"{count} claim(s) and reservation(s) left after scaling to {count}",
                  explain=lambda: f"claims {[c['metadata']['name'] for c in claims_in(namespace)]}, "
                                  f"reserved {reserved_for(namespace)}")  # fmt: skip


def test_a_namespace_without_the_label_is_untouched(translating: Release, box_api_client: client.ApiClient) -> None:
    box = translating.box
    core = client.CoreV1Api(box_api_client)
    with team(box_api_client, translate=False) as namespace:
        (pod,) = load("jupyterhub-singleuser-pod.yaml", box.runtime.image)
        response = create(box_api_client, namespace, pod)
        assert response.status == 201, response.body
        made = response.json()
        annotations = made["metadata"].get("annotations") or {}
        assert ANNOTATION_TRANSLATED not in annotations and not pod_claims.has_claim_annotations(annotations), \
            annotations  # fmt: skip
        assert not made["spec"].get("schedulingGates"), made["spec"]
        (notebook,) = made["spec"]["containers"]
        assert notebook["resources"]["limits"].get(names.RESOURCE_NVIDIA_GPU) == "1", notebook["resources"]
        # As written for the device plugin: no node offers nvidia.com/gpu, so the scheduler keeps it Pending.

        def unschedulable() -> str | None:
            now = core.read_namespaced_pod(made["metadata"]["name"], namespace)
            assert now.status.phase == "Pending", now.status
            for condition in now.status.conditions or []:
                if condition.type == "PodScheduled" and condition.status == "False":
                    return str(condition.message)
            return None

        message = _wait(unschedulable, "the scheduler says why the pod waits", timeout_s=120)
        assert names.RESOURCE_NVIDIA_GPU in message, message
        assert not client.CustomObjectsApi(box_api_client).list_namespaced_custom_object(
            *CUSTOM, namespace, names.PLURAL_CLAIM)["items"]  # fmt: skip


def test_hamis_slice_on_each_of_two_cards_is_refused_at_create(
    translating: Release, box_api_client: client.ApiClient
) -> None:
    box = translating.box
    core = client.CoreV1Api(box_api_client)
    with team(box_api_client, translate=True) as namespace:
        _until_the_webhook_translates(box_api_client, namespace, box)
        (pod,) = load("hami-two-cards-refused.yaml", box.runtime.image)
        refused = create(box_api_client, namespace, pod)
        assert 400 <= refused.status < 500, (refused.status, refused.body)
        body = refused.body.decode(errors="replace") if isinstance(refused.body, bytes) else str(refused.body)
        # The message names the container and the resources, so the author knows what to change.
        assert "ubuntu-container" in body and "nvidia.com/gpu" in body, body
        assert not _pods(core, namespace, "gpu-pod")
