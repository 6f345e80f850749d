"""The translation of device-plugin resources into inline requests (api/translation.py): pure, no server.

Invariants (hypothesis): whatever a container asks, the translation either is refused with a field of
that container or writes a request that the inline-request reader (the one the controller and the
agent use) reads back as the same request; only the table's names leave the container, every other
resource stays; translating the translated pod changes nothing; whole cards are 100 cores each.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.api import names, pod_claims, translation
from elasticgpu.api.errors import InvalidPodClaims, InvalidSpec

TABLE = translation.default_table()
CARDS = translation.ClassCards(class_name="a100", most_cards_per_node=8, smallest_card_mib=81920)
INLINE = names.ANNOTATION_INLINE_REQUEST_PREFIX


def _pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p"}
    if annotations is not None:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": metadata, "spec": spec}


def _asks(name: str, resources: dict[str, object], requests: dict[str, object] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"limits": {k: str(v) for k, v in resources.items()}}
    if requests is not None:
        body["requests"] = {k: str(v) for k, v in requests.items()}
    return {"name": name, "image": "x", "resources": body}


def _translate(pod: dict[str, Any], cards: translation.ClassCards = CARDS) -> dict[str, str]:
    done = translation.translate_pod(pod, table=TABLE, cards=cards)
    return {t.container: t.request for t in done}


def _refusal(pod: dict[str, Any], cards: translation.ClassCards = CARDS) -> str:
    with pytest.raises(InvalidPodClaims) as caught:
        translation.translate_pod(pod, table=TABLE, cards=cards)
    return str(caught.value)


# --- what each form means ----------------------------------------------------------------------


def test_whole_cards_and_the_class() -> None:
    pod = _pod(_asks("main", {"nvidia.com/gpu": 2, "cpu": "1"}))
    assert _translate(pod) == {"main": "gpu=2,class=a100"}


def test_hami_slice_forms() -> None:
    assert _translate(_pod(_asks("m", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}))
                      ) == {"m": "gpu-core=30,gpu-memory=3000,class=a100"}
    assert _translate(_pod(_asks("m", {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25}))
                      ) == {"m": "gpu-memory=20480,class=a100"}  # 25% of the class's smallest card
    assert _translate(_pod(_asks("m", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 50}))
                      ) == {"m": "gpu-core=50,class=a100"}  # memory in proportion to cores


def test_time_slicing_replicas() -> None:
    assert _translate(_pod(_asks("m", {"nvidia.com/gpu.shared": 2}))) == {"m": "gpu-core=50,class=a100"}


def test_init_containers_and_sidecars_get_their_own_requests() -> None:
    sidecar = {**_asks("proxy", {"nvidia.com/gpu": 1}), "restartPolicy": "Always"}
    pod = _pod(_asks("main", {"nvidia.com/gpu": 1}), _asks("web", {"cpu": 1}),
               init=(_asks("warm", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 10}), sidecar))
    assert _translate(pod) == {"main": "gpu=1,class=a100", "warm": "gpu-core=10,class=a100",
                               "proxy": "gpu=1,class=a100"}
    patch = translation.patch(pod, translation.translate_pod(pod, table=TABLE, cards=CARDS))
    paths = [op["path"] for op in patch]
    assert "/spec/initContainers/0/resources" in paths and "/spec/initContainers/1/resources" in paths
    assert "/spec/containers/1/resources" not in paths  # asks nothing: untouched


@pytest.mark.parametrize(("resources", "field", "words"), [
    ({"nvidia.com/gpumem": 3000}, "limits[nvidia.com/gpumem]", "add nvidia.com/gpu: 1"),
    ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}, "limits[nvidia.com/gpucores]", "1 to 100"),
    ({"nvidia.com/gpu": 9}, "limits[nvidia.com/gpu]", "the most on one node: 8"),
    ({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000}, "limits[nvidia.com/gpu]", "1 card per container"),
    ({"nvidia.com/gpu.shared": 5}, "limits[nvidia.com/gpu.shared]", "ask at most 4"),
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1, "nvidia.com/gpumem-percentage": 5}, "gpumem-percentage",
     "keep one"),
])
def test_refusals_name_the_field_and_the_fix(resources: dict[str, object], field: str, words: str) -> None:
    message = _refusal(_pod(_asks("main", resources)))
    assert f"spec.containers[main].resources.{field}" in message or field in message, message
    assert words in message, message


def test_a_disagreeing_annotation_is_refused_an_equal_one_kept() -> None:
    annotations = {f"{INLINE}main": "gpu-core=30"}
    message = _refusal(_pod(_asks("main", {"nvidia.com/gpu": 1}), annotations=annotations))
    assert f"metadata.annotations[{INLINE}main] asks 30% cores" in message and "keep one of the two" in message
    same = {f"{INLINE}main": "gpu=1"}
    done = translation.translate_pod(_pod(_asks("main", {"nvidia.com/gpu": 1}), annotations=same), table=TABLE,
                                     cards=CARDS)
    assert [(t.request, t.written) for t in done] == [("gpu=1", False)]
    named = {f"{names.ANNOTATION_CLAIM_PREFIX}main": "mine"}
    assert "also names claim 'mine'" in _refusal(_pod(_asks("main", {"nvidia.com/gpu": 1}), annotations=named))


def test_memory_percentage_needs_a_known_card() -> None:
    unknown = translation.ClassCards(class_name="a100")
    message = _refusal(_pod(_asks("m", {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 10})), unknown)
    assert "no card of class a100 is known yet" in message
    # Whole cards with no card known: admitted (the claim waits for the class's nodes, Pending with its reason).
    assert _translate(_pod(_asks("m", {"nvidia.com/gpu": 64})), unknown) == {"m": "gpu=64,class=a100"}


def test_the_record_says_what_was_removed() -> None:
    pod = _pod(_asks("main", {"nvidia.com/gpu": 1}, requests={"nvidia.com/gpu": 1, "cpu": "2"}), annotations={})
    done = translation.translate_pod(pod, table=TABLE, cards=CARDS)
    after = translation.apply(pod, done)
    assert after["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "2"}}
    assert after["metadata"]["annotations"][f"{INLINE}main"] == "gpu=1,class=a100"
    assert json.loads(after["metadata"]["annotations"][names.ANNOTATION_TRANSLATED]) == {"main": {
        "annotation": f"{INLINE}main", "request": "gpu=1,class=a100",
        "removed": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}}


# --- the table ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("table", "words"), [
    ({}, "non-empty map"),
    ({"gpu": {"meaning": "cards"}}, "extended resource name"),
    ({"elasticgpu.io/gpu-core": {"meaning": "corePercent"}}, "extended resource name"),
    ({"amd.com/gpu": {"meaning": "cardz"}}, "meaning"),
    ({"amd.com/gpu": {"meaning": "slice"}}, "a slice needs cores"),
    ({"amd.com/gpu": {"meaning": "cards", "memory": "1Gi"}}, "only a slice has memory"),
    ({"amd.com/gpu": {"meaning": "slice", "cores": 101}}, "less than or equal to 100"),
    ({"amd.com/gpu": {"meaning": "slice", "cores": 10, "memory": "lots"}}, "not a quantity"),
])
def test_a_bad_table_is_refused_with_the_entry(table: dict[str, Any], words: str) -> None:
    with pytest.raises(translation.InvalidTranslationTable) as caught:
        translation.parse_table(table)
    assert words in str(caught.value) and "translation.resources" in str(caught.value)


def test_another_vendor_is_one_line_of_the_table() -> None:
    table = translation.parse_table({**translation.DEFAULT_TABLE, "amd.com/gpu": {"meaning": "cards"},
                                     "example.com/vgpu": {"meaning": "slice", "cores": 10, "memory": "4Gi"}})
    done = translation.translate_pod(_pod(_asks("a", {"amd.com/gpu": 2}), _asks("b", {"example.com/vgpu": 3})),
                                     table=table, cards=CARDS)
    assert {t.container: t.request for t in done} == {
        "a": "gpu=2,class=a100", "b": "gpu-core=30,gpu-memory=12288,class=a100"}


# --- invariants --------------------------------------------------------------------------------

_NAMES = [*TABLE.resources, "cpu", "memory", "example.com/fpga"]
_amounts = st.integers(min_value=0, max_value=160)


@st.composite
def _containers(draw: st.DrawFn) -> dict[str, Any]:
    asked = draw(st.dictionaries(st.sampled_from(_NAMES), _amounts, max_size=4))
    return _asks(draw(st.sampled_from(["a", "b", "c"])), asked)


@given(st.lists(_containers(), min_size=1, max_size=3, unique_by=lambda c: c["name"]),
       st.sampled_from([CARDS, translation.ClassCards(class_name="t4", most_cards_per_node=2, smallest_card_mib=15360),
                        translation.ClassCards(class_name="new")]))
def test_a_translation_is_refused_or_reads_back_as_the_same_request(
    containers: list[dict[str, Any]], cards: translation.ClassCards
) -> None:
    pod = _pod(*containers)
    try:
        done = translation.translate_pod(pod, table=TABLE, cards=cards)
    except InvalidPodClaims as refused:
        for problem in refused.problems:
            assert problem.field.startswith("spec.containers[") and problem.fix, problem
        return
    after = translation.apply(pod, done)
    # Only the table's names left; everything else as written.
    for before, now in zip(pod["spec"]["containers"], after["spec"]["containers"], strict=True):
        for key in ("limits", "requests"):
            kept = {k: v for k, v in (before["resources"].get(key) or {}).items() if k not in TABLE.resources}
            assert (now["resources"].get(key) or {}) == kept
    assert translation.asked_names(after, TABLE) == set()
    # The controller reads the written requests as the request the resources meant.
    claims = pod_claims.read_pod_claims(after)
    for request in claims.inline:
        assert request.spec.elastic_gpu_class_name == cards.class_name
        if request.request.is_whole:
            assert request.request.cores == 100 * request.request.cards
            most = cards.most_cards_per_node
            assert most is None or request.request.cards <= most
        else:
            assert 1 <= request.request.cores <= 100 or request.request.memory_mib
    assert {r.container for r in claims.inline} == {t.container for t in done if t.request}
    # Translating again changes nothing.
    assert translation.translate_pod(after, table=TABLE, cards=cards) == []


@given(st.integers(min_value=1, max_value=8))
def test_whole_cards_are_the_count_asked(count: int) -> None:
    done = translation.translate_pod(_pod(_asks("m", {"nvidia.com/gpu": count})), table=TABLE, cards=CARDS)
    request = pod_claims.parse_inline_request(f"{INLINE}m", "m", done[0].request).request
    assert request.cards == count and request.cores == 100 * count


def test_invalid_spec_is_the_base_of_a_table_error() -> None:
    assert issubclass(translation.InvalidTranslationTable, InvalidSpec)


@pytest.mark.parametrize(("text", "count"), [("1", 1), ("3k", 3000), ("2Ki", 2048), ("1e3", 1000), ("2000m", 2),
                                             ("1.5", None), ("500m", None), ("x", None), ("1.5k", 1500)])
def test_counts_as_the_api_server_stores_them(text: str, count: int | None) -> None:
    assert translation.quantity_count(text) == count


@st.composite
def _tables(draw: st.DrawFn) -> translation.TranslationTable:
    """A valid table of 1-5 made-up vendors' names, each with a meaning (slices with cores, maybe memory)."""
    entries: dict[str, dict[str, object]] = {}
    for index in range(draw(st.integers(min_value=1, max_value=5))):
        meaning = draw(st.sampled_from(translation.MEANINGS))
        entry: dict[str, object] = {"meaning": meaning}
        if meaning == "slice":
            entry["cores"] = draw(st.integers(min_value=1, max_value=100))
            if draw(st.booleans()):
                entry["memory"] = f"{draw(st.integers(min_value=1, max_value=16))}Gi"
        entries[f"vendor{index}.example.com/r{index}"] = entry
    return translation.parse_table(entries)


@given(_tables(), st.data())
def test_any_table_translates_only_its_names_into_requests_that_read_back(
    table: translation.TranslationTable, data: st.DataObject
) -> None:
    names_ = [*table.resources, "cpu", "other.example.com/fpga"]
    asked = data.draw(st.dictionaries(st.sampled_from(names_), _amounts, min_size=1, max_size=4))
    pod = _pod(_asks("main", asked))
    # The table is data: its JSON form (what the chart passes as --translate-resources) reads back the same.
    assert translation.parse_table({n: m.model_dump(exclude_none=True) for n, m in table.resources.items()}) == table
    try:
        done = translation.translate_pod(pod, table=table, cards=CARDS)
    except InvalidPodClaims as refused:
        assert all(p.field.startswith("spec.containers[main].resources.") and p.fix for p in refused.problems)
        return
    after = translation.apply(pod, done)
    left = after["spec"]["containers"][0]["resources"].get("limits") or {}
    assert left == {k: str(v) for k, v in asked.items() if k not in table.resources}
    if any(k in table.resources for k in asked):
        assert len(done) == 1
        if done[0].request:
            request = pod_claims.parse_inline_request(f"{INLINE}main", "main", done[0].request).request
            assert request.is_whole or 0 <= request.cores <= 100
    else:
        assert done == []
