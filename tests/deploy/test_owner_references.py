"""The controller may write the owner references it writes, on a cluster that enforces who may
(issue 28.1).

kube-apiserver's admission plugin OwnerReferencesPermissionEnforcement (on in many production
clusters, e.g. OpenShift's) refuses an object whose ownerReference sets `blockOwnerDeletion: true`
unless its writer may `update` the owner's `finalizers` subresource. The test API server does not
run that plugin, so this test asks what it would ask, for every owner reference the controller
writes: the inline claim it makes for a pod (`pods/inline_claims.py`), against the RBAC of
deploy/controller.yaml (tests/deploy/rbac.py decides as RBAC does).
"""

from __future__ import annotations

from pathlib import Path

from elasticgpu.api.pod_claims import read_pod_claims
from elasticgpu.controller.pods import inline_claims
from tests.deploy.rbac import Permissions, Request

REPO = Path(__file__).resolve().parents[2]
RESOURCES = {("v1", "Pod"): ("", "pods")}
"""Group and resource of the owner kinds the controller names."""


def test_the_controller_may_block_the_deletion_of_the_pods_that_own_its_inline_claims() -> None:
    pod = {"metadata": {"name": "web-0", "namespace": "team", "uid": "0b7c",
                        "annotations": {"elasticgpu.io/request.main": "gpu-core=30"}},
           "spec": {"containers": [{"name": "main"}]}}  # fmt: skip
    (request,) = read_pod_claims(pod).inline
    claim = inline_claims.build_claim(pod, request)
    permissions = Permissions.of([REPO / "deploy" / "controller.yaml"], "elasticgpu-system", "elasticgpu-controller")
    references = claim["metadata"]["ownerReferences"]
    assert [ref.get("blockOwnerDeletion") for ref in references] == [True]  # as a generic ephemeral volume's
    for ref in references:
        group, resource = RESOURCES[(ref["apiVersion"], ref["kind"])]
        # What the plugin asks the authorizer (plugin/pkg/admission/gc: update on <resource>/finalizers).
        needed = Request("update", group, f"{resource}/finalizers", claim["metadata"]["namespace"], ref["name"])
        assert permissions.allows(needed), f"deploy/controller.yaml lacks {needed}"
