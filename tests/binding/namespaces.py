"""Namespaces of a test's own (for tests that compare namespaces: bind order, fair share)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from kubernetes import client

from elasticgpu.controller import errors
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding.conftest import stop_watches


@contextlib.contextmanager
def fresh_namespaces(api_client: client.ApiClient, kube: KubeApi, made: Sequence[str]) -> Iterator[None]:
    """Create the namespaces `made`; on exit stop the watches, remove their claims and
    ElasticGPUs (finalizers cleared) and delete them."""
    core = client.CoreV1Api(api_client)
    for name in made:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name,
                                                                               labels={"elasticgpu-test": "1"})))
    try:
        yield
    finally:
        stop_watches()
        for name in made:
            for body in kube.list_claims(name):
                with contextlib.suppress(errors.NotFound):
                    kube.patch_claim(name, body["metadata"]["name"], {"metadata": {"finalizers": []}})
                    kube.delete_claim(name, body["metadata"]["name"])
        for body in kube.list_elastic_gpus():
            if ((body.get("spec") or {}).get("claimRef") or {}).get("namespace") in made:
                with contextlib.suppress(errors.NotFound):
                    kube.patch_elastic_gpu(body["metadata"]["name"], {"metadata": {"finalizers": []}})
                    kube.delete_elastic_gpu(body["metadata"]["name"])
        for name in made:
            with contextlib.suppress(client.ApiException):
                core.delete_namespace(name)
