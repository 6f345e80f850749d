"""Fixtures of the binding tests against the API server: a KubeApi, a fresh Controller, and
cluster-scoped objects (GPUs, classes, ElasticGPUs) that are removed after each test."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from elasticgpu.api import names
from elasticgpu.controller import errors
from elasticgpu.controller.kube import KubeApi
from elasticgpu.controller.reconciling import Controller
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


def new_controller(kube: KubeApi, namespace: str, *, grace_s: float = 60.0) -> Controller:
    """A controller limited to the test's namespace (GPUs and classes are cluster-wide)."""
    settings = ControllerSettings(resync=ResyncSettings(orphan_grace_s=grace_s))
    return Controller(kube, settings, namespace=namespace)


def settle(controller: Controller, rounds: int = 3, *, deadline_s: float = 60.0) -> None:
    """Rebuild the picture from the server and work the queue off, a few times (no watches here).
    Fails after `deadline_s` while keys are still queued (a key retried forever is a bug)."""
    deadline = time.monotonic() + deadline_s
    for _ in range(rounds):
        controller.rebuild()
        controller.drain()
        while controller.queue.waiting():  # retries after a lost race are queued for later
            if time.monotonic() > deadline:
                raise AssertionError(f"settle: {controller.queue.waiting()} keys still queued after {deadline_s:g}s;"
                                     " a sync keeps failing (see the log)")
            time.sleep(0.1)
            controller.drain()


__all__ = ["Cluster", "names", "new_controller", "settle"]
