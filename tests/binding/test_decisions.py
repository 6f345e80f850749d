"""Table tests of the pure binder: (claim, picture) -> decision, one row per observation."""

from __future__ import annotations

from typing import Any

import pytest

from elasticgpu.allocator import CardShare, Placement
from elasticgpu.api import GPU, ElasticGPU, ElasticGPUClaim, ElasticGPUClass, names
from elasticgpu.controller.decisions import binder
from tests.binding import objects as o

GPUS = {g["metadata"]["name"]: GPU.model_validate(g) for g in (o.gpu("gpu-a"), o.gpu("gpu-b", memory=40960))}


def _picture(egpus: list[dict[str, Any]], classes: list[dict[str, Any]]) -> binder.Picture:
    models = {e["metadata"]["name"]: ElasticGPU.model_validate(e) for e in egpus}
    return binder.Picture(
        elastic_gpus=models,
        classes={c["metadata"]["name"]: ElasticGPUClass.model_validate(c) for c in classes},
        card_memory=lambda n: GPUS[n].spec.memory if n in GPUS else None,
        by_claim_uid=binder.index_by_claim_uid(models.values()),
    )


def _with_status(body: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {**body, "status": status}


def _ref(claim: dict[str, Any]) -> dict[str, Any]:
    meta = claim["metadata"]
    return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}


SHARE = o.klass("share")
WHOLE = o.klass("whole", provisioner=names.PROVISIONER_PHYSICAL)
FOREIGN = o.klass("foreign", provisioner="example.com/other")
DEFAULT = o.klass("dflt", default=True)
C = o.claim("c", class_name="share", uid="u-1")

ROWS: list[tuple[str, dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], object]] = [
    ("new claim of a gpushare class provisions", C, [], [SHARE], binder.Provision),
    ("claim without class uses the default class", o.claim("c", uid="u-1"), [], [DEFAULT], binder.Provision),
    ("no class and no default class waits", o.claim("c", uid="u-1"), [], [SHARE],
     binder.Wait(binder.REASON_CLASS_NOT_FOUND, "")),
    ("unknown class waits with ClassNotFound", o.claim("c", class_name="nope"), [], [SHARE],
     binder.Wait(binder.REASON_CLASS_NOT_FOUND, "")),
    ("another provisioner's class is left alone", o.claim("c", class_name="foreign"), [], [FOREIGN], binder.Ignore),
    ("150 cores is an invalid request", o.claim("c", cores=150, class_name="share"), [], [SHARE],
     binder.Wait(binder.REASON_INVALID_REQUEST, "")),
    ("a share on a physical class is refused", o.claim("c", class_name="whole"), [], [WHOLE],
     binder.Wait(binder.REASON_INVALID_REQUEST, "")),
    ("whole cards on a physical class provision", o.claim("c", cards=2, class_name="whole"), [], [WHOLE],
     binder.Provision),
    ("an Available static ElasticGPU of the class is bound first", C,
     [_with_status(o.share_egpu("e1", "gpu-a", class_name="share"), phase="Available")], [SHARE],
     binder.BindToExisting("e1")),
    ("the smallest static ElasticGPU that fits wins", C,
     [_with_status(o.share_egpu("big", "gpu-a", cores=90, class_name="share"), phase="Available"),
      _with_status(o.share_egpu("small", "gpu-a", cores=40, class_name="share"), phase="Available"),
      _with_status(o.share_egpu("tiny", "gpu-a", cores=10, class_name="share"), phase="Available")],
     [SHARE], binder.BindToExisting("small")),
    ("a static ElasticGPU of another class is not used", C,
     [_with_status(o.share_egpu("e1", "gpu-a"), phase="Available")], [SHARE], binder.Provision),
    ("a selector binds only to matching labels", o.claim("c", class_name="share", selector={"matchLabels": {"t": "x"}}),
     [_with_status(o.share_egpu("e1", "gpu-a", class_name="share", labels={"t": "y"}), phase="Available"),
      _with_status(o.share_egpu("e2", "gpu-a", class_name="share", labels={"t": "x"}), phase="Available")],
     [SHARE], binder.BindToExisting("e2")),
    ("a selector with no match waits, never provisions",
     o.claim("c", class_name="share", selector={"matchLabels": {"t": "z"}}), [], [SHARE],
     binder.Wait(binder.REASON_NO_MATCH, "")),
    ("named ElasticGPU missing waits", o.claim("c", egpu="e1"), [], [], binder.Wait(binder.REASON_EGPU_NOT_FOUND, "")),
    ("named ElasticGPU Available and large enough binds", o.claim("c", egpu="e1"),
     [_with_status(o.share_egpu("e1", "gpu-a"), phase="Available")], [], binder.BindToExisting("e1")),
    ("named ElasticGPU too small waits", o.claim("c", cores=80, egpu="e1"),
     [_with_status(o.share_egpu("e1", "gpu-a"), phase="Available")], [],
     binder.Wait(binder.REASON_EGPU_TOO_SMALL, "")),
    ("named ElasticGPU not Available waits", o.claim("c", egpu="e1"),
     [_with_status(o.share_egpu("e1", "gpu-a"), phase="Failed")], [],
     binder.Wait(binder.REASON_EGPU_NOT_AVAILABLE, "")),
    ("named ElasticGPU bound elsewhere waits", o.claim("c", egpu="e1"),
     [_with_status(o.share_egpu("e1", "gpu-a", claim_ref={"namespace": "ns", "name": "other", "uid": "x"}),
                   phase="Bound")], [], binder.Wait(binder.REASON_EGPU_BOUND_ELSEWHERE, "")),
    ("crash after the ElasticGPU was created: complete the bind", C,
     [_with_status(o.share_egpu("egpu-u-1", "gpu-a", claim_ref=_ref(C), class_name="share"), phase="Bound")],
     [SHARE], binder.CompleteBind("egpu-u-1")),
    ("crash before the ElasticGPU's status: wait for its reservation", C,
     [o.share_egpu("egpu-u-1", "gpu-a", claim_ref=_ref(C), class_name="share")], [SHARE],
     binder.Wait(binder.REASON_EGPU_NOT_AVAILABLE, "")),
    ("crash after the claim's spec, before its status: complete the bind", {**C, "spec": {**C["spec"],
     "elasticGPUName": "egpu-u-1"}},
     [_with_status(o.share_egpu("egpu-u-1", "gpu-a", claim_ref=_ref(C)), phase="Bound")], [SHARE],
     binder.CompleteBind("egpu-u-1")),
    ("bound claim whose ElasticGPU vanished is Lost",
     _with_status({**C, "spec": {**C["spec"], "elasticGPUName": "egpu-u-1"}}, phase="Bound"), [], [SHARE],
     binder.MarkLost(binder.REASON_EGPU_NOT_FOUND, "")),
    ("bound claim whose ElasticGPU failed is Lost",
     _with_status({**C, "spec": {**C["spec"], "elasticGPUName": "egpu-u-1"}}, phase="Bound"),
     [_with_status(o.share_egpu("egpu-u-1", "gpu-a", claim_ref=_ref(C)), phase="Failed", message="gone")],
     [SHARE], binder.MarkLost(binder.REASON_EGPU_FAILED, "")),
    ("bound and consistent: nothing to do",
     _with_status({**C, "spec": {**C["spec"], "elasticGPUName": "egpu-u-1"}}, phase="Bound",
                  conditions=[{"type": "Bound", "status": "True", "reason": "Bound"}]),
     [_with_status(o.share_egpu("egpu-u-1", "gpu-a", claim_ref=_ref(C)), phase="Bound")], [SHARE],
     binder.InSync("egpu-u-1")),
    ("WaitForFirstConsumer waits", o.claim("c", class_name="wffc"), [],
     [o.klass("wffc", mode="WaitForFirstConsumer")], binder.Wait(binder.REASON_WAIT_FOR_CONSUMER, "")),
]


@pytest.mark.parametrize(("claim", "egpus", "classes", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_decide_claim(claim: dict[str, Any], egpus: list[dict[str, Any]], classes: list[dict[str, Any]],
                      expected: object) -> None:
    decision = binder.decide_claim(ElasticGPUClaim.model_validate(claim), _picture(egpus, classes))
    if isinstance(expected, type):
        assert isinstance(decision, expected), decision
    elif isinstance(expected, binder.Wait | binder.MarkLost):
        assert type(decision) is type(expected) and decision.reason == expected.reason, decision
        assert decision.message, "every wait says why"
    else:
        assert decision == expected


def test_wait_messages_name_the_field() -> None:
    decision = binder.decide_claim(ElasticGPUClaim.model_validate(o.claim("c", cores=150, class_name="share")),
                                   _picture([], [SHARE]))
    assert isinstance(decision, binder.Wait)
    assert "spec.resources.requests[elasticgpu.io/gpu-core]" in decision.message


def test_an_unknown_class_names_the_classes_there_are() -> None:
    """The controller and `elasticgpu plan` say the same (issue 29): a typo shows next to what exists."""
    decision = binder.decide_claim(ElasticGPUClaim.model_validate(o.claim("c", class_name="shrae")),
                                   _picture([], [SHARE, WHOLE]))
    assert decision == binder.Wait(binder.REASON_CLASS_NOT_FOUND,
                                   "spec.elasticGPUClassName: ElasticGPUClass shrae does not exist (the classes are"
                                   " share, whole); create it or name an existing class")


def _egpu_decision(body: dict[str, Any], *, held: Placement | None = None, claim: dict[str, Any] | None = None,
                   conflict: str = "") -> binder.ElasticGPUDecision:
    return binder.decide_elastic_gpu(
        ElasticGPU.model_validate(body),
        claim=ElasticGPUClaim.model_validate(claim) if claim else None,
        gpus=GPUS.get,
        held=held,
        conflict=lambda _p: conflict,
    )


SLICE = Placement(node="node-1", cards=(CardShare(uuid="GPU-A", cores=50, memory_mib=20480),))


def test_new_admin_elastic_gpu_is_reserved() -> None:
    assert _egpu_decision(o.share_egpu("e1", "gpu-a")) == binder.Reserve(SLICE)


def test_admin_elastic_gpu_that_does_not_fit_fails() -> None:
    decision = _egpu_decision(o.share_egpu("e1", "gpu-a"), conflict="node-1 card 0 has 10% cores free")
    assert isinstance(decision, binder.Fail) and decision.reason == binder.REASON_DOES_NOT_FIT
    assert "10% cores free" in decision.message


def test_new_elastic_gpu_on_a_gpu_not_published_yet_waits() -> None:
    decision = _egpu_decision(o.share_egpu("e1", "gpu-zz"))
    assert isinstance(decision, binder.StayPending) and decision.reason == binder.REASON_GPU_NOT_FOUND
    assert "gpu-zz" in decision.message
    still = _egpu_decision(_with_status(o.share_egpu("e1", "gpu-zz"), phase="Pending", reason="GPUNotFound"))
    assert isinstance(still, binder.StayPending)


def test_elastic_gpu_on_missing_gpu_fails() -> None:
    decision = _egpu_decision(_with_status(o.share_egpu("e1", "gpu-zz"), phase="Bound"))
    assert isinstance(decision, binder.Fail) and decision.reason == binder.REASON_GPU_NOT_FOUND


def test_memory_larger_than_the_card_fails() -> None:
    decision = _egpu_decision(o.share_egpu("e1", "gpu-b", memory="50Gi"))
    assert isinstance(decision, binder.Fail) and decision.reason == binder.REASON_DOES_NOT_FIT


def test_bound_elastic_gpu_whose_claim_is_missing_is_checked() -> None:
    body = _with_status(o.share_egpu("e1", "gpu-a", claim_ref=_ref(C)), phase="Bound")
    assert _egpu_decision(body, held=SLICE) == binder.ReleaseIfClaimGone()


def test_failed_elastic_gpu_whose_claim_is_missing_is_checked_else_kept() -> None:
    failed = _with_status(o.share_egpu("e1", "gpu-a", claim_ref=_ref(C)), phase="Failed", reason="DoesNotFit")
    assert _egpu_decision(failed) == binder.ReleaseIfClaimGone()
    assert isinstance(_egpu_decision(failed, claim=C), binder.Keep)  # its claim is Lost: the user decides
    admins = _with_status(o.share_egpu("e1", "gpu-a"), phase="Failed", reason="DoesNotFit")
    assert isinstance(_egpu_decision(admins), binder.Keep)  # no claim was ever bound to it


def test_released_delete_is_reclaimed_retain_is_kept() -> None:
    deleting = _with_status(o.share_egpu("e1", "gpu-a", reclaim="Delete"), phase="Released")
    assert _egpu_decision(deleting, held=SLICE) == binder.Reclaim(delete=True)
    retained = _with_status(o.share_egpu("e1", "gpu-a", reclaim="Retain"), phase="Released")
    assert isinstance(_egpu_decision(retained, held=SLICE), binder.Keep)


def test_deleting_an_elastic_gpu_in_use_is_refused() -> None:
    bound_claim = {**C, "spec": {**C["spec"], "elasticGPUName": "e1"}}
    body = _with_status(o.share_egpu("e1", "gpu-a", claim_ref=_ref(C)), phase="Bound")
    body["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    decision = _egpu_decision(body, held=SLICE, claim=bound_claim)
    assert isinstance(decision, binder.Keep) and binder.REASON_IN_USE in decision.why
    assert _egpu_decision(body, held=SLICE) == binder.Reclaim(delete=False)
