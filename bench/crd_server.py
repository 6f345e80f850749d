"""The local test API server (tests/kube_cluster.py) with elasticgpu's CRDs installed and
established: where the benchmarks that need an API server start."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def test_server_with_crds() -> Iterator[tuple[Any, Any]]:
    """(the running test cluster, a kubernetes ApiClient for it), the CRDs applied server-side and
    established; the server stops on leaving."""
    from kubernetes import config

    from tests.conftest import crd_documents
    from tests.kube_cluster import running_cluster, server_side_apply, wait_established

    with running_cluster() as cluster:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        crds = crd_documents()
        for doc in crds:
            server_side_apply(api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{doc['metadata']['name']}",
                              doc)
        wait_established(api, [d["metadata"]["name"] for d in crds])
        time.sleep(1.0)  # the new kinds' discovery reaches every client
        yield cluster, api
