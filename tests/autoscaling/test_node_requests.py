"""Which placeholder pods the waiting claims need, what their NodeRequested condition says, and
which annotations keep a node (the pure deciders, with property tests for their invariants)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.api import GpuRequest
from elasticgpu.controller.decisions import node_protection, node_requests
from elasticgpu.controller.decisions.node_requests import Waiter


def _share(uid: str, cores: int, memory: int | None = None, *, klass: str = "c", created: str = "") -> Waiter:
    return Waiter(namespace="ns", name=f"claim-{uid}", uid=uid, class_name=klass,
                  request=GpuRequest.share(cores, memory), created=created or uid)


def _whole(uid: str, cards: int) -> Waiter:
    return Waiter(namespace="ns", name=f"claim-{uid}", uid=uid, class_name="c",
                  request=GpuRequest.whole(cards), created=uid)


def test_whole_card_claims_ask_one_node_each_with_their_cards_and_shares_are_packed_into_cards() -> None:
    found = node_requests.asks([_whole("a", 2), _whole("b", 1), *(_share(f"s{i}", 30) for i in range(10))])
    whole = sorted((a.cards, a.claims) for a in found if a.cards > 1 or a.claims[0].startswith("ns/claim-a")
                   or a.claims[0].startswith("ns/claim-b"))
    assert whole == [(1, ("ns/claim-b",)), (2, ("ns/claim-a",))]
    shares = [a for a in found if a.claims[0].startswith("ns/claim-s")]
    # ten shares of 30 cores: four cards (3+3+3+1), not ten
    assert sorted(len(a.claims) for a in shares) == [1, 3, 3, 3]
    assert all(a.cards == 1 for a in shares)


def test_memory_counts_where_the_class_s_cards_are_known() -> None:
    known = [Waiter(namespace="ns", name=f"m{i}", uid=f"m{i}", class_name="c", request=GpuRequest.share(10, 30 * 1024),
                    card_memory_mib=40 * 1024, created=str(i)) for i in range(4)]
    assert len(node_requests.asks(known)) == 4  # 30Gi each on 40Gi cards: one per card, cores aside


def test_classes_and_node_selectors_never_share_a_placeholder() -> None:
    found = node_requests.asks([_share("a", 10, klass="x"), _share("b", 10, klass="y")])
    assert len(found) == 2


def test_the_same_waiting_claims_always_give_the_same_names() -> None:
    waiters = [_share("a", 50), _share("b", 50), _share("c", 50), _whole("d", 1)]
    assert node_requests.asks(waiters) == node_requests.asks(list(reversed(waiters)))
    # claims that bind leave the others' placeholders as they were
    first = {a.name for a in node_requests.asks(waiters)}
    assert {a.name for a in node_requests.asks(waiters[3:])} <= first


def test_a_wait_for_first_consumer_pod_s_claims_ask_one_node_together() -> None:
    pod = [Waiter(namespace="ns", name=f"w{i}", uid=f"w{i}", class_name="c", request=r, pod="ns/trainer",
                  node_selector=(("pool", "a"),), created=str(i))
           for i, r in enumerate((GpuRequest.whole(2), GpuRequest.share(30), GpuRequest.whole(1)))]
    [ask] = node_requests.asks(pod)
    assert (ask.cards, ask.claims, ask.node_selector) == (4, ("ns/w0", "ns/w1", "ns/w2"), (("pool", "a"),))


def test_the_condition_says_which_placeholder_then_which_node_then_gives_a_reason() -> None:
    ask = node_requests.Ask(name="egpu-node-request-1", class_name="c", cards=2, node_selector=(("pool", "gpu"),),
                            claims=("ns/a",))
    state = node_requests.PlaceholderState(name=ask.name, created="", unschedulable="0/3 nodes are available")
    reason, message = node_requests.condition_for(ask, state, resource="nvidia.com/gpu", namespace="sys",
                                                  waited_s=5, give_up_s=900)
    assert reason == "NodeRequested"
    assert "placeholder pod sys/egpu-node-request-1 asks nvidia.com/gpu: 2 on a node with pool=gpu" in message
    reason, message = node_requests.condition_for(ask, state, resource="nvidia.com/gpu", namespace="sys",
                                                  waited_s=901, give_up_s=900)
    assert reason == "NodeNotProvisioned"
    assert "no node came in 901s" in message and "the scheduler says: 0/3 nodes are available" in message
    landed = node_requests.PlaceholderState(name=ask.name, created="", node="gpu-node-7")
    reason, message = node_requests.condition_for(ask, landed, resource="nvidia.com/gpu", namespace="sys",
                                                  waited_s=5000, give_up_s=900)
    assert reason == "NodeRequested" and "node gpu-node-7 came for it" in message


def test_the_placeholder_pod_asks_the_resource_with_the_class_s_node_selector_and_holds_nothing() -> None:
    ask = node_requests.Ask(name="egpu-node-request-1", class_name="c", cards=2, node_selector=(("pool", "gpu"),),
                            claims=("ns/a", "ns/b"))
    pod = node_requests.placeholder_pod(ask, namespace="sys", resource="nvidia.com/gpu", image="pause",
                                        avoid=("old-2", "old-1"))
    # not the nodes whose cards are known (their cards look free to the scheduler), by our label on them:
    # Karpenter ignores a pod with matchFields or kubernetes.io/hostname in its node affinity
    selector = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]  # type: ignore[index]
    assert selector["nodeSelectorTerms"] == [{"matchExpressions": [
        {"key": "elasticgpu.io/node-id", "operator": "NotIn", "values": ["old-1", "old-2"]}]}]
    assert "affinity" not in node_requests.placeholder_pod(ask, namespace="sys", resource="r", image="i")["spec"]  # type: ignore[operator]
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "2"}
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}  # type: ignore[index]
    assert pod["metadata"]["annotations"][node_requests.ANNOTATION_FOR_CLAIMS] == "ns/a,ns/b"  # type: ignore[index]
    assert pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"  # type: ignore[index]


def test_a_node_id_is_its_name_where_that_is_a_label_value_else_a_hash_of_it() -> None:
    assert node_requests.node_id("ip-10-0-3-17.ec2.internal") == "ip-10-0-3-17.ec2.internal"
    long = "kwok-t-aa7cf3a01f4c-gpu-8jmtm-griffinfeather-1-697wqgvq3v-3321533499"  # 69: KWOK's node names
    hashed = node_requests.node_id(long)
    assert hashed == node_requests.node_id(long) != node_requests.node_id(long + "x")
    assert len(hashed) <= 63 and hashed.startswith("h-")


_requests = st.one_of(
    st.builds(GpuRequest.share, st.integers(1, 100), st.one_of(st.none(), st.integers(1, 80 * 1024))),
    st.builds(GpuRequest.whole, st.integers(1, 8)),
)


@given(st.lists(st.tuples(_requests, st.sampled_from(["x", "y"]), st.one_of(st.none(), st.just(81920))),
                max_size=40))
def test_every_waiting_claim_is_in_exactly_one_placeholder_and_no_card_is_overfilled(
        items: list[tuple[GpuRequest, str, int | None]]) -> None:
    waiters = [Waiter(namespace="ns", name=f"c{i}", uid=f"u{i:03}", class_name=k, request=r, card_memory_mib=m,
                      created=f"{i:03}") for i, (r, k, m) in enumerate(items)]
    found = node_requests.asks(waiters)
    claims = [c for a in found for c in a.claims]
    assert sorted(claims) == sorted(w.key for w in waiters)
    assert len({a.name for a in found}) == len(found)
    by_key = {w.key: w for w in waiters}
    for ask in found:
        members = [by_key[c] for c in ask.claims]
        assert {m.class_name for m in members} == {ask.class_name}
        if any(m.request.cards for m in members):
            assert len(members) == 1 and ask.cards == members[0].request.cards
        else:
            assert ask.cards == 1 and sum(m.request.cores for m in members) <= 100
    # never more cards asked than claims waiting for whole cards or shares
    assert sum(a.cards for a in found) <= sum(max(1, w.request.cards) for w in waiters)


_annotations = st.dictionaries(st.sampled_from([*node_protection.PROTECTING, "other/x"]),
                               st.sampled_from(["true", "false"]), max_size=3)


def _apply(annotations: dict[str, str], patch: dict[str, dict[str, str | None]] | None) -> dict[str, str]:
    out = dict(annotations)
    for key, value in (patch or {}).get("annotations", {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


@given(_annotations)
def test_protection_comes_and_goes_and_never_removes_what_an_admin_set(annotations: dict[str, str]) -> None:
    held = _apply(annotations, node_protection.patch(annotations, held=True))
    assert all(held[k] == annotations.get(k, "true") for k in node_protection.PROTECTING)
    assert node_protection.patch(held, held=True) is None  # said once
    freed = _apply(held, node_protection.patch(held, held=False))
    assert freed == annotations  # the admin's annotations are what is left
    assert node_protection.patch(freed, held=False) is None
