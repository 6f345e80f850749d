"""Claim groups (gangs, issue 27) against the test API server: all or none, said on every
member, no head-of-line blocking, partial groups (a crash between commits) converge, and two
controller processes racing on one group never leave it partial or a card overcommitted."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from elasticgpu.api import names, timestamps
from elasticgpu.controller.decisions import binder, group_attempts, groups
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from elasticgpu.controller.settings import BindingSettings, ControllerSettings, ResyncSettings
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle
from tests.binding.processes import ControllerProcesses, check_invariants, eventually, wait_quiescent


def _cards(cluster: Cluster, count: int) -> tuple[str, list[str]]:
    """`count` 80 GiB cards on one node, and a class that uses only them."""
    model = f"G{cluster.prefix}"
    gpu_names = [f"gpu-{cluster.prefix}-{i}" for i in range(count)]
    for i, name in enumerate(gpu_names):
        cluster.gpu(o.gpu(name, node=f"{cluster.prefix}-n0", index=i, model=model))
    class_name = f"{cluster.prefix}-gang"
    cluster.klass(o.klass(class_name, parameters={"gpuModel": model}))
    return class_name, gpu_names


def _member(cluster: Cluster, name: str, group: str, minimum: int | str, class_name: str, **request: Any) -> None:
    body = o.claim(name, class_name=class_name, **(request or {"cards": 1}))
    body["metadata"]["labels"] = {names.LABEL_GROUP: group}
    body["metadata"]["annotations"] = {names.ANNOTATION_GROUP_MIN_MEMBERS: str(minimum)}
    cluster.claim(body)


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.get_claim(name).get("status") or {}


def _held_keys(kube: KubeApi, gpu_names: list[str]) -> list[str]:
    return [a["elasticGPU"] for g in gpu_names for a in (kube.get_gpu(g).get("status") or {}).get("allocations") or []]


def test_a_group_that_fits_binds_every_member(cluster: Cluster, kube: KubeApi) -> None:
    class_name, _ = _cards(cluster, 3)
    for i in range(3):
        _member(cluster, f"w{i}", "train", 3, class_name)
    settle(new_controller(kube, cluster.namespace))
    statuses = [_status(cluster, f"w{i}") for i in range(3)]
    assert [s.get("phase") for s in statuses] == ["Bound"] * 3, statuses
    assert len({tuple(s["gpus"]) for s in statuses}) == 3  # a card each


def test_a_group_that_does_not_fit_binds_none_says_why_and_smaller_claims_still_bind(
        cluster: Cluster, kube: KubeApi) -> None:
    class_name, gpu_names = _cards(cluster, 2)
    for i in range(3):
        _member(cluster, f"w{i}", "train", 3, class_name)
    cluster.claim(o.claim("small-a", cores=30, memory="10Gi", class_name=class_name))
    cluster.claim(o.claim("small-b", cores=30, memory="10Gi", class_name=class_name))
    settle(new_controller(kube, cluster.namespace))
    for i in range(3):
        status = _status(cluster, f"w{i}")
        assert status.get("phase") == "Pending", status
        assert status.get("reason") == groups.REASON_GROUP_DOES_NOT_FIT, status
        assert "member w" in status["message"] and "nothing is held" in status["message"], status
    # The short member is named, and it is the same on every member.
    assert len({_status(cluster, f"w{i}")["message"] for i in range(3)}) == 1
    # No head-of-line blocking: the smaller claims bound meanwhile.
    assert [_status(cluster, n).get("phase") for n in ("small-a", "small-b")] == ["Bound", "Bound"]
    # The waiting group holds nothing.
    bound = {cluster.get_claim(n)["spec"]["elasticGPUName"] for n in ("small-a", "small-b")}
    assert set(_held_keys(kube, gpu_names)) == bound


def test_a_group_waits_for_its_minimum_number_of_members(cluster: Cluster, kube: KubeApi) -> None:
    class_name, _ = _cards(cluster, 3)
    controller = new_controller(kube, cluster.namespace)
    _member(cluster, "w0", "train", 3, class_name)
    _member(cluster, "w1", "train", 3, class_name)
    settle(controller)
    for name in ("w0", "w1"):
        status = _status(cluster, name)
        assert (status.get("phase"), status.get("reason")) == ("Pending", groups.REASON_GROUP_INCOMPLETE), status
        assert "has 2 of 3 members" in status["message"], status
    _member(cluster, "w2", "train", 3, class_name)
    settle(controller)
    assert [_status(cluster, f"w{i}").get("phase") for i in range(3)] == ["Bound"] * 3


def test_a_bad_minimum_is_refused_with_the_field_and_the_fix(cluster: Cluster, kube: KubeApi) -> None:
    class_name, _ = _cards(cluster, 1)
    _member(cluster, "w0", "train", "three", class_name)
    settle(new_controller(kube, cluster.namespace))
    status = _status(cluster, "w0")
    assert (status.get("phase"), status.get("reason")) == ("Pending", groups.REASON_INVALID_GROUP), status
    assert names.ANNOTATION_GROUP_MIN_MEMBERS in status["message"] and "'three'" in status["message"], status


def _crash_between_commits(cluster: Cluster, kube: KubeApi, gpu_names: list[str], member: str) -> str:
    """What a controller killed after its first commit of the group leaves: `member`'s
    reservation (old enough to be past the partial-group grace) and nothing else."""
    claim = cluster.get_claim(member)
    key = names.elastic_gpu_name_for_claim(claim["metadata"]["uid"])
    gpu = kube.get_gpu(gpu_names[0])
    gpu["status"] = {"allocations": [{
        "elasticGPU": key, "cores": 100, "memory": gpu["spec"]["memory"], "exclusive": True,
        "reservedAt": "2020-01-01T00:00:00Z",
        "claimRef": {"namespace": cluster.namespace, "name": member, "uid": claim["metadata"]["uid"]},
    }]}
    kube.replace_gpu_status(gpu)
    return key


def test_a_partial_group_found_at_start_is_completed_when_the_rest_fits(cluster: Cluster, kube: KubeApi) -> None:
    class_name, gpu_names = _cards(cluster, 3)
    for i in range(3):
        _member(cluster, f"w{i}", "train", 3, class_name)
    key = _crash_between_commits(cluster, kube, gpu_names, "w1")
    settle(new_controller(kube, cluster.namespace))
    assert [_status(cluster, f"w{i}").get("phase") for i in range(3)] == ["Bound"] * 3
    assert cluster.get_claim("w1")["spec"]["elasticGPUName"] == key  # the reservation found was kept
    check_invariants(kube, cluster.namespace, kube.list_claims(cluster.namespace), gpu_names)


def test_a_partial_group_found_at_start_is_released_when_the_rest_does_not_fit(
        cluster: Cluster, kube: KubeApi) -> None:
    class_name, gpu_names = _cards(cluster, 2)
    for i in range(3):
        _member(cluster, f"w{i}", "train", 3, class_name)
    _crash_between_commits(cluster, kube, gpu_names, "w1")
    settle(new_controller(kube, cluster.namespace))
    assert _held_keys(kube, gpu_names) == []  # released: a waiting group holds nothing
    assert {_status(cluster, f"w{i}").get("reason") for i in range(3)} == {groups.REASON_GROUP_DOES_NOT_FIT}


def _attempt_left(cluster: Cluster, kube: KubeApi, gpu_names: list[str], members: list[str], state: str,
                  reserved_at: str) -> dict[str, str]:
    """What a controller killed between the commits of an attempt leaves: `members`' reservations
    (the first the anchor) on the cards in order, with the attempt's record in `state`.
    Returns GPU name -> reservation key."""
    written = {}
    for member, gpu_name in zip(members, gpu_names, strict=False):
        claim = cluster.get_claim(member)
        key = names.elastic_gpu_name_for_claim(claim["metadata"]["uid"])
        gpu = kube.get_gpu(gpu_name)
        gpu["status"] = {"allocations": [{
            "elasticGPU": key, "cores": 100, "memory": gpu["spec"]["memory"], "exclusive": True,
            "reservedAt": reserved_at,
            "claimRef": {"namespace": cluster.namespace, "name": member, "uid": claim["metadata"]["uid"]},
            "group": {"token": "killed-attempt", "anchor": members[0], "anchorGPU": gpu_names[0],
                      "state": state if member == members[0] else "Committing"},
        }]}
        kube.replace_gpu_status(gpu)
        written[gpu_name] = key
    return written


def _allocations(kube: KubeApi, gpu_names: list[str]) -> list[dict[str, Any]]:
    return [a for g in gpu_names for a in (kube.get_gpu(g).get("status") or {}).get("allocations") or []]


@pytest.mark.parametrize(("state", "written", "cards"), [
    ("Committing", 2, 3),  # killed between commits, the rest fits: rolled back, planned anew, bound
    ("Committing", 2, 2),  # the rest does not fit: rolled back, nothing held
    ("Aborted", 2, 3),  # killed while rolling back: the rest of it is freed, then the group binds
    ("Complete", 3, 3),  # killed after Complete, before the binds: bound on the cards it reserved
])
def test_kill_nine_between_commits_leaves_an_attempt_that_the_next_controller_settles(
        cluster: Cluster, kube: KubeApi, state: str, written: int, cards: int) -> None:
    class_name, gpu_names = _cards(cluster, cards)
    for i in range(3):
        _member(cluster, f"w{i}", "train", 3, class_name)
    left = _attempt_left(cluster, kube, gpu_names, [f"w{i}" for i in range(written)], state,
                         "2020-01-01T00:00:00Z")
    settle(new_controller(kube, cluster.namespace))
    reasons = {_status(cluster, f"w{i}").get("reason") for i in range(3)}
    if cards < 3:
        assert _held_keys(kube, gpu_names) == [], _allocations(kube, gpu_names)
        assert reasons == {groups.REASON_GROUP_DOES_NOT_FIT}, reasons
        return
    assert [_status(cluster, f"w{i}").get("phase") for i in range(3)] == ["Bound"] * 3, reasons
    tokens = {(a.get("group") or {}).get("token") for a in _allocations(kube, gpu_names)}
    if state == "Complete":
        assert {g: k for g in gpu_names for k in _held_keys(kube, [g])} == left  # the cards it reserved
        assert tokens == {"killed-attempt"}
    else:
        assert "killed-attempt" not in tokens, _allocations(kube, gpu_names)  # nothing of it is left
    check_invariants(kube, cluster.namespace, kube.list_claims(cluster.namespace), gpu_names)


def test_a_young_attempt_of_another_controller_is_waited_for_then_rolled_back_past_the_grace(
        cluster: Cluster, kube: KubeApi) -> None:
    """An attempt written just now may be another controller's, mid-way: its members say
    GroupReserving and nothing of it is touched; past the grace it is taken for dead."""
    class_name, gpu_names = _cards(cluster, 3)
    for i in range(3):
        _member(cluster, f"w{i}", "train", 3, class_name)
    _attempt_left(cluster, kube, gpu_names, ["w0", "w1"], "Committing", timestamps.now_rfc3339())
    # The grace runs from the anchor's reservedAt, whole seconds (up to 1 s older than the write),
    # and must outlast the list and settle below: they took 0.9-1.5 s of a 3 s grace at load 4-8,
    # too little room for a CI box that stalls; past the grace the loop below waits for the rollback.
    settings = ControllerSettings(resync=ResyncSettings(orphan_grace_s=60.0),
                                  binding=BindingSettings(group_partial_grace_s=8.0))
    controller = Controller(kube, settings, namespace=cluster.namespace)
    settle(controller)
    assert _status(cluster, "w0").get("reason") == group_attempts.REASON_GROUP_RESERVING, _status(cluster, "w0")
    assert len(_held_keys(kube, gpu_names)) == 2  # untouched
    deadline = time.monotonic() + 30
    while [_status(cluster, f"w{i}").get("phase") for i in range(3)] != ["Bound"] * 3:
        assert time.monotonic() < deadline, [_status(cluster, f"w{i}") for i in range(3)]
        settle(controller)
        time.sleep(0.2)
    assert "killed-attempt" not in {(a.get("group") or {}).get("token") for a in _allocations(kube, gpu_names)}
    check_invariants(kube, cluster.namespace, kube.list_claims(cluster.namespace), gpu_names)


def test_two_controllers_racing_on_groups_leave_none_partial_and_no_card_overcommitted(
        cluster: Cluster, kube: KubeApi, kube_cluster: Any, tmp_path: Path) -> None:
    """Six groups of 3 whole cards and a few small claims on 10 cards: at most 3 groups fit."""
    class_name, gpu_names = _cards(cluster, 10)
    procs = ControllerProcesses(kube_cluster.kubeconfig, cluster.namespace, tmp_path,
                                env={"ELASTICGPU_GROUP_PARTIAL_GRACE_S": "3", "ELASTICGPU_RESYNC_INTERVAL_S": "5"})
    try:
        procs.start()
        procs.start()
        for g in range(6):
            for i in range(3):
                _member(cluster, f"g{g}-w{i}", f"g{g}", 3, class_name)
        for i in range(3):
            cluster.claim(o.claim(f"small-{i}", cores=20, memory="4Gi", class_name=class_name))
        claims = wait_quiescent(
            kube, cluster.namespace, quiet_s=6.0, deadline_s=120.0, procs=procs,
            done=lambda cs: len(cs) == 21 and all((c.get("status") or {}).get("phase") for c in cs))
    finally:
        procs.close()
    check_invariants(kube, cluster.namespace, claims, gpu_names)
    per_group: dict[str, Counter[str]] = {}
    for claim in claims:
        group = (claim["metadata"].get("labels") or {}).get(names.LABEL_GROUP)
        if group:
            per_group.setdefault(group, Counter())[claim["status"]["phase"]] += 1
    for group, phases in per_group.items():
        assert set(phases) in ({"Bound"}, {"Pending"}), f"group {group} is partial: {dict(phases)}"
    assert sum(1 for p in per_group.values() if set(p) == {"Bound"}) >= 2, per_group
    assert all((c["status"]["phase"] == "Bound") for c in claims if c["metadata"]["name"].startswith("small"))


@pytest.mark.parametrize("waiter", ["group", "single"])
def test_a_claim_waiting_past_its_bound_gets_its_nodes_kept_from_smaller_claims(
        cluster: Cluster, kube: KubeApi, waiter: str) -> None:
    """Starvation: with room kept after `group_reserve_after_s`, a smaller claim that would
    take the room freed for the waiter waits instead, and the waiter binds once room frees.
    The same for a group and for a big single claim ("big claims can wait indefinitely")."""
    class_name, _ = _cards(cluster, 2)
    settings = ControllerSettings(resync=ResyncSettings(orphan_grace_s=60.0),
                                  binding=BindingSettings(group_reserve_after_s=1.0))
    controller = Controller(kube, settings, namespace=cluster.namespace)
    cluster.claim(o.claim("s0", cores=60, memory="10Gi", class_name=class_name))
    settle(controller)
    if waiter == "group":
        for i in range(2):
            _member(cluster, f"w{i}", "train", 2, class_name)
        big, reason, kept_for = ["w0", "w1"], groups.REASON_GROUP_DOES_NOT_FIT, "kept for claim group"
    else:
        cluster.claim(o.claim("s0b", cores=60, memory="10Gi", class_name=class_name))
        settle(controller)  # each card has a slice taken now
        cluster.claim(o.claim("big", cores=100, memory="40Gi", class_name=class_name))
        big, reason, kept_for = ["big"], binder.REASON_NO_CAPACITY, f"kept for claim {cluster.namespace}/big"
    settle(controller)
    assert _status(cluster, big[0]).get("reason") == reason
    time.sleep(2.5)  # past the bound (and the condition's one-second timestamps)
    deadline = time.monotonic() + 30
    while not controller.claims.groups.kept_nodes():  # the waiter's own recheck keeps its room
        assert time.monotonic() < deadline, "no room kept for the waiter"
        controller.drain()
        time.sleep(0.05)
    cluster.claim(o.claim("s1", cores=30, memory="10Gi", class_name=class_name))
    settle(controller)
    status = _status(cluster, "s1")
    assert status.get("phase") == "Pending" and kept_for in status.get("message", ""), status
    kube.delete_claim(cluster.namespace, "s0")
    settle(controller)
    assert [_status(cluster, name).get("phase") for name in big] == ["Bound"] * len(big)
    if waiter == "group":
        assert _status(cluster, "s1").get("phase") == "Pending"  # both cards went to the group
    # Bound: its room is no longer kept (s1, now the one starved, may have room kept for it).
    assert all(kept_for not in f"kept for {w}" for w in controller.claims.groups.kept_nodes().values())


def test_kill_nine_between_a_groups_commits_and_restart_converges(
        cluster: Cluster, kube: KubeApi, kube_cluster: Any, tmp_path: Path) -> None:
    """Eight groups of 3 whole cards on 12 cards (room for 4), the controller killed (-9) at
    seeded moments while groups bind and restarted, three times (before the second and third, a
    bound group is deleted so the new incarnation has a group to reserve): in the end no group is partial,
    nothing is held for a waiting group, no card is overcommitted, and 4 groups are bound."""
    rng = random.Random(27)
    class_name, gpu_names = _cards(cluster, 12)
    procs = ControllerProcesses(kube_cluster.kubeconfig, cluster.namespace, tmp_path,
                                env={"ELASTICGPU_GROUP_PARTIAL_GRACE_S": "2", "ELASTICGPU_RESYNC_INTERVAL_S": "3"})
    reserved = lambda: frozenset(_held_keys(kube, gpu_names))  # noqa: E731  (what is held, by whom)
    kills: list[int] = []
    try:
        proc = procs.start()
        for g in range(8):
            for i in range(3):
                _member(cluster, f"g{g}-w{i}", f"g{g}", 3, class_name)
        deleted: set[str] = set()
        for round_ in range(3):
            if round_:
                # Free a bound group's cards, so this incarnation has a waiting group to reserve.
                def bound_group() -> str:
                    found = next((f"g{g}" for g in range(8) if f"g{g}" not in deleted and {
                        _status(cluster, f"g{g}-w{i}").get("phase") for i in range(3)} == {"Bound"}), None)
                    assert found is not None, "no group bound yet"
                    return found

                victim = eventually(bound_group, deadline_s=60, explain=procs.logs)
                deleted.add(victim)
                for i in range(3):
                    kube.delete_claim(cluster.namespace, f"{victim}-w{i}")
            before = reserved()
            deadline = time.monotonic() + 60
            while reserved() == before:  # this incarnation is reserving (or releasing)
                assert time.monotonic() < deadline, "no progress after a restart\n" + procs.logs()
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.05))
            procs.kill(proc)
            kills.append(len(reserved()))
            proc = procs.start()
        claims = wait_quiescent(
            kube, cluster.namespace, quiet_s=6.0, deadline_s=150.0, procs=procs,
            done=lambda cs: sum((c.get("status") or {}).get("phase") == "Bound" for c in cs) == 12
            and len(cs) == 24 - 3 * len(deleted) and all((c.get("status") or {}).get("phase") for c in cs))
    finally:
        procs.close()
    phases = check_invariants(kube, cluster.namespace, claims, gpu_names)
    assert phases == {"Bound": 12, "Pending": 12 - 3 * len(deleted)}, (phases, kills)
    per_group: dict[str, set[str]] = {}
    for claim in claims:
        per_group.setdefault(claim["metadata"]["labels"][names.LABEL_GROUP], set()).add(claim["status"]["phase"])
    assert all(len(p) == 1 for p in per_group.values()), (per_group, kills)
