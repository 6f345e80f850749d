"""Device-plugin resources read as inline claims (issue 45, docs/translation.md). Pure: no I/O.

A pod written for the NVIDIA device plugin or HAMi asks `resources.limits: nvidia.com/gpu: 1`
(HAMi adds `nvidia.com/gpumem`, `gpumem-percentage`, `gpucores`; time-slicing renames the card
`nvidia.com/gpu.shared`). Where a platform team turns translation on, the webhook removes those
resources from each container and writes the request they mean as the container's inline request
(`elasticgpu.io/request.<container>`), so the scheduler waits for no device plugin and every
claim feature applies. The table of names is data (the chart's `translation.resources`): each name
has one meaning, so another vendor's names are added there without code.

    cards          N whole cards                          (nvidia.com/gpu)
    memoryMiB      MiB on the card of a one-card share    (nvidia.com/gpumem)
    memoryPercent  percent of the card's memory           (nvidia.com/gpumem-percentage)
    corePercent    percent of the card's compute          (nvidia.com/gpucores)
    slice          N slices of `cores` (and `memory`) each (nvidia.com/gpu.shared)

A container's translation either succeeds whole or is refused with the field and the fix: a
fraction without a card (gpumem alone), cores above 100, several cards with a fraction (HAMi's
"N vGPUs on N cards" is not one claim), more cards than any node of the class holds, a memory
percentage with no card of the class known, an annotation that disagrees.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from elasticgpu.api import names, pod_claims
from elasticgpu.api.errors import InvalidPodClaims, InvalidQuantity, InvalidSpec
from elasticgpu.api.quantities import parse_memory_mib
from elasticgpu.api.resources import GpuRequest

Meaning = Literal["cards", "memoryMiB", "memoryPercent", "corePercent", "slice"]
MEANINGS: tuple[Meaning, ...] = ("cards", "memoryMiB", "memoryPercent", "corePercent", "slice")
_FRACTIONS: tuple[Meaning, ...] = ("memoryMiB", "memoryPercent", "corePercent")
CONTAINER_KINDS = ("initContainers", "containers")


class InvalidTranslationTable(InvalidSpec):
    """The table of translated resources (`--translate-resources`, chart `translation.resources`) is wrong."""


class ResourceMeaning(BaseModel):
    """What one extended resource name means."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    meaning: Meaning
    cores: int | None = Field(default=None, ge=1, le=names.CORES_PER_CARD)
    """`slice` only: percent of a card's compute per slice."""
    memory: int | str | None = None
    """`slice` only, optional: memory per slice (MiB or a quantity); absent: in proportion to cores."""


class TranslationTable(BaseModel):
    """Extended resource name -> its meaning."""

    model_config = ConfigDict(frozen=True)

    resources: dict[str, ResourceMeaning]

    def slice_memory_mib(self, name: str) -> int | None:
        """MiB per slice of slice resource `name` (None: in proportion to its cores)."""
        memory = self.resources[name].memory
        return None if memory is None else parse_memory_mib(memory, field=name)


DEFAULT_TABLE: Mapping[str, Mapping[str, object]] = {
    names.RESOURCE_NVIDIA_GPU: {"meaning": "cards"},
    "nvidia.com/gpumem": {"meaning": "memoryMiB"},
    "nvidia.com/gpumem-percentage": {"meaning": "memoryPercent"},
    "nvidia.com/gpucores": {"meaning": "corePercent"},
    # The device plugin's time-slicing with renameByDefault; 4 replicas per card is its common setting.
    "nvidia.com/gpu.shared": {"meaning": "slice", "cores": 25},
}


def parse_table(document: object, *, field: str = "translation.resources") -> TranslationTable:
    """Read and check the table (a mapping name -> {meaning, cores, memory}); raises `InvalidTranslationTable`."""
    if not isinstance(document, Mapping) or not document:
        raise InvalidTranslationTable(field=field, rule="must be a non-empty map of resource name to its meaning",
                                      value=document, fix='e.g. {"nvidia.com/gpu": {"meaning": "cards"}}')
    resources: dict[str, ResourceMeaning] = {}
    for name, entry in document.items():
        where = f"{field}[{name}]"
        if not isinstance(name, str) or not _is_extended_resource(name):
            raise InvalidTranslationTable(
                field=where, rule="must be an extended resource name: <domain>/<name>, not of kubernetes.io or"
                f" {names.GROUP}", value=name, fix="write a vendor's resource name such as nvidia.com/gpu")
        try:
            meaning = ResourceMeaning.model_validate(entry)
        except ValidationError as error:
            problem = error.errors()[0]
            raise InvalidTranslationTable(
                field=f"{where}.{'.'.join(str(p) for p in problem['loc'])}", rule=str(problem["msg"]), value=entry,
                fix="meaning is one of " + ", ".join(MEANINGS) + "; a slice gives cores (1..100) and may give memory",
            ) from error
        if (meaning.meaning == "slice") != (meaning.cores is not None):
            raise InvalidTranslationTable(field=f"{where}.cores", rule="a slice needs cores; only a slice has them",
                                          value=entry, fix="give cores (percent of a card per slice) to slices only")
        if meaning.memory is not None:
            if meaning.meaning != "slice":
                raise InvalidTranslationTable(field=f"{where}.memory", rule="only a slice has memory", value=entry,
                                              fix="remove memory, or make the meaning slice")
            try:
                if parse_memory_mib(meaning.memory, field=f"{where}.memory") < 1:
                    raise InvalidQuantity(field=f"{where}.memory", rule="must be at least 1 MiB", value=entry)
            except InvalidSpec as error:
                raise InvalidTranslationTable(field=error.field, rule=error.rule, value=error.value,
                                              fix=error.fix) from error
        resources[name] = meaning
    return TranslationTable(resources=resources)


def _is_extended_resource(name: str) -> bool:
    domain, slash, rest = name.partition("/")
    if not slash or not rest or "/" in rest or "." not in domain:
        return False
    if domain == names.GROUP or domain.endswith((".kubernetes.io", ".k8s.io")) or domain in ("kubernetes.io", "k8s.io"):
        return False
    return pod_claims.is_dns1123_subdomain(domain) and all(c.isalnum() or c in "-_." for c in rest)


def default_table() -> TranslationTable:
    """The NVIDIA device plugin's and HAMi's names."""
    return parse_table(DEFAULT_TABLE)


@dataclass(frozen=True, kw_only=True)
class ClassCards:
    """What the webhook knows of the cards of the class translated requests use (None: no card known yet)."""

    class_name: str
    most_cards_per_node: int | None = None
    smallest_card_mib: int | None = None


@dataclass(frozen=True, kw_only=True)
class ContainerTranslation:
    """One container's translation: where it is, what was removed, and its request."""

    kind: str
    """`containers` or `initContainers`."""
    index: int
    container: str
    removed: dict[str, dict[str, str]]
    """`limits` / `requests` -> the removed names and values, as written."""
    resources: dict[str, Any]
    """The container's `resources` without them."""
    request: str
    """The inline request it means (`gpu=1,class=a100`); empty when it asks for nothing (`nvidia.com/gpu: 0`)."""
    written: bool
    """True: the webhook writes the request annotation; False: the pod already carried an equal one."""

    def record(self) -> dict[str, Any]:
        """What the pod's `elasticgpu.io/translated` annotation says of this container."""
        entry: dict[str, Any] = {"removed": self.removed, "request": self.request}
        if self.request:
            entry["annotation"] = names.inline_request_annotation(self.container)
        if not self.written and self.request:
            entry["keptAnnotation"] = True
        return entry


def asked_names(pod: Mapping[str, Any], table: TranslationTable) -> set[str]:
    """The table's names any container (init containers included) of `pod` asks for."""
    found: set[str] = set()
    for container in _containers(pod):
        resources = container.get("resources") or {}
        for key in ("limits", "requests"):
            found.update(name for name in resources.get(key) or {} if name in table.resources)
    return found


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [c for kind in CONTAINER_KINDS for c in spec.get(kind) or [] if isinstance(c, Mapping)]


def translate_pod(pod: Mapping[str, Any], *, table: TranslationTable, cards: ClassCards) -> list[ContainerTranslation]:
    """Every container's translation (containers without a table name are left out).

    Raises `InvalidPodClaims` with every problem of the pod, each naming the field and the fix."""
    metadata = pod.get("metadata") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    problems: list[InvalidSpec] = []
    done: list[ContainerTranslation] = []
    spec = pod.get("spec") or {}
    for kind in CONTAINER_KINDS:
        for index, container in enumerate(spec.get(kind) or []):
            try:
                translated = translate_container(container, kind=kind, index=index, table=table, cards=cards,
                                                 annotations=annotations)
            except InvalidSpec as problem:
                problems.append(problem)
                continue
            if translated is not None:
                done.append(translated)
    if problems:
        raise InvalidPodClaims(problems, pod=metadata.get("name") or metadata.get("generateName") or "")
    return done


def translate_container(
    container: Mapping[str, Any], *, kind: str, index: int, table: TranslationTable, cards: ClassCards,
    annotations: Mapping[str, str],
) -> ContainerTranslation | None:
    """One container's translation, None when it asks for no name of the table; raises `InvalidSpec`."""
    name = str(container.get("name", ""))
    where = f"spec.{kind}[{name}].resources"
    resources: Mapping[str, Any] = container.get("resources") or {}
    removed: dict[str, dict[str, str]] = {}
    kept: dict[str, Any] = {key: value for key, value in resources.items() if key not in ("limits", "requests")}
    for key in ("limits", "requests"):
        values = resources.get(key) or {}
        ours = {k: str(v) for k, v in values.items() if k in table.resources}
        if ours:
            removed[key] = ours
        rest = {k: v for k, v in values.items() if k not in table.resources}
        if rest:
            kept[key] = rest
    if not removed:
        return None
    asked = _amounts(removed, where)
    request = _request_of(asked, table=table, cards=cards, where=where)
    text = _inline_text(request, cards.class_name) if request is not None else ""
    written = True
    reference = annotations.get(names.claim_annotation(name))
    if reference is not None:
        first = next(iter(asked))
        raise InvalidSpec(
            field=f"{where}.limits[{first}]", rule=f"container {name!r} also names claim {reference!r} in"
            f" {pod_claims.annotation_field(names.claim_annotation(name))}",
            fix="a container uses one claim: remove the GPU resources, or the annotation")
    inline_key = names.inline_request_annotation(name)
    if inline_key in annotations:
        first = next(iter(asked))
        existing = pod_claims.parse_inline_request(inline_key, name, annotations[inline_key])
        mine = pod_claims.parse_inline_request(inline_key, name, text) if text else None
        if mine is None or existing.request != mine.request:
            raise InvalidSpec(
                field=f"{where}.limits[{first}]",
                rule=f"means {mine.request.describe() if mine else 'no GPU'}, but"
                f" {pod_claims.annotation_field(inline_key)} asks {existing.request.describe()}",
                fix="keep one of the two: remove the GPU resources, or the annotation")
        text, written = annotations[inline_key], False
    return ContainerTranslation(kind=kind, index=index, container=name, removed=removed, resources=kept,
                                request=text, written=written)


def _amounts(removed: Mapping[str, Mapping[str, str]], where: str) -> dict[str, int]:
    """Name -> the amount asked; limits and requests must agree (the API server requires it of extended resources)."""
    asked: dict[str, int] = {}
    for key in ("limits", "requests"):
        for name, text in (removed.get(key) or {}).items():
            field = f"{where}.{key}[{name}]"
            amount = quantity_count(text)
            if amount is None:
                raise InvalidSpec(field=field, rule="must be a whole number", value=text, fix="write a count such as 1")
            if amount < 0:
                raise InvalidSpec(field=field, rule="must be at least 0", value=text, fix="write a count such as 1")
            if name in asked and asked[name] != amount:
                raise InvalidSpec(field=field, rule=f"differs from limits[{name}] ({asked[name]})", value=text,
                                  fix="an extended resource's request equals its limit: write one of them")
            asked[name] = amount
    return asked


_SUFFIXES: Mapping[str, int] = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:[eE]([+-]?[0-9]+)|(m|k|[KMGTPE]i|[MGTPE]|))$")


def quantity_count(text: str) -> int | None:
    """A Kubernetes quantity as a whole count (the API server stores `3000` as `3k`), None when it is not one."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    value = Decimal(number)
    if exponent is not None:
        value = value.scaleb(int(exponent))
    elif suffix == "m":
        value = value / 1000
    elif suffix in _SUFFIXES:
        value = value * _SUFFIXES[suffix]
    else:
        return None
    return int(value) if value == value.to_integral_value() else None


def _request_of(asked: Mapping[str, int], *, table: TranslationTable, cards: ClassCards,
                where: str) -> GpuRequest | None:
    by_meaning: dict[Meaning, tuple[str, int]] = {}
    for name in sorted(asked):
        meaning = table.resources[name].meaning
        if meaning in by_meaning:
            other = by_meaning[meaning][0]
            raise InvalidSpec(field=f"{where}.limits[{name}]", rule=f"means {meaning}, as {other} does",
                              fix=f"keep one of {other} and {name}")
        by_meaning[meaning] = (name, asked[name])

    def field(meaning: Meaning) -> str:
        return f"{where}.limits[{by_meaning[meaning][0]}]"

    if "slice" in by_meaning:
        name, units = by_meaning["slice"]
        others = sorted(n for m, (n, _) in by_meaning.items() if m != "slice")
        if others:
            raise InvalidSpec(field=field("slice"), rule=f"a slice stands alone, but {', '.join(others)} is asked too",
                              fix=f"ask {name} alone, or the card and its fractions without it")
        if units == 0:
            return None
        per = table.resources[name].cores or 0
        if units * per > names.CORES_PER_CARD:
            raise InvalidSpec(field=field("slice"), rule=f"{units} slices of {per}% cores are more than one card",
                              value=units, fix=f"ask at most {names.CORES_PER_CARD // per}, or whole cards")
        memory = table.slice_memory_mib(name)
        return GpuRequest.share(units * per, None if memory is None else units * memory)
    fractions = [m for m in _FRACTIONS if m in by_meaning]
    count = by_meaning.get("cards", ("", 0 if fractions else -1))[1]
    if "cards" not in by_meaning:
        first = fractions[0]
        raise InvalidSpec(field=field(first), rule="a fraction of a card needs the card itself",
                          fix=f"add {_cards_name(table)}: 1 beside it (HAMi's form)")
    if count == 0:
        if fractions:
            raise InvalidSpec(field=field("cards"), rule="asks no card, but a fraction of one", value=0,
                              fix="ask 1 card with its fractions, or remove the fractions")
        return None
    if fractions and count > 1:
        raise InvalidSpec(
            field=field("cards"), rule=f"{count} cards with a fraction of each: a claim's share lives on one card",
            value=count, fix="ask 1 card per container with its fractions, or drop the fractions for whole cards")
    if not fractions:
        most = cards.most_cards_per_node
        if most is not None and count > most:
            raise InvalidSpec(field=field("cards"), rule=f"no node of class {cards.class_name} holds {count} cards"
                              f" (the most on one node: {most})", value=count,
                              fix=f"ask at most {most}, or use a class whose nodes hold more")
        return GpuRequest.whole(count)
    return _share(by_meaning, cards=cards, field=field)


def _share(by_meaning: Mapping[Meaning, tuple[str, int]], *, cards: ClassCards, field: Any) -> GpuRequest:
    cores = 0
    if "corePercent" in by_meaning:
        cores = by_meaning["corePercent"][1]
        if not 1 <= cores <= names.CORES_PER_CARD:
            raise InvalidSpec(field=field("corePercent"), rule="is percent of one card's compute: 1 to 100",
                              value=cores, fix="write 1 to 100; for more, ask whole cards without it")
    if "memoryMiB" in by_meaning and "memoryPercent" in by_meaning:
        also = by_meaning["memoryMiB"][0]
        raise InvalidSpec(field=field("memoryPercent"), rule=f"memory is given twice (also {also})",
                          fix="keep one of the two")
    memory: int | None = None
    if "memoryMiB" in by_meaning:
        memory = by_meaning["memoryMiB"][1]
        if memory < 1:
            raise InvalidSpec(field=field("memoryMiB"), rule="must be at least 1 MiB", value=memory,
                              fix="write the MiB the container needs on its card")
    elif "memoryPercent" in by_meaning:
        percent = by_meaning["memoryPercent"][1]
        if not 1 <= percent <= 100:
            raise InvalidSpec(field=field("memoryPercent"), rule="is percent of the card's memory: 1 to 100",
                              value=percent, fix="write 1 to 100")
        if cards.smallest_card_mib is None:
            raise InvalidSpec(field=field("memoryPercent"), rule=f"no card of class {cards.class_name} is known yet,"
                              " so a percentage of its memory has no size", value=percent,
                              fix="write the memory in MiB (nvidia.com/gpumem), or retry once its nodes report cards")
        memory = max(1, cards.smallest_card_mib * percent // 100)
    if cores == 0 and memory is None:  # cannot happen: a fraction is there; kept for the type checker
        raise InvalidSpec(field=field("cards"), rule="asks nothing", fix="ask cores or memory")
    return GpuRequest.share(cores, memory)


def _cards_name(table: TranslationTable) -> str:
    whole = sorted(n for n, m in table.resources.items() if m.meaning == "cards")
    return whole[0] if whole else names.RESOURCE_NVIDIA_GPU


def _inline_text(request: GpuRequest, class_name: str) -> str:
    """The inline request annotation's value for `request` (pod_claims reads it back the same)."""
    if request.is_whole:
        parts = [f"gpu={request.cards}"]
    else:
        parts = [f"gpu-core={request.cores}"] if request.cores else []
        if request.memory_mib is not None:
            parts.append(f"gpu-memory={request.memory_mib}")
    if class_name:
        parts.append(f"class={class_name}")
    return ",".join(parts)


def record(translations: list[ContainerTranslation]) -> str:
    """The `elasticgpu.io/translated` annotation: readable JSON, per container."""
    return json.dumps({t.container: t.record() for t in translations}, sort_keys=True, separators=(", ", ": "))


def json_pointer(key: str) -> str:
    """`key` as one JSON-pointer segment (`/` is `~1`)."""
    return key.replace("~", "~0").replace("/", "~1")


def patch(pod: Mapping[str, Any], translations: list[ContainerTranslation]) -> list[dict[str, Any]]:
    """The JSONPatch that removes the resources and writes the requests and the record."""
    ops: list[dict[str, Any]] = [
        {"op": "replace", "path": f"/spec/{t.kind}/{t.index}/resources", "value": t.resources} for t in translations
    ]
    added = {names.inline_request_annotation(t.container): t.request for t in translations if t.written and t.request}
    added[names.ANNOTATION_TRANSLATED] = record(translations)
    annotations = (pod.get("metadata") or {}).get("annotations")
    if annotations is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": added})
    else:
        ops.extend({"op": "add", "path": f"/metadata/annotations/{json_pointer(k)}", "value": v}
                   for k, v in added.items())
    return ops


def apply(pod: Mapping[str, Any], translations: list[ContainerTranslation]) -> dict[str, Any]:
    """`pod` as `patch` leaves it (a copy), for the checks that follow translation."""
    spec = dict(pod.get("spec") or {})
    for kind in CONTAINER_KINDS:
        if kind in spec:
            spec[kind] = [dict(c) for c in spec[kind]]
    for t in translations:
        spec[t.kind][t.index]["resources"] = t.resources
    metadata = dict(pod.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    annotations.update({names.inline_request_annotation(t.container): t.request
                        for t in translations if t.written and t.request})
    annotations[names.ANNOTATION_TRANSLATED] = record(translations)
    metadata["annotations"] = annotations
    return {**pod, "metadata": metadata, "spec": spec}
