"""The pure quota decisions: what fits, the message, the status, and the resync's recompute."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from elasticgpu.allocator import CardShare, Placement, quota
from elasticgpu.api import GPU, ElasticGPUQuota, QuotaCharge, names
from elasticgpu.controller.decisions import quota_holding

CORE, MEMORY, CARDS = names.RESOURCE_CORE, names.RESOURCE_MEMORY, names.RESOURCE_NVIDIA_GPU


def _quota(hard: dict[str, object], charges: list[QuotaCharge] | None = None) -> ElasticGPUQuota:
    return ElasticGPUQuota.model_validate({"metadata": {"name": "team", "namespace": "ns"}, "spec": {"hard": hard},
                                           "status": {"charges": [c.to_dict() for c in charges or []]}})


def _charge(uid: str, cores: int, memory: int = 1024, cards: int = 0, class_name: str = "a100",
            since: str | None = None) -> QuotaCharge:
    return QuotaCharge(claim=f"c-{uid}", uid=uid, class_name=class_name, cores=cores, memory=memory, cards=cards,
                       since=since)


def test_amount_of_a_placement_counts_whole_cards() -> None:
    whole = Placement(node="n", cards=(CardShare(uuid="A", cores=100, memory_mib=81920, whole=True),
                                       CardShare(uuid="B", cores=100, memory_mib=81920, whole=True)))
    assert quota.amount_of(whole) == quota.Amount(cores=200, memory_mib=163840, cards=2)
    share = Placement(node="n", cards=(CardShare(uuid="A", cores=30, memory_mib=10240),))
    assert quota.amount_of(share) == quota.Amount(cores=30, memory_mib=10240, cards=0)


def test_check_names_the_quota_its_use_and_its_limit() -> None:
    model = _quota({CORE: 100, MEMORY: "40Gi"}, [_charge("a", 60)])
    assert isinstance(quota.check([model], uid="b", class_name="a100", amount=quota.Amount(40, 1024)), quota.Fits)
    verdict = quota.check([model], uid="b", class_name="a100", amount=quota.Amount(50, 1024))
    assert isinstance(verdict, quota.Exceeded)
    assert (verdict.quota, verdict.key, verdict.used, verdict.hard) == ("team", CORE, 60, 100)
    assert "ElasticGPUQuota team" in verdict.message and "used 60" in verdict.message
    assert "limit 100" in verdict.message and CORE in verdict.message


def test_a_claim_is_never_refused_for_its_own_charge() -> None:
    model = _quota({CORE: 100}, [_charge("a", 60)])
    assert isinstance(quota.check([model], uid="a", class_name="a100", amount=quota.Amount(60)), quota.Fits)


def test_class_keys_limit_only_their_class() -> None:
    model = _quota({f"a100.{CORE}": 50, f"t4.{CARDS}": 0, MEMORY: "1Ti"}, [_charge("a", 40, class_name="a100")])
    assert isinstance(quota.check([model], uid="b", class_name="t4", amount=quota.Amount(80)), quota.Fits)
    over = quota.check([model], uid="b", class_name="a100", amount=quota.Amount(20))
    assert isinstance(over, quota.Exceeded) and over.key == f"a100.{CORE}" and "class a100" in over.message
    cards = quota.check([model], uid="c", class_name="t4", amount=quota.Amount(100, 1, cards=1))
    assert isinstance(cards, quota.Exceeded) and cards.key == f"t4.{CARDS}"


def test_memory_limits_in_mib_and_shown_as_quantities() -> None:
    model = _quota({MEMORY: "10Gi"}, [_charge("a", 10, memory=8192)])
    verdict = quota.check([model], uid="b", class_name="x", amount=quota.Amount(10, 4096))
    assert isinstance(verdict, quota.Exceeded) and "12Gi" in verdict.message and "limit 10Gi" in verdict.message


def test_an_unreadable_quota_keeps_claims_waiting() -> None:
    model = _quota({CORE: "lots"})
    assert isinstance(quota.check([model], uid="b", class_name="x", amount=quota.Amount(1)), quota.Unreadable)


def test_status_sums_charges_per_key_and_summarises_used_over_hard() -> None:
    model = _quota({CORE: 400, MEMORY: "80Gi", f"a100.{CORE}": 100})
    status = quota.status_with(_quota(model.spec.hard, [_charge("a", 30, memory=10240)]),
                               _charge("b", 100, memory=81920, cards=1, class_name="t4"))
    assert status["used"] == {CORE: 130, MEMORY: "90Gi", f"a100.{CORE}": 30}
    assert status["summary"] == {"cores": "130/400", "memory": "90Gi/80Gi", "cards": "1/-"}
    assert [c["uid"] for c in status["charges"]] == ["a", "b"]  # type: ignore[union-attr]
    again = quota.status_with(_quota(model.spec.hard, [_charge("a", 30, memory=10240)]), _charge("a", 40))
    assert again["used"][CORE] == 40  # type: ignore[index]  # replaced, not added


def test_recompute_charges_reservations_and_drops_stale_charges_after_the_grace() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    old = (now - timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ")
    young = (now - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    model = _quota({CORE: 400}, [_charge("held", 30, since=old), _charge("crashed", 50, since=old),
                                 _charge("binding", 20, since=young), _charge("deleted", 10, since=old)])
    holding = {"held": _charge("held", 30), "before-quota": _charge("before-quota", 40)}
    kept = quota.recompute(model, holding=holding, now=now, grace_s=60)
    assert sorted(c.uid for c in kept) == ["before-quota", "binding", "held"]
    assert next(c for c in kept if c.uid == "held").since == old  # unchanged charges keep their time
    assert quota.lowers(model.status.charges, kept) and not quota.lowers(kept, kept)


def test_recompute_never_lowers_a_young_charge_below_its_reservation_nor_below_what_it_was() -> None:
    """Issue 23, item 1: an expand charged 50 and has not written its GPU yet (the reservation
    read says 30): the charge stays 50 for the grace; after it, it follows the reservation."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    young = (now - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    model = _quota({CORE: 60}, [_charge("a", 50, memory=1024, since=young)])
    kept = quota.recompute(model, holding={"a": _charge("a", 30, memory=4096)}, now=now, grace_s=60)
    assert [(c.cores, c.memory, c.since) for c in kept] == [(50, 4096, young)]  # each resource at least held
    later = quota.recompute(model, holding={"a": _charge("a", 30, memory=4096)}, now=now + timedelta(seconds=90),
                            grace_s=60)
    assert [(c.cores, c.memory) for c in later] == [(30, 4096)]


def _gpu(allocations: list[dict[str, object]], running: list[dict[str, object]] | None = None,
         node: str = "n1") -> GPU:
    return GPU.model_validate({"metadata": {"name": "gpu-a"}, "spec": {
        "index": 0, "uuid": "GPU-A", "model": "A100", "memory": 81920, "nodeName": node},
        "status": {"allocations": allocations, "runningClaims": running or []}})


def _allocation(uid: str, cores: int, namespace: str = "ns") -> dict[str, object]:
    return {"elasticGPU": f"egpu-{uid}", "cores": cores, "memory": 1024,
            "claimRef": {"namespace": namespace, "name": f"c-{uid}", "uid": uid}}


def test_a_namespace_holds_its_reservations_until_freed_unless_handed_to_an_admin() -> None:
    """Issue 23, item 7: a gone claim's reservation is charged while its pods run on the card (and
    while it is not yet freed); a Released-Retain one that nothing runs on is the admin's."""
    running = [{"namespace": "ns", "name": "c-ran", "uid": "ran", "pods": ["ns/p"]}]
    gpu = _gpu([_allocation("live", 30), _allocation("ran", 20), _allocation("retained", 10),
                _allocation("reclaiming", 5), _allocation("other", 40, namespace="other")], running)

    def held(expired: str = "") -> dict[str, int]:
        found = quota_holding.held_by("ns", gpus=[gpu], alive={"live"},
                                      handed=lambda egpu: egpu in {"egpu-ran", "egpu-retained"},
                                      gpu=lambda _name: gpu, expired=lambda _gpu: expired)
        return {uid: h.cores for uid, h in found.items()}

    assert held() == {"live": 30, "ran": 20, "reclaiming": 5}
    # The agent's report is no longer believed (node gone, heartbeat too old): it keeps nothing.
    assert held(expired="node n1 no longer exists") == {"live": 30, "reclaiming": 5}
