"""The name of an inline claim's ElasticGPU, known before the claim exists (issue 37), and what the
binder makes of a claim that carries it: believed only when it derives from the claim's own
namespace, name and pod; then provisioned under it, never bound to an admin's ElasticGPU."""

from __future__ import annotations

import re
import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.api import ElasticGPUClaim, names
from elasticgpu.controller.decisions import binder, provisioned_names
from tests.binding import objects as o
from tests.binding.test_decisions import SHARE, _picture, _with_status

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
labels = st.from_regex(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", fullmatch=True)
uids = st.uuids().map(str)


@given(labels, labels, uids)
def test_the_name_is_a_valid_object_name(namespace: str, claim: str, pod_uid: str) -> None:
    name = names.elastic_gpu_name_for_inline_claim(namespace, claim, pod_uid)
    assert len(name) <= 253 and DNS_SUBDOMAIN.match(name), name
    assert name == names.elastic_gpu_name_for_inline_claim(namespace, claim, pod_uid.upper())


@given(st.tuples(labels, labels, uids), st.tuples(labels, labels, uids))
def test_distinct_claims_get_distinct_names(a: tuple[str, str, str], b: tuple[str, str, str]) -> None:
    if a != b:
        assert names.elastic_gpu_name_for_inline_claim(*a) != names.elastic_gpu_name_for_inline_claim(*b)


def _inline(namespace: str, *, owner_uid: str | None, named_for: str, users: list[str] | None = None,
            name: str = "web-0-main") -> dict[str, Any]:
    body = o.claim(name, namespace, class_name="share", uid=str(uuid.uuid4()))
    if owner_uid is not None:
        body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "web-0", "uid": owner_uid,
                                                "controller": True, "blockOwnerDeletion": True}]
    body["spec"]["elasticGPUName"] = names.elastic_gpu_name_for_inline_claim("ns", "web-0-main", named_for)
    if users:
        body["status"] = {"users": [{"name": "web-0", "uid": u} for u in users]}
    return body


POD = "0b6f5c1e-1111-4c3a-9e2f-000000000001"


def test_believed_from_the_owner_pod_or_the_pod_the_status_names() -> None:
    own = ElasticGPUClaim.model_validate(_inline("ns", owner_uid=POD, named_for=POD))
    assert provisioned_names.prenamed(own) == own.spec.elastic_gpu_name
    assert provisioned_names.provisioned_name(own) == own.spec.elastic_gpu_name
    # a tenant took the owner reference off after the bind: the controller's status still names the pod
    orphaned = ElasticGPUClaim.model_validate(_inline("ns", owner_uid=None, named_for=POD, users=[POD]))
    assert provisioned_names.prenamed(orphaned) == orphaned.spec.elastic_gpu_name


def test_not_believed_in_another_namespace_or_for_another_pod() -> None:
    elsewhere = ElasticGPUClaim.model_validate(_inline("other", owner_uid=POD, named_for=POD))
    assert provisioned_names.prenamed(elsewhere) is None
    assert provisioned_names.provisioned_name(elsewhere) == names.elastic_gpu_name_for_claim(
        elsewhere.metadata.uid or "")
    other_pod = ElasticGPUClaim.model_validate(_inline("ns", owner_uid=POD, named_for=str(uuid.uuid4())))
    assert provisioned_names.prenamed(other_pod) is None
    renamed = ElasticGPUClaim.model_validate(_inline("ns", owner_uid=POD, named_for=POD, name="web-1-main"))
    assert provisioned_names.prenamed(renamed) is None


def test_a_prenamed_claim_is_provisioned_not_bound_to_an_admins() -> None:
    available = [_with_status(o.share_egpu("e1", "gpu-a", class_name="share"), phase="Available")]
    claim = ElasticGPUClaim.model_validate(_inline("ns", owner_uid=POD, named_for=POD))
    assert isinstance(binder.decide_claim(claim, _picture(available, [SHARE])), binder.Provision)
    # the same name written in another namespace is a static bind to an ElasticGPU that does not exist
    squatter = ElasticGPUClaim.model_validate(_inline("other", owner_uid=POD, named_for=POD))
    said = binder.decide_claim(squatter, _picture(available, [SHARE]))
    assert isinstance(said, binder.Wait) and said.reason == binder.REASON_EGPU_NOT_FOUND, said


def test_a_prenamed_claim_whose_elastic_gpu_is_gone_after_its_bind_is_lost() -> None:
    body = _inline("ns", owner_uid=POD, named_for=POD)
    body["status"] = {"phase": "Bound"}
    said = binder.decide_claim(ElasticGPUClaim.model_validate(body), _picture([], [SHARE]))
    assert isinstance(said, binder.MarkLost), said
