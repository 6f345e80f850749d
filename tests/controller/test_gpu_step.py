"""One GPU sync's step, decided at once (`gpu_step.decide`), and the ledger's own index of
reservations (`reservations.Holders`) as the ledger keeps it through watch events (issue 16)."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from elasticgpu.api import GPU
from elasticgpu.controller.decisions import gpu_step
from elasticgpu.controller.picture.reservations import Holders, Ledger
from tests.binding import objects as o

NOW = 1_800_000_000.0


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(seconds)))


def _body(*, beat: float, ready: str | None = None) -> dict[str, Any]:
    body = o.gpu("gpu-a", allocations=[{"elasticGPU": "egpu-1", "cores": 30, "memory": 1024}])
    body["metadata"]["resourceVersion"] = "42"
    conditions = [{"type": "Heartbeat", "status": "True", "reason": "AgentHeartbeat",
                   "lastTransitionTime": _stamp(beat)}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready, "reason": "HeartbeatExpired"})
    body["status"]["conditions"] = conditions
    return body


@pytest.mark.parametrize(("beat", "ready_before", "ready", "writes", "recheck"), [
    (NOW - 10, None, True, None, 111.0),  # fresh, never marked: no write, look again at expiry
    (NOW - 500, None, False, "False", None),  # expired: write Ready=False, only an event changes it
    (NOW - 500, "False", False, None, None),  # said already
    (NOW - 10, "False", True, "True", 111.0),  # renewed: write Ready=True
])
def test_decide(beat: float, ready_before: str | None, ready: bool, writes: str | None,
                recheck: float | None) -> None:
    body = _body(beat=beat, ready=ready_before)
    read = copy.deepcopy(body)
    step = gpu_step.decide(GPU.model_validate(body), body, now=NOW, grace_s=120.0, now_rfc3339=_stamp(NOW))
    assert (step.ready, step.recheck_in_s) == (ready, recheck)
    assert body == read, "the picture's copy is never changed"
    if writes is None:
        assert step.condition is None and step.body is None
        return
    assert step.condition is not None and step.body is not None
    assert step.condition["status"] == writes and step.condition["lastTransitionTime"] == _stamp(NOW)
    assert step.body["metadata"]["resourceVersion"] == "42", "the precondition is the version read"
    assert step.body["status"]["allocations"] == body["status"]["allocations"], "allocations written back as read"
    assert [c["type"] for c in step.body["status"]["conditions"]] == ["Heartbeat", "Ready"]


def test_holders_keep_a_lone_gpu_bare_and_follow_each_gpu() -> None:
    holders = Holders()
    assert holders.set_keys_on("g1", {"a", "b"}) == set()
    assert holders.set_keys_on("g2", {"b"}) == set()
    assert sorted(holders.gpus_holding("b")) == ["g1", "g2"] and list(holders.gpus_holding("a")) == ["g1"]
    assert holders._gpus_of["a"] == "g1", "a key held by one GPU is kept bare"
    assert holders.set_keys_on("g1", {"a"}) == {"a", "b"}
    assert list(holders.gpus_holding("b")) == ["g2"] and holders._gpus_of["b"] == "g2"
    assert holders.set_keys_on("g2", set()) == {"b"}
    assert "b" not in holders and "a" in holders and holders.keys_on("g2") == set()
    assert list(holders.gpus_holding("b")) == []


def test_ledger_index_follows_watch_events() -> None:
    ledger = Ledger()
    one = o.gpu("gpu-a", allocations=[{"elasticGPU": "e1", "cores": 30, "memory": 1024}])
    one["metadata"]["resourceVersion"] = "1"
    ledger.observe_gpu(one)
    two = o.gpu("gpu-b", node="node-1", index=1, allocations=[{"elasticGPU": "e1", "cores": 30, "memory": 1024}])
    two["metadata"]["resourceVersion"] = "2"
    ledger.observe_gpu(two)
    assert ledger.gpus_holding("e1") == ["gpu-a", "gpu-b"]
    freed = copy.deepcopy(one)
    freed["metadata"]["resourceVersion"] = "3"
    freed["status"]["allocations"] = []
    ledger.observe_gpu(freed)
    assert ledger.gpus_holding("e1") == ["gpu-b"]
    ledger.observe_gpu(one)  # an older copy (a list read before): refused
    assert ledger.gpus_holding("e1") == ["gpu-b"]
    ledger.delete_gpu({**two, "metadata": {**two["metadata"], "resourceVersion": "4"}})
    assert ledger.gpus_holding("e1") == [] and ledger.held("e1") is None
    ledger.observe_gpu(two)  # a copy from before its deletion: refused
    assert ledger.gpus_holding("e1") == []
