"""`elasticgpu after-uninstall` (helm uninstall's post-delete hook) on the test API server: it deletes
what the product made at run time, drops only the product's finalizers, keeps the users' claims, and
a second run finds nothing to do."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from elasticgpu import after_uninstall
from elasticgpu.api import names
from tests.factories import ClaimFactory, ElasticGPUFactory
from tests.kube_cluster import TestCluster

pytestmark = pytest.mark.timeout(120)

OTHERS = "example.com/keep-me"


def _gone(call: Any) -> bool:
    try:
        call()
    except ApiException as e:
        return e.status == 404
    return False


def test_it_removes_the_run_time_leftovers_and_the_products_finalizers_only(
    kube_cluster: TestCluster, api_client: client.ApiClient, crds_installed: list[str], namespace: str
) -> None:
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    leases = client.CoordinationV1Api(api_client)
    admission = client.AdmissionregistrationV1Api(api_client)
    suffix = uuid.uuid4().hex[:6]
    leftovers = after_uninstall.Leftovers(namespace, f"pods-{suffix}", f"tls-{suffix}", f"leader-{suffix}")
    admission.create_mutating_webhook_configuration({"metadata": {"name": leftovers.webhook_configuration}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": leftovers.webhook_secret}})
    leases.create_namespaced_lease(namespace, {"metadata": {"name": leftovers.leader_lease}})
    claim = ClaimFactory(metadata__namespace=namespace).to_dict()
    claim["metadata"]["finalizers"] = [names.FINALIZER_CLAIM_PROTECTION, OTHERS]
    claim = custom.create_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL_CLAIM, claim)
    egpu = ElasticGPUFactory(metadata__name=f"egpu-{suffix}").to_dict()
    egpu["metadata"]["finalizers"] = [names.FINALIZER_EGPU_PROTECTION]
    custom.create_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU, egpu)
    try:
        command = [sys.executable, "-m", "elasticgpu", "after-uninstall", "--namespace", namespace,
                   "--kubeconfig", str(kube_cluster.kubeconfig), "--webhook-configuration",
                   leftovers.webhook_configuration, "--webhook-secret", leftovers.webhook_secret,
                   "--leader-lease", leftovers.leader_lease]  # fmt: skip
        for attempt in range(2):  # the second run finds nothing to do, and says so
            done = subprocess.run(command, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert ("already gone" in done.stderr) == (attempt == 1), done.stderr
        assert _gone(lambda: admission.read_mutating_webhook_configuration(leftovers.webhook_configuration))
        assert _gone(lambda: core.read_namespaced_secret(leftovers.webhook_secret, namespace))
        assert _gone(lambda: leases.read_namespaced_lease(leftovers.leader_lease, namespace))
        # The claim stays, with its spec and the finalizer of somebody else.
        kept = custom.get_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL_CLAIM,
                                                   claim["metadata"]["name"])  # fmt: skip
        assert kept["metadata"]["finalizers"] == [OTHERS]
        assert kept["spec"] == claim["spec"]
        kept_egpu = custom.get_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU,
                                                     egpu["metadata"]["name"])  # fmt: skip
        assert not kept_egpu["metadata"].get("finalizers")
    finally:
        custom.delete_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_ELASTIC_GPU,
                                            egpu["metadata"]["name"])  # fmt: skip
        unfinalized = {"metadata": {"finalizers": None}}
        custom.patch_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL_CLAIM,
                                              claim["metadata"]["name"], unfinalized)  # fmt: skip
