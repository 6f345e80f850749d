"""A fresh start lists only the claims that wait (`status.phase!=Bound`, the claim CRD's
selectableFields) before it binds; every claim is listed behind, with ElasticGPUs and pods (issue 49
item 2: the full claim list was ~25 s of the 39 s from start to first bind at 50,000 claims).

Against the test API server, through a client whose full lists of claims, ElasticGPUs and pods are
held until the test releases them (a loaded server's slow lists, made deterministic); the selected
list is not held. The old start listed every claim before its first bind: with the full claim list
held, nothing bound."""

from __future__ import annotations

import base64
import json
import logging
import threading
import urllib.request
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.machinery import waiting_claims
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller
from tests.controller.early_start_harness import DEADLINE_S, cards, phase, start_in_thread, stopped, wait

HELD_PLURALS = (names.PLURAL_CLAIM, names.PLURAL_ELASTIC_GPU, "pods")
CRD_PATH = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{names.PLURAL_CLAIM}.{names.GROUP}"


class HeldFullLists(KubeApi):
    """A client whose full lists of claims, ElasticGPUs and pods wait for `release` (at most 60 s);
    lists of the waiting claims (a field selector) pass, the first `fail_pages` of their pages
    after the first failing once with a 503 (a server gone midway)."""

    release: threading.Event
    holding: threading.Event
    fail_pages = 0
    fail_claim_lists = 0
    """Full claim lists to fail (503) before one works."""
    failed: list[str]

    def list_collection(self, path: str, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        if path.rsplit("/", 1)[-1] in HELD_PLURALS:
            if path.endswith(names.PLURAL_CLAIM) and self.fail_claim_lists > 0:
                self.fail_claim_lists -= 1
                raise errors.ApiUnavailable("the test server went away in the middle of the claim list", status=503)
            self.holding.set()
            self.release.wait(60.0)
        return super().list_collection(path, **kwargs)

    def list_page(self, path: str, **kwargs: Any) -> tuple[list[dict[str, Any]], str, str]:
        if kwargs.get("field_selector") and kwargs.get("token") and self.fail_pages > 0:
            self.fail_pages -= 1
            self.failed.append(str(kwargs["token"]))
            raise errors.ApiUnavailable("the test server went away in the middle of the list", status=503)
        return super().list_page(path, **kwargs)


def _start(kube_cluster: Any, namespace: str, *, fail_pages: int = 0,
           fail_claim_lists: int = 0) -> tuple[HeldFullLists, threading.Event, threading.Thread]:
    """A controller started as `elasticgpu controller` starts one, its held lists not released."""
    kube = HeldFullLists.from_kubeconfig(str(kube_cluster.kubeconfig))
    assert isinstance(kube, HeldFullLists)
    kube.release, kube.holding, kube.failed = threading.Event(), threading.Event(), []
    kube.fail_pages, kube.fail_claim_lists = fail_pages, fail_claim_lists
    stop, thread = start_in_thread(kube, namespace, name="waiting-claims-test")
    return kube, stop, thread


def _reserved(kube: KubeApi, cluster: Cluster, count: int) -> list[str]:
    return [a["elasticGPU"] for g in (kube.get_gpu(f"gpu-{cluster.prefix}-e{i}") for i in range(count))
            for a in (g.get("status") or {}).get("allocations") or []]


def _bind_one_earlier(kube: KubeApi, cluster: Cluster, class_name: str) -> dict[str, Any]:
    """A claim Bound by an earlier controller, with its ElasticGPU and reservation."""
    cluster.claim(o.claim("bound-before", cores=20, memory="1Gi", class_name=class_name))
    earlier = new_controller(kube, cluster.namespace)
    try:
        earlier.rebuild()
        earlier.drain()
    finally:
        earlier.close()
    assert phase(kube, cluster.namespace, "bound-before") == "Bound"
    return kube.get_claim(cluster.namespace, "bound-before")


def test_a_waiting_claim_binds_while_every_claim_is_still_listed_and_no_bound_one_moves(
        kube_cluster: Any, cluster: Cluster, kube: KubeApi) -> None:
    ns = cluster.namespace
    class_name = cards(cluster)
    bound = _bind_one_earlier(kube, cluster, class_name)
    egpu_name = bound["spec"]["elasticGPUName"]
    egpu_version = kube.get_elastic_gpu(egpu_name)["metadata"]["resourceVersion"]
    cluster.claim(o.claim("made-before-start", cores=10, memory="1Gi", class_name=class_name))
    held, stop, thread = _start(kube_cluster, ns)
    try:
        assert held.holding.wait(DEADLINE_S), "the controller never listed every claim, ElasticGPU or pod"
        cluster.claim(o.claim("new-at-start", cores=10, memory="1Gi", class_name=class_name))
        for name in ("made-before-start", "new-at-start"):
            assert wait(lambda name=name: phase(kube, ns, name) == "Bound"), (
                f"the new claim {name} is {phase(kube, ns, name)} with the full claim list still held: it waited"
                " for every claim")
        # The Bound claim is not in the picture yet: nothing may have been written to it or its ElasticGPU.
        assert kube.get_claim(ns, "bound-before")["metadata"]["resourceVersion"] == bound["metadata"]["resourceVersion"]
        assert kube.get_elastic_gpu(egpu_name)["metadata"]["resourceVersion"] == egpu_version
        assert egpu_name in _reserved(kube, cluster, 2)  # not freed as an orphan
        held.release.set()
        # The whole picture: the Bound claim taken in, every reservation once.
        cluster.claim(o.claim("after-the-gate", cores=10, memory="1Gi", class_name=class_name))
        assert wait(lambda: phase(kube, ns, "after-the-gate") == "Bound"), phase(kube, ns, "after-the-gate")
        reserved = _reserved(kube, cluster, 2)
        assert len(reserved) == len(set(reserved)) == 4, f"a reservation doubled or lost: {reserved}"
        assert kube.get_claim(ns, "bound-before")["status"]["phase"] == "Bound"
    finally:
        held.release.set()
        stopped(stop, thread)


def _five_waiting_claims(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[str]]:
    """A class on fresh cards and five claims of it waiting, listed two to a page (three pages)."""
    class_name = cards(cluster)
    monkeypatch.setattr(waiting_claims, "PAGE_SIZE", 2)
    made = [f"waiting-{i}" for i in range(5)]
    for name in made:
        cluster.claim(o.claim(name, cores=10, memory="1Gi", class_name=class_name))
    return class_name, made


def test_the_waiting_list_failing_midway_resumes_and_binds_each_claim_once(
        kube_cluster: Any, cluster: Cluster, kube: KubeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = cluster.namespace
    _, made = _five_waiting_claims(cluster, monkeypatch)
    # The second page fails twice, then is asked again with its token.
    held, stop, thread = _start(kube_cluster, ns, fail_pages=2)
    try:
        for name in made:
            assert wait(lambda name=name: phase(kube, ns, name) == "Bound"), (
                f"{name} is {phase(kube, ns, name)} with the full claim list held (failed pages: {held.failed})")
        assert len(held.failed) == 2 and len(set(held.failed)) == 1, held.failed
        held.release.set()
        reserved = _reserved(kube, cluster, 2)
        assert len(reserved) == len(set(reserved)) == len(made), f"a reservation doubled or lost: {reserved}"
    finally:
        held.release.set()
        stopped(stop, thread)


class CompactedMidway(HeldFullLists):
    """A `HeldFullLists` whose waiting list's first continued page comes after a new waiting claim
    (`made_midway`) and an etcd compaction at the newest revision, and continues from a revision
    the compaction removed: the server answers 410 Gone for real ("The provided continue parameter
    is too old"). The token keeps its place and gets an older revision because the API server
    (1.34+) continues a list from its watch cache's snapshots, which an etcd compaction made from
    here does not reach before the server's own compaction (every 5 minutes). `answers`: the
    status of each continued page."""

    etcd_url: str
    made_midway: Any
    answers: list[int]

    def list_page(self, path: str, **kwargs: Any) -> tuple[list[dict[str, Any]], str, str]:
        if not (kwargs.get("field_selector") and kwargs.get("token")):
            return super().list_page(path, **kwargs)
        if not self.answers:
            self.made_midway()
            _compact(self.etcd_url)
            kwargs["token"] = _expired(str(kwargs["token"]))
        try:
            page = super().list_page(path, **kwargs)
        except errors.ApiError as err:
            self.answers.append(err.status)
            raise
        self.answers.append(200)
        return page


def _expired(token: str) -> str:
    """`token` continuing from revision 1 (compacted): the same place in the list, a snapshot gone."""
    fields = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    fields["rv"] = 1
    return base64.urlsafe_b64encode(json.dumps(fields).encode()).decode().rstrip("=")


def _etcd(url: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/v3/{method}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:  # etcd's JSON gateway
        result: dict[str, Any] = json.load(answer)
    return result


def _compact(url: str) -> None:
    """Compact etcd at its newest revision (what the API server does every 5 minutes)."""
    revision = int(_etcd(url, "kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    _etcd(url, "kv/compaction", {"revision": revision, "physical": True})


def test_a_continue_token_expired_midway_lists_again_and_binds_each_claim_once(
        kube_cluster: Any, cluster: Cluster, kube: KubeApi, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    if not kube_cluster.etcd_url:
        pytest.skip("an external cluster: its etcd cannot be compacted from here")
    ns = cluster.namespace
    class_name, made = _five_waiting_claims(cluster, monkeypatch)
    kube_api = CompactedMidway.from_kubeconfig(str(kube_cluster.kubeconfig))
    assert isinstance(kube_api, CompactedMidway)
    kube_api.release, kube_api.holding, kube_api.failed, kube_api.answers = (
        threading.Event(), threading.Event(), [], [])
    kube_api.etcd_url = kube_cluster.etcd_url
    caplog.set_level(logging.INFO, logger=waiting_claims.__name__)
    kube_api.made_midway = lambda: cluster.claim(o.claim("made-midway", cores=10, memory="1Gi",
                                                         class_name=class_name))
    stop, thread = start_in_thread(kube_api, ns, name="waiting-claims-410-test")
    made.append("made-midway")
    try:
        for name in made:
            assert wait(lambda name=name: phase(kube, ns, name) == "Bound"), (
                f"{name} is {phase(kube, ns, name)} with the full claim list held (continued pages:"
                f" {kube_api.answers})")
        # One 410, then the list from the top: six waiting claims, two continued pages.
        assert kube_api.answers == [410, 200, 200], f"continued pages: {kube_api.answers}"
        said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == waiting_claims.__name__]
        assert len(said) == 1 and said[0][0] == logging.INFO and "from the top" in said[0][1], (
            f"an expired list is no failure, and says it starts over: {said}")
        kube_api.release.set()
        reserved = _reserved(kube, cluster, 2)
        assert len(reserved) == len(set(reserved)) == len(made), f"a reservation doubled or lost: {reserved}"
    finally:
        kube_api.release.set()
        stopped(stop, thread)


def _selector_answers(kube: KubeApi, ns: str) -> int:
    try:
        kube.list_page(kube.collection_path("claim", ns), field_selector=waiting_claims.SELECTOR)
    except errors.Rejected:
        return 400
    except errors.ApiUnavailable as err:  # 429 "storage is (re)initializing" right after the CRD changed
        return err.status
    return 200


def _replace_claim_crd(kube: KubeApi, ns: str, selectable: bool) -> None:
    """The claim CRD with or without its selectableFields, once the server serves it so."""
    crd = kube._call("GET", CRD_PATH)
    for version in crd["spec"]["versions"]:
        if selectable:
            version["selectableFields"] = [{"jsonPath": ".status.phase"}]
        else:
            version.pop("selectableFields", None)
    kube._call("PUT", CRD_PATH, body=crd)
    want = 200 if selectable else 400
    assert wait(lambda: _selector_answers(kube, ns) == want), f"the server still answers the selector with not {want}"


def test_a_server_that_cannot_select_lists_every_claim_first_said_once(
        kube_cluster: Any, cluster: Cluster, kube: KubeApi, caplog: pytest.LogCaptureFixture) -> None:
    ns = cluster.namespace
    class_name = cards(cluster)
    _bind_one_earlier(kube, cluster, class_name)
    cluster.claim(o.claim("made-before-start", cores=10, memory="1Gi", class_name=class_name))
    _replace_claim_crd(kube, ns, selectable=False)
    try:
        caplog.set_level(logging.INFO, logger=waiting_claims.__name__)
        # The first full list fails: the start lists again, and the selector is not asked (nor said) twice.
        held, stop, thread = _start(kube_cluster, ns, fail_claim_lists=1)
        try:
            # Every claim is listed in the early phase (released for it: that is the fallback), then
            # the waiting one binds while ElasticGPUs and pods are still held.
            assert held.holding.wait(DEADLINE_S), "the controller never listed the claims"
            held.release.set()
            assert wait(lambda: phase(kube, ns, "made-before-start") == "Bound"), (
                phase(kube, ns, "made-before-start"))
            said = [r for r in caplog.records if r.getMessage().startswith(waiting_claims.FALLBACK)]
            assert len(said) == 1, [r.getMessage() for r in said]
            assert said[0].levelno == logging.INFO and "field label not supported" in said[0].getMessage(), (
                said[0].getMessage())
            reserved = _reserved(kube, cluster, 2)
            assert len(reserved) == len(set(reserved)) == 2, f"a reservation doubled or lost: {reserved}"
        finally:
            held.release.set()
            stopped(stop, thread)
    finally:
        _replace_claim_crd(kube, ns, selectable=True)
