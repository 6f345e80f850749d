"""card_sharing.check and holders.running_claims as tables: who may join a card, what is published."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from elasticgpu.agent import holders
from elasticgpu.agent.injecting import card_sharing, hooks
from elasticgpu.agent.injecting.injection import PodRef
from elasticgpu.agent.ledger.store import Allocation
from tests.agent.cri.node import CARDS, slice_claim

CARD = CARDS[0]  # 80 GiB


def holder(name: str, cores: int, memory: int, gpus: tuple[str, ...] = (CARD.uuid,)) -> card_sharing.Holder:
    return card_sharing.Holder(namespace="other", name=name, pods=(PodRef("other", f"pod-{name}", "u"),), gpus=gpus,
                               cores=cores, memory_mib=memory)  # fmt: skip


@pytest.mark.parametrize(
    ("case", "cores", "memory", "running", "refused"),
    [
        ("alone", 30, 10240, [], None),
        ("slices that fit exactly", 40, 40960, [holder("a", 60, 40960)], None),
        ("cores over", 50, 1024, [holder("a", 60, 1024)], "110%"),
        ("memory over", 10, 40960, [holder("a", 10, 40960), holder("b", 10, 1024)], "82944 MiB"),
        ("a whole card running", 10, 1024, [holder("a", 100, 0)], "held whole"),
        ("a whole claim beside a slice", 100, 0, [holder("a", 10, 1024)], "needs it whole"),
        ("holders on another card only", 100, 0, [holder("a", 100, 0, gpus=(CARDS[1].uuid,))], None),
        ("the claim's own rows", 100, 0, [replace(holder("mine", 100, 0), namespace="team")], None),
    ],
)
def test_check(case: str, cores: int, memory: int, running: list[card_sharing.Holder], refused: str | None) -> None:
    claim = slice_claim("team", "mine", user="p", cores=cores, memory_mib=memory)
    kwargs = {"pod": PodRef("team", "p", "u"), "container": "main", "claim": claim, "holders": running,
              "cards": {CARD.uuid.lower(): CARD}}  # fmt: skip
    if refused is None:
        card_sharing.check(**kwargs)  # type: ignore[arg-type]
        return
    with pytest.raises(hooks.Refused) as e:
        card_sharing.check(**kwargs)  # type: ignore[arg-type]
    assert refused in e.value.message, case
    assert "ElasticGPUClaim other/a (pod other/pod-a)" in e.value.message and "kubelet retries" in e.value.message


def row(id_: int, claim: str, pod: str, gpus: tuple[str, ...], minute: int) -> Allocation:
    return Allocation(
        id=id_, state="created", container_id=f"c{id_}", pod_uid="u", pod_namespace="team", pod_name=pod,
        container_name="main", claim_namespace="team", claim_name=claim, elastic_gpu=f"egpu-{claim}",
        gpu_uuids=gpus, cores=100, memory_mib=0, started_at=datetime(2026, 1, 1, 0, minute, tzinfo=UTC),
        created_at=None, released_at=None,
    )  # fmt: skip


def test_running_claims_per_card() -> None:
    a, b = CARDS[0].uuid, CARDS[1].uuid
    published = holders.running_claims([
        row(1, "pair", "p", (a, b), 5), row(2, "pair", "p", (a, b), 3), row(3, "solo", "q", (b,), 9),
    ])  # fmt: skip
    assert published == {
        a.lower(): [{"namespace": "team", "name": "pair", "pods": ["team/p"], "since": "2026-01-01T00:03:00Z"}],
        b.lower(): [{"namespace": "team", "name": "pair", "pods": ["team/p"], "since": "2026-01-01T00:03:00Z"},
                    {"namespace": "team", "name": "solo", "pods": ["team/q"], "since": "2026-01-01T00:09:00Z"}],
    }  # fmt: skip
