"""Watches and lists against a server that goes away. A watch whose connection breaks resumes
from the resourceVersion it had reached: no event is lost and nothing is listed again (a list
queues every object); a half-open one is given up after its read timeout; start-up lists each
kind once; an outage is said once when it starts and once when it ends; missing CRDs are waited
for. The breaks are real: the controller talks to the API server through a TCP relay that cuts,
silences or refuses connections, as a restarting server or a vanished peer does."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller import errors, run_controller
from elasticgpu.controller.decisions import binder
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.starting import first_list
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller
from tests.controller.relay import Relay, relayed

__all__ = ["relayed"]  # the fixture

INFORMER = "elasticgpu.controller.flow.machinery.informer"


def _wait(condition: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_broken_watch_resumes_without_listing_again(cluster: Cluster, kube: KubeApi,
                                                       relayed: tuple[KubeApi, Relay]) -> None:
    api, relay = relayed
    lists: list[str] = []
    list_collection = api.list_collection

    def counted(path: str) -> tuple[list[dict[str, Any]], str]:
        lists.append(path)
        return list_collection(path)

    api.list_collection = counted  # type: ignore[method-assign]
    controller = new_controller(api, cluster.namespace)
    stop = threading.Event()
    thread = threading.Thread(target=controller.informer.watch_kind, args=("claim", stop),
                              kwargs={"timeout_s": 300}, daemon=True)
    thread.start()
    try:
        cluster.claim(o.claim("before", cores=10, memory="1Gi"))
        assert _wait(lambda: controller.claim(cluster.namespace, "before") is not None)

        relay.cut()  # the watch's connection dies under it
        cluster.claim(o.claim("during", cores=10, memory="1Gi"))  # created while it is down
        assert _wait(lambda: controller.claim(cluster.namespace, "during") is not None)
        cluster.claim(o.claim("after", cores=10, memory="1Gi"))
        assert _wait(lambda: controller.claim(cluster.namespace, "after") is not None)
        assert lists == [api.collection_path("claim", cluster.namespace)], "the watch listed again"
    finally:
        stop.set()
        relay.cut()
        thread.join(timeout=10)


@pytest.mark.parametrize("kind", ["claim", "egpu", "gpu", "pod"])
def test_a_watch_that_lists_again_takes_in_the_deletions_it_missed(
        cluster: Cluster, kube: KubeApi, relayed: tuple[KubeApi, Relay], kind: str, api_client: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """A watch that cannot resume from its resourceVersion (a 410, or `RELIST_AFTER_FAILURES`
    failures in a row) starts over with a list: what was deleted meanwhile is gone from the
    picture at once, not only at the next full relist (minutes later, with the capacity of a
    deleted claim's ElasticGPU held until then). A pod deleted meanwhile no longer uses its claim
    (taken in at the list's resourceVersion: at the version the picture held it was refused as not
    newer, and its claim stayed in use)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    api, relay = relayed
    controller = new_controller(api, cluster.namespace)
    picture = controller.picture
    prefix = cluster.prefix
    for index, name in enumerate(("gone", "kept")):
        if kind == "claim":
            cluster.claim(o.claim(name, cores=10, memory="1Gi"))
        elif kind == "egpu":
            cluster.egpu(o.share_egpu(f"egpu-{prefix}-{name}", f"gpu-{prefix}-0"))
        elif kind == "pod":
            cluster.claim(o.claim(f"used-{name}", cores=10, memory="1Gi"))
            core.create_namespaced_pod(cluster.namespace, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {names.LABEL_USES_CLAIMS: "true"},
                             "annotations": {names.claim_annotation("main"): f"used-{name}"}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
        else:
            cluster.gpu(o.gpu(f"gpu-{prefix}-{name}", node=f"{prefix}-node", index=index))

    def held(name: str) -> bool:
        if kind == "claim":
            return picture.claim(cluster.namespace, name) is not None
        if kind == "pod":
            return bool(picture.pods_using(cluster.namespace, f"used-{name}"))
        if kind == "egpu":
            return picture.egpu(f"egpu-{prefix}-{name}") is not None
        return picture.ledger.gpu(f"gpu-{prefix}-{name}") is not None

    def delete(name: str) -> None:
        if kind == "claim":
            kube.delete_claim(cluster.namespace, name)
        elif kind == "pod":
            core.delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=0, _preload_content=False)
        elif kind == "egpu":
            kube.delete_elastic_gpu(f"egpu-{prefix}-{name}")
        else:
            kube.delete_gpu(f"gpu-{prefix}-{name}")

    def gave_up_its_version() -> bool:
        # What the informer says (DEBUG) once RELIST_AFTER_FAILURES attempts failed: its next
        # attempt lists. Before that, a watch resumed from its resourceVersion would deliver the
        # deletion itself and the list's path would go untested.
        return any(r.name == INFORMER and re.match(rf"watch of {kind}\b.* from a new list", r.getMessage())
                   for r in caplog.records)

    caplog.set_level(logging.DEBUG, logger=INFORMER)
    stop = threading.Event()
    thread = threading.Thread(target=controller.informer.watch_kind, args=(kind, stop),
                              kwargs={"timeout_s": 300}, daemon=True)
    thread.start()
    try:
        assert _wait(lambda: held("gone") and held("kept"))
        relay.refuse()  # the server is gone for the watch: it fails until it lists again
        delete("gone")  # meanwhile (straight to the server): no watch will ever deliver it
        # Waited for, not slept: the 4 s once slept for the 0.5 + 1 + 2 s of backoff assumed the
        # attempts come on time, which a loaded machine (6-10 on 2 cores) does not promise.
        assert _wait(gave_up_its_version, timeout_s=30.0), f"the watch of {kind} never gave up its resourceVersion"
        relay.accept_again()
        # Its next attempt (after a backoff of 2 s, 4 s if a list was refused too) lists; the
        # deadline leaves a loaded machine room for that list and one failed try more.
        assert _wait(lambda: not held("gone"), timeout_s=30.0), (
            f"the {kind} deleted while no watch ran is still in the picture")
        assert held("kept")
    finally:
        stop.set()
        relay.close()
        thread.join(timeout=10)


def test_a_half_open_watch_is_given_up_and_resumed(cluster: Cluster, relayed: tuple[KubeApi, Relay]) -> None:
    api, relay = relayed
    controller = new_controller(api, cluster.namespace)
    stop = threading.Event()
    # The server would end this watch after 300 s; the client's read timeout (2 s here, the
    # server timeout plus a margin by default) gives up on a silent connection long before.
    thread = threading.Thread(target=controller.informer.watch_kind, args=("claim", stop),
                              kwargs={"timeout_s": 300, "read_timeout_s": 2.0}, daemon=True)
    thread.start()
    try:
        cluster.claim(o.claim("before", cores=10, memory="1Gi"))
        assert _wait(lambda: controller.claim(cluster.namespace, "before") is not None)
        relay.silence()  # the watch's connection goes half-open: no data, no close
        cluster.claim(o.claim("during", cores=10, memory="1Gi"))
        assert _wait(lambda: controller.claim(cluster.namespace, "during") is not None, timeout_s=20.0), \
            "a half-open watch stalled its kind"
    finally:
        stop.set()
        relay.close()
        thread.join(timeout=10)


def test_start_up_lists_each_kind_once(cluster: Cluster, relayed: tuple[KubeApi, Relay]) -> None:
    api, _relay = relayed
    lists: list[str] = []
    list_collection = api.list_collection

    def counted(path: str) -> tuple[list[dict[str, Any]], str]:
        lists.append(path)
        return list_collection(path)

    api.list_collection = counted  # type: ignore[method-assign]
    controller = new_controller(api, cluster.namespace)
    stop = threading.Event()
    try:
        listed = controller.rebuild()
        threads = controller.informer.start(stop, timeout_s=300, listed=listed)
        cluster.claim(o.claim("new", cores=10, memory="1Gi"))
        assert _wait(lambda: controller.claim(cluster.namespace, "new") is not None)
        assert sorted(lists) == sorted(set(lists)), f"listed more than once: {sorted(lists)}"
        assert len(lists) == 8  # claims, ElasticGPUs, GPUs, classes, pods, nodes, namespaces, quotas
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)


def test_an_outage_is_said_once_when_it_starts_and_once_when_it_ends(
        cluster: Cluster, relayed: tuple[KubeApi, Relay], caplog: pytest.LogCaptureFixture) -> None:
    api, relay = relayed
    controller = new_controller(api, cluster.namespace)
    stop = threading.Event()
    thread = threading.Thread(target=controller.informer.watch_kind, args=("claim", stop),
                              kwargs={"timeout_s": 300}, daemon=True)
    thread.start()
    caplog.set_level(logging.DEBUG, logger="elasticgpu")
    try:
        assert _wait(lambda: controller.liveness.last_step("watch-claim") is not None)
        time.sleep(0.5)  # the watch is open
        caplog.clear()
        relay.refuse()  # the server is gone: connections refused
        for _ in range(3):
            with pytest.raises(errors.ApiUnavailable):
                api.list_classes()
        time.sleep(2.0)  # the watch retries meanwhile
        relay.accept_again()
        assert isinstance(api.list_classes(), list)
        cluster.claim(o.claim("after", cores=10, memory="1Gi"))
        assert _wait(lambda: controller.claim(cluster.namespace, "after") is not None)
        loud = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
        reachability = "elasticgpu.controller.edge.reachability"
        assert [(name, level) for name, level, _ in loud] == [(reachability, "WARNING"), (reachability, "INFO")], loud
        assert "unreachable" in loud[0][2] and "answers again" in loud[1][2]
    finally:
        stop.set()
        relay.close()
        thread.join(timeout=10)


def test_missing_crds_are_waited_for_and_said_once(cluster: Cluster, kube: KubeApi,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    collection_path = kube.collection_path
    installed = threading.Event()

    def path(kind: str, namespace: str | None = None) -> str:
        real = collection_path(kind, namespace)
        # the server really answers 404: a plural no CRD defines, until "installed"
        return real if kind != "gpu" or installed.is_set() else real.replace(names.PLURAL_GPU, "notinstalledgpus")

    kube.collection_path = path  # type: ignore[method-assign]
    controller = new_controller(kube, cluster.namespace)
    stop = threading.Event()
    result: list[dict[str, str] | None] = []
    caplog.set_level(logging.INFO, logger="elasticgpu")
    thread = threading.Thread(target=lambda: result.append(first_list(controller, stop)), daemon=True)
    thread.start()
    try:
        time.sleep(3.0)  # several attempts (0.5 s, 1 s, 2 s apart)
        assert thread.is_alive() and not result
        installed.set()
        thread.join(timeout=15)
        assert result and result[0] is not None and result[0]["gpu"]
        loud = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(loud) == 1 and "kubectl apply -f crds/" in loud[0][1], loud
    finally:
        stop.set()
        del kube.collection_path
        thread.join(timeout=10)


def test_a_running_controller_says_an_outage_once_and_binds_after_it(
        cluster: Cluster, kube: KubeApi, relayed: tuple[KubeApi, Relay], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    _api, relay = relayed
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=f"{cluster.prefix}-node", model=model))
    class_name = f"{cluster.prefix}-class"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    stop = threading.Event()
    caplog.set_level(logging.INFO, logger="elasticgpu")
    thread = threading.Thread(target=run_controller, daemon=True, kwargs={
        "kubeconfig": str(tmp_path / "relayed-kubeconfig"), "namespace": cluster.namespace, "stop": stop})
    thread.start()
    try:
        cluster.claim(o.claim("before", cores=10, memory="1Gi", class_name=class_name))
        assert _wait(lambda: _phase(cluster, "before") == "Bound", timeout_s=30.0)
        # The bind's Event is written by a thread of its own after the statuses: still queued when
        # the relay refuses, it would fail loudly (a fixed 1 s was all it had).
        assert _wait(lambda: _bind_event_written(cluster, kube, "before"), timeout_s=30.0), \
            [(e["involvedObject"]["name"], e.get("reason")) for e in kube.list_events(cluster.namespace)]
        caplog.clear()
        relay.refuse()  # the API server is gone for the controller (not for this test)
        cluster.claim(o.claim("during", cores=10, memory="1Gi", class_name=class_name))
        time.sleep(5.0)
        relay.accept_again()
        assert _wait(lambda: _phase(cluster, "during") == "Bound", timeout_s=30.0), "no bind after the outage"
        cluster.claim(o.claim("after", cores=10, memory="1Gi", class_name=class_name))
        assert _wait(lambda: _phase(cluster, "after") == "Bound", timeout_s=30.0)
        loud = [(r.name, r.levelname) for r in caplog.records if r.levelno >= logging.WARNING]
        assert loud == [("elasticgpu.controller.edge.reachability", "WARNING")], caplog.text[-3000:]
        back = [r for r in caplog.records if r.name == "elasticgpu.controller.edge.reachability" and
                r.levelno == logging.INFO]
        assert len(back) == 1 and "answers again" in back[0].getMessage()
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


def _phase(cluster: Cluster, name: str) -> str | None:
    return (cluster.get_claim(name).get("status") or {}).get("phase")


def _bind_event_written(cluster: Cluster, kube: KubeApi, claim: str) -> bool:
    """Whether the API server holds the Event of the claim's bind (the one Event a bind writes:
    the ElasticGPU's own status change says none)."""
    return any(e["involvedObject"]["name"] == claim and e.get("reason") == binder.REASON_BOUND
               for e in kube.list_events(cluster.namespace))
