"""Who owns a card, decided (`owner_move.decide`): a table of (desired, effective, what holds the card on
each side) -> (the owner after, the OwnerMove condition, whether it writes), and the allocator's and the
driver's view of each state (`open_to_elastic_gpu`, `open_to_dra`)."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from elasticgpu.api import GPU, names
from elasticgpu.api.gpu import effective_owner, open_to_dra, open_to_elastic_gpu
from elasticgpu.controller.decisions import owner_move
from elasticgpu.controller.decisions.owner_move import DraHolders
from tests.binding import objects as o

NOW = 1_800_000_000.0
GRACE = 10.0
KNOWN_FREE = DraHolders(known=True)
RESERVATION = {"elasticGPU": "egpu-1", "cores": 30, "memory": 1024,
               "claimRef": {"namespace": "team-a", "name": "train"}}


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(seconds)))


def _body(*, desired: str | None, effective: str | None, allocations: bool = False, running: bool = False,
          waiting_since: float | None = None, done: bool = False, prepared: int = 0) -> dict[str, Any]:
    body = o.gpu("gpu-a", index=3, allocations=[RESERVATION] if allocations else [])
    body["metadata"]["resourceVersion"] = "42"
    if desired is not None:
        body["spec"]["owner"] = desired
    status = body["status"]
    if effective is not None:
        status["owner"] = effective
    if running:
        status["runningClaims"] = [{"namespace": "team-a", "name": "train"}]
    if prepared:
        status["preparedClaims"] = [{"namespace": "ml", "name": f"job-{i}", "uid": f"uid-{i}"} for i in range(prepared)]
    if waiting_since is not None:
        status["conditions"] = [{"type": "OwnerMove", "status": "False", "reason": "Waiting",
                                 "message": "old", "lastTransitionTime": _stamp(waiting_since)}]
    if done:
        status["conditions"] = [{"type": "OwnerMove", "status": "True", "reason": "Done",
                                 "message": f"the card belongs to {effective}",
                                 "lastTransitionTime": _stamp(NOW - 100)}]
    return body


ROWS = [
    # (id, body, dra, owner after, condition status/reason or None: no write, message part)
    ("never moved: no write", _body(desired=None, effective=None), KNOWN_FREE, "ElasticGPU", None, ""),
    ("ours, said: no write", _body(desired="ElasticGPU", effective="ElasticGPU", done=True), KNOWN_FREE,
     "ElasticGPU", None, ""),
    ("to DRA, a reservation of ours holds it", _body(desired="DRA", effective=None, allocations=True),
     KNOWN_FREE, "ElasticGPU", ("False", "Waiting"), "1 reservation(s) of ours to be released: egpu-1 (team-a/train)"),
    ("to DRA, a container of ours still runs", _body(desired="DRA", effective="ElasticGPU", running=True),
     KNOWN_FREE, "ElasticGPU", ("False", "Waiting"), "the containers of 1 claim(s) of ours to stop: team-a/train"),
    ("to DRA, nothing of ours: flips", _body(desired="DRA", effective=None), DraHolders(known=False),
     "DRA", ("True", "Done"), "the card belongs to DRA (moved from ElasticGPU)"),
    ("back, a ResourceClaim holds it", _body(desired="ElasticGPU", effective="DRA", waiting_since=NOW - 100),
     DraHolders(known=True, claims=["ml/a", "ml/b", "ml/c", "ml/d"]), "DRA", ("False", "Waiting"),
     "4 ResourceClaim(s) allocated on it to be deallocated: ml/a, ml/b, ml/c and 1 more"),
    ("back, the claims cannot be read", _body(desired="ElasticGPU", effective="DRA", waiting_since=NOW - 100),
     DraHolders(known=False, why_unknown="HTTP 403"), "DRA", ("False", "Waiting"),
     "the ResourceClaims to be read (HTTP 403)"),
    ("back, free, the move just started: the grace", _body(desired="ElasticGPU", effective="DRA"), KNOWN_FREE,
     "DRA", ("False", "Waiting"), "ResourceSlice to drop the card (a grace of 10s)"),
    ("back, free, within the grace", _body(desired="ElasticGPU", effective="DRA", waiting_since=NOW - 4),
     KNOWN_FREE, "DRA", ("False", "Waiting"), "a grace of 10s"),
    # Issue 48: a force-deleted pod's claim is deallocated while kubelet still stops its container.
    ("back, deallocated but its agent holds a claim prepared", _body(
        desired="ElasticGPU", effective="DRA", waiting_since=NOW - 100, prepared=1), KNOWN_FREE, "DRA",
     ("False", "Waiting"),
     "1 ResourceClaim(s) its node's agent holds prepared or running on it to be let go: ml/job-0"),
    ("back, allocated and prepared: both said", _body(
        desired="ElasticGPU", effective="DRA", waiting_since=NOW - 100, prepared=4),
     DraHolders(known=True, claims=["ml/a"]), "DRA", ("False", "Waiting"),
     "deallocated: ml/a; 4 ResourceClaim(s) its node's agent holds prepared or running on it to be let go:"
     " ml/job-0, ml/job-1, ml/job-2 and 1 more"),
    ("back, free, grace over: flips", _body(desired="ElasticGPU", effective="DRA", waiting_since=NOW - 11),
     KNOWN_FREE, "ElasticGPU", ("True", "Done"), "the card belongs to ElasticGPU (moved from DRA)"),
    ("DRA's, said: no write", _body(desired="DRA", effective="DRA", done=True), DraHolders(known=False),
     "DRA", None, ""),
    ("a move called off: done with the old owner", _body(desired="ElasticGPU", effective="ElasticGPU",
                                                        allocations=True, waiting_since=NOW - 5),
     KNOWN_FREE, "ElasticGPU", ("True", "Done"), "the card belongs to ElasticGPU"),
]


@pytest.mark.parametrize(("body", "dra", "owner", "writes", "message"),
                         [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_decide(body: dict[str, Any], dra: DraHolders, owner: str, writes: tuple[str, str] | None,
                message: str) -> None:
    read = copy.deepcopy(body)
    gpu = GPU.model_validate(body)
    step = owner_move.decide(gpu, body, dra=dra, now=NOW, now_rfc3339=_stamp(NOW), grace_s=GRACE)
    assert body == read, "the picture's copy is never changed"
    assert step.owner == owner
    assert step.moved == (owner != effective_owner(gpu))
    if writes is None:
        assert step.body is None
        return
    assert step.body is not None
    assert (step.condition["status"], step.condition["reason"]) == writes
    assert message in step.condition["message"]
    assert step.body["metadata"]["resourceVersion"] == "42", "the precondition is the version read"
    assert step.body["status"]["owner"] == owner
    assert step.body["status"].get("allocations") == body["status"].get("allocations"), "reservations as read"
    if writes[0] == "False" and (gpu.status.conditions and gpu.status.conditions[0].status == "False"):
        assert step.condition["lastTransitionTime"] == gpu.status.conditions[0].last_transition_time, \
            "a move that goes on waiting keeps when it started (the grace counts from there)"


def test_the_grace_is_looked_at_again_when_it_runs_out() -> None:
    body = _body(desired="ElasticGPU", effective="DRA", waiting_since=NOW - 4)
    step = owner_move.decide(GPU.model_validate(body), body, dra=KNOWN_FREE, now=NOW, now_rfc3339=_stamp(NOW),
                             grace_s=GRACE)
    assert step.recheck_in_s is not None and 6 <= step.recheck_in_s <= 7


@pytest.mark.parametrize(("desired", "effective", "ours", "dra"), [
    (None, None, True, False),
    ("ElasticGPU", "ElasticGPU", True, False),
    ("DRA", None, False, False),  # moving to DRA: ours stopped, DRA not yet
    ("DRA", "ElasticGPU", False, False),
    ("DRA", "DRA", False, True),
    ("ElasticGPU", "DRA", False, False),  # moving back: the driver stopped publishing, ours not yet
])
def test_each_side_sees_a_card_open_only_when_both_fields_say_it(desired: str | None, effective: str | None,
                                                                 ours: bool, dra: bool) -> None:
    gpu = GPU.model_validate(_body(desired=desired, effective=effective))
    assert (open_to_elastic_gpu(gpu), open_to_dra(gpu)) == (ours, dra)
    assert not (open_to_elastic_gpu(gpu) and open_to_dra(gpu))
    assert gpu.spec.owner == (desired or names.OWNER_ELASTIC_GPU)
