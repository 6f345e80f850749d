"""Fixtures of the binding tests against the API server: a KubeApi, a fresh Controller, and
cluster-scoped objects (GPUs, classes, ElasticGPUs) that are removed after each test.

`settle` runs a controller as it runs in production, minus its threads: one list at its start,
then watches (the informer's own loops) feed it, and the test's thread works the queue off.
It never relists: a change whose event fails to queue the keys it should wake leaves a claim
where it was, and the test fails (a relist before each drain requeued everything and hid that).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import ControllerSettings, ResyncSettings


class Cluster:
    """Creates objects for one test and removes the cluster-scoped ones afterwards."""

    def __init__(self, kube: KubeApi, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.prefix = namespace
        self._gpus: list[str] = []
        self._classes: list[str] = []

    def gpu(self, body: dict[str, Any]) -> dict[str, Any]:
        self._gpus.append(body["metadata"]["name"])
        return self.kube.create_gpu(body)

    def klass(self, body: dict[str, Any]) -> dict[str, Any]:
        self._classes.append(body["metadata"]["name"])
        return self.kube.create_class(body)

    def claim(self, body: dict[str, Any]) -> dict[str, Any]:
        body["metadata"]["namespace"] = self.namespace
        body["metadata"].pop("uid", None)
        return self.kube.create_claim(body)

    def egpu(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.kube.create_elastic_gpu(body)

    def get_claim(self, name: str) -> dict[str, Any]:
        return self.kube.get_claim(self.namespace, name)

    def cleanup(self) -> None:
        stop_watches()  # no controller of the test reacts to the deletions below

        def drop_claim(name: str) -> None:
            try:
                self.kube.patch_claim(self.namespace, name, {"metadata": {"finalizers": []}})
                self.kube.delete_claim(self.namespace, name)
            except errors.NotFound:
                pass

        def drop_egpu(name: str) -> None:
            try:
                self.kube.patch_elastic_gpu(name, {"metadata": {"finalizers": []}})
                self.kube.delete_elastic_gpu(name)
            except errors.NotFound:
                pass

        def drop_gpu(name: str) -> None:
            with contextlib.suppress(errors.NotFound):
                self.kube.delete_gpu(name)

        egpus = []
        for body in self.kube.list_elastic_gpus():
            spec = body.get("spec") or {}
            if (spec.get("claimRef") or {}).get("namespace") == self.namespace or body["metadata"][
                    "name"].startswith(self.prefix):
                egpus.append(body["metadata"]["name"])
        # In parallel: the race and crash tests leave hundreds of objects.
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(drop_claim, [b["metadata"]["name"] for b in self.kube.list_claims(self.namespace)]))
            list(pool.map(drop_egpu, egpus))
            list(pool.map(drop_gpu, self._gpus))
        for name in self._classes:
            with contextlib.suppress(errors.NotFound):
                self.kube.delete_class(name)


@pytest.fixture(scope="session")
def kube(kube_cluster: Any, crds_installed: list[str]) -> Iterator[KubeApi]:
    api = KubeApi.from_kubeconfig(str(kube_cluster.kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def cluster(kube: KubeApi, namespace: str) -> Iterator[Cluster]:
    objects = Cluster(kube, namespace)
    try:
        yield objects
    finally:
        objects.cleanup()


_MADE: list[Controller] = []
"""The controllers `new_controller` made in the running test, closed after it (`close_made`)."""


def new_controller(kube: KubeApi, namespace: str | None, *, grace_s: float = 60.0) -> Controller:
    """A controller limited to the test's namespace (GPUs and classes are cluster-wide), or
    cluster-wide (`namespace` None: the default mode of `elasticgpu controller`). Closed after the
    test if the test does not close it."""
    settings = ControllerSettings(resync=ResyncSettings(orphan_grace_s=grace_s))
    controller = Controller(kube, settings, namespace=namespace)
    _MADE.append(controller)
    return controller


def close_made() -> list[str]:
    """Close the controllers `new_controller` made since the last call (closing twice is harmless)
    and join their threads; the names of those still alive after the deadline. Many tests never
    closed theirs: each left its Event writer thread for the rest of the session, which wrote an
    Event queued late with the test's client after the test (a later test's log)."""
    made = list(_MADE)
    _MADE.clear()
    deadline = time.monotonic() + 10.0
    for controller in made:
        controller.close()
    left = []
    for controller in made:
        for thread in controller.liveness.threads():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                left.append(thread.name)
    return left


WATCH_TIMEOUT_S = 5
"""The server ends each of settle's watches after this many seconds: a stopped watch thread
notices its stop within that time."""
QUIET_S = 0.5
"""settle returns after this long with nothing queued, nothing synced and no watch event."""


@dataclass
class _Watching:
    """The watches settle started for one controller."""

    stop: threading.Event = field(default_factory=threading.Event)
    last_event: float = field(default_factory=time.monotonic)
    threads: list[threading.Thread] = field(default_factory=list)


_watching: dict[Controller, _Watching] = {}


def _watch(controller: Controller) -> _Watching:
    """Start the controller: one list (the picture and every key, as at start-up), then its
    informer's watches from the listed resourceVersions; each event is timed for `settle`."""
    watching = _watching.get(controller)
    if watching is not None:
        return watching
    watching = _watching[controller] = _Watching()
    informer = controller.informer
    observe = informer.observe

    def timed(kind: str, event_type: str | None, body: dict[str, Any], *,
              if_held: tuple[str, str] | None = None) -> bool:
        taken = observe(kind, event_type, body, if_held=if_held)
        watching.last_event = time.monotonic()
        return taken

    informer.observe = timed  # type: ignore[method-assign]
    listed = controller.rebuild()
    watching.threads = informer.start(watching.stop, timeout_s=WATCH_TIMEOUT_S, listed=listed)
    return watching


def stop_watches() -> None:
    """Stop every watch `settle` started and wait for its thread (at most `WATCH_TIMEOUT_S` and a
    margin): a watch left to notice its stop at its timeout took in the test's cleanup (the
    namespace's deletions) and logged into the next test. Its connection is ended at once
    (`KubeApi.end_watches`: the client is shared by the session's tests, not closed)."""
    stopping = list(_watching.items())
    _watching.clear()
    for controller, watching in stopping:
        watching.stop.set()
        controller.informer.kube.end_watches(watching.threads)
    deadline = time.monotonic() + WATCH_TIMEOUT_S + 5.0
    for _controller, watching in stopping:
        for thread in watching.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def settle(controller: Controller, rounds: int = 1, *, deadline_s: float = 60.0) -> None:
    """Work the controller until it is quiet: no key queued (retries included; time-based
    rechecks are not work), nothing synced and no watch event for `QUIET_S`. The first call
    lists and starts the watches; later calls only wait for what the watches deliver.
    Fails after `deadline_s` while it is not quiet (a key retried forever, an event storm).
    `rounds` is accepted for older callers and means nothing: there is nothing to repeat."""
    del rounds
    watching = _watch(controller)
    deadline = time.monotonic() + deadline_s
    last_work = time.monotonic()
    while True:
        if controller.drain():
            last_work = time.monotonic()
        now = time.monotonic()
        if not controller.queue.waiting() and now - max(last_work, watching.last_event) >= QUIET_S:
            return
        if now > deadline:
            raise AssertionError(f"settle: not quiet after {deadline_s:g}s ({controller.queue.waiting()} keys"
                                 " queued); a sync keeps failing or an event keeps coming (see the log)")
        time.sleep(0.02)


__all__ = ["Cluster", "names", "new_controller", "settle", "stop_watches"]
