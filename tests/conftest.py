"""Shared fixtures: a real Kubernetes API server (see tests/kube_cluster.py) and clients for it.

Set ELASTICGPU_TEST_KUBECONFIG to run against an existing cluster instead of the local test server.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.kube_cluster import (
    REPO_ROOT,
    TestCluster,
    kube_request,
    running_cluster,
    server_side_apply,
    wait_established,
)

CRDS_DIR = REPO_ROOT / "crds"


@pytest.fixture(autouse=True)
def _controllers_closed() -> Iterator[None]:
    """After each test, close the controllers `tests.binding.conftest.new_controller` made that
    the test left open (only where that module is loaded: nothing imported for other tests)."""
    yield
    binding = sys.modules.get("tests.binding.conftest")
    if binding is not None and (left := binding.close_made()):
        # Said, not failed: a test's own thread may legitimately still wind down.
        logging.getLogger(__name__).warning("threads of the test's controllers still run after it: %s", left)


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[TestCluster]:
    """The cluster of this test run: started once, stopped at the end."""
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def api_client(kube_cluster: TestCluster) -> Iterator[client.ApiClient]:
    """kubernetes.client.ApiClient configured from the cluster's kubeconfig."""
    api = config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))
    try:
        yield api
    finally:
        api.close()


def crd_documents(directory: Path = CRDS_DIR) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition document in crds/*.yaml (none if the folder is empty/missing)."""
    docs = []
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                docs.append(doc)
    return docs


@pytest.fixture(scope="session")
def crds_installed(api_client: client.ApiClient) -> list[str]:
    """Server-side-applies every CRD in crds/*.yaml and waits until each is Established; returns their names."""
    names = []
    for doc in crd_documents():
        name = doc["metadata"]["name"]
        server_side_apply(api_client, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", doc)
        names.append(name)
    wait_established(api_client, names)
    # Established means served; still, wait until each served version answers a list.
    for doc in crd_documents():
        spec = doc["spec"]
        for version in (v["name"] for v in spec["versions"] if v.get("served", True)):
            path = f"/apis/{spec['group']}/{version}/{spec['names']['plural']}"
            deadline = time.monotonic() + 30
            while (status := kube_request(api_client, "GET", path).status) != 200:
                assert time.monotonic() < deadline, f"{path}: HTTP {status}"
                time.sleep(0.1)
    return names


@pytest.fixture
def namespace(api_client: client.ApiClient) -> Iterator[str]:
    """A fresh, uniquely named namespace, deleted after the test."""
    core = client.CoreV1Api(api_client)
    name = f"t-{uuid.uuid4().hex[:12]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"elasticgpu-test": "1"})))
    try:
        # Real clusters reject pods until the "default" ServiceAccount exists; wait for it everywhere.
        deadline = time.monotonic() + 30
        while True:
            try:
                core.read_namespaced_service_account("default", name)
                break
            except ApiException as e:
                if e.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise
