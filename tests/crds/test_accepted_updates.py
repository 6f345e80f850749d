"""The writes of a legitimate bind pass the CRDs' transition rules: what the invalid corpus refuses
(tests/invalid/*-claimref-*, *-elasticgpuname-changed) must not catch the controller's own updates."""

from __future__ import annotations

from typing import Any

import pytest

from elasticgpu.api import ObjectMeta, ObjectReference, claim_key, gpu_list, names
from tests.crds.objects import Objects
from tests.factories import ClaimFactory, ElasticGPUFactory


@pytest.fixture
def egpu(objects: Objects) -> Any:
    manifest = ElasticGPUFactory(metadata=ObjectMeta(name="accepted-updates")).to_dict()
    objects.delete(manifest)
    objects.create(manifest)
    yield manifest
    objects.delete(manifest)


def _with_version(objects: Objects, manifest: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """`body` with the stored resourceVersion, as every controller write carries it."""
    version = objects.get(manifest)["metadata"]["resourceVersion"]
    return {**body, "metadata": {**body.get("metadata", {}), "resourceVersion": version}}


def test_static_bind_sets_claim_ref_once_and_rewrites_it_unchanged(objects: Objects, egpu: dict[str, Any]) -> None:
    # The claimRef the controller writes on bind (provisioner.claim_ref_of).
    claim = ObjectReference(api_version=names.API_VERSION, kind=names.KIND_CLAIM, namespace="team-a", name="c", uid="u")
    ref = claim.to_dict()
    objects.patch(egpu, _with_version(objects, egpu, {"spec": {"claimRef": ref}}))
    # A retried bind writes the same claimRef again; the status write names it for kubectl.
    objects.patch(egpu, _with_version(objects, egpu, {"spec": {"claimRef": ref}}))
    status = {"phase": "Bound", "gpus": ["GPU-1"], "gpuList": gpu_list(["GPU-1"]), "claim": claim_key(claim)}
    stored = objects.patch_status(egpu, status)
    assert stored["spec"]["claimRef"] == ref
    assert stored["status"]["claim"] == "team-a/c"


def test_a_pre_bound_claim_ref_gains_its_uid(objects: Objects, egpu: dict[str, Any]) -> None:
    # An admin pre-binds by namespace and name; binding then records the claim's uid and kind.
    objects.patch(egpu, _with_version(objects, egpu, {"spec": {"claimRef": {"namespace": "team-a", "name": "c"}}}))
    full = {"apiVersion": names.API_VERSION, "kind": names.KIND_CLAIM, "namespace": "team-a", "name": "c", "uid": "u"}
    stored = objects.patch(egpu, _with_version(objects, egpu, {"spec": {"claimRef": full}}))
    assert stored["spec"]["claimRef"] == full


def test_bind_names_the_elastic_gpu_and_the_default_class_on_the_claim(objects: Objects) -> None:
    manifest = ClaimFactory(metadata=ObjectMeta(name="accepted-bind")).to_dict()
    objects.create(manifest)
    bind = {"spec": {"elasticGPUName": "egpu-x", "elasticGPUClassName": "gpushare"}}
    stored = objects.patch(manifest, _with_version(objects, manifest, bind))
    assert (stored["spec"]["elasticGPUName"], stored["spec"]["elasticGPUClassName"]) == ("egpu-x", "gpushare")


def test_bind_copies_the_upstream_class_spelling(objects: Objects) -> None:
    manifest = ClaimFactory(metadata=ObjectMeta(name="accepted-upstream")).to_dict()
    manifest["spec"]["egpuClassName"] = "gpushare"
    objects.create(manifest)
    stored = objects.patch(manifest, _with_version(objects, manifest, {"spec": {"elasticGPUClassName": "gpushare"}}))
    assert stored["spec"]["elasticGPUClassName"] == stored["spec"]["egpuClassName"] == "gpushare"
