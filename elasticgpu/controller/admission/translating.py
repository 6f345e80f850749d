"""Translation at admission (issue 45, docs/translation.md): what the webhook reads of the cluster
to translate a pod's device-plugin resources, and the decision. The reads go through `publishing`
(the only API user); the translation itself is `api.translation` (pure).

Order of the checks, each a refusal naming the field and the fix:
1. the namespace opted in (label `elasticgpu.io/translate-resources: "true"`), else the pod is
   left as it is (a device-plugin node may still run it);
2. no DRA DeviceClass maps a name the pod asks (`extendedResourceName`, KEP-5004): the scheduler
   would allocate a DRA device for it too;
3. no ResourceQuota of the namespace limits a translated name while no ElasticGPUQuota exists:
   once removed, the resources would no longer count against it (a silent bypass);
4. the class (the namespace's `elasticgpu.io/translate-class`, else the default class) exists;
5. each container's request is one elasticgpu can make (`api.translation`).

Cluster-wide facts (classes, cards, DeviceClasses) are cached for `cache_s` seconds: a pod
create must not list every GPU of the cluster. The namespace's own facts (labels, quotas) are
kept only `namespace_cache_s` seconds (2 by default, 0 in tests), so a quota made a moment ago
counts from then on, and a burst of a Deployment's pods costs one read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from elasticgpu.allocator.shapes import model_matches
from elasticgpu.api import names, translation
from elasticgpu.api.errors import InvalidClassParameters, InvalidPodClaims, InvalidSpec
from elasticgpu.api.gpu_class import parse_class_parameters
from elasticgpu.controller.admission.errors import TranslationRefused

logger = logging.getLogger(__name__)


class ClusterReader(Protocol):
    """The reads translation needs (`publishing.AdmissionApi` implements them)."""

    def read_namespace(self, name: str) -> dict[str, Any] | None: ...
    def list_in_namespace(self, plural_path: str, namespace: str) -> list[dict[str, Any]]: ...
    def list_cluster(self, path: str) -> list[dict[str, Any]]: ...


RESOURCE_QUOTAS = "/api/v1/namespaces/{namespace}/resourcequotas"
ELASTIC_QUOTAS = f"/apis/{names.API_VERSION}/namespaces/{{namespace}}/{names.PLURAL_QUOTA}"
CLASSES = f"/apis/{names.API_VERSION}/{names.PLURAL_CLASS}"
GPUS = f"/apis/{names.API_VERSION}/{names.PLURAL_GPU}"
DEVICE_CLASSES = ("/apis/resource.k8s.io/v1/deviceclasses", "/apis/resource.k8s.io/v1beta2/deviceclasses",
                  "/apis/resource.k8s.io/v1beta1/deviceclasses")


@dataclass(frozen=True)
class ClusterFacts:
    """What every translation reads of the cluster, cached."""

    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_class: str | None = None
    gpus: tuple[tuple[str, str, int], ...] = ()
    """(node, model, memory MiB) of every GPU object."""
    dra_mapped: dict[str, str] = field(default_factory=dict)
    """extendedResourceName -> the DeviceClass that maps it."""

    def class_cards(self, class_name: str) -> translation.ClassCards:
        """Cards of the class's models, per node (the class's node selector is the controller's to apply)."""
        body = self.classes.get(class_name) or {}
        try:
            models = parse_class_parameters(body.get("parameters") or {}, class_name=class_name).gpu_model
        except InvalidClassParameters:
            models = ()  # the controller reports the class itself; counting every card refuses nothing wrongly
        per_node: dict[str, int] = {}
        smallest: int | None = None
        for node, model, memory in self.gpus:
            if models and not model_matches(model, models):
                continue
            per_node[node] = per_node.get(node, 0) + 1
            smallest = memory if smallest is None or 0 < memory < smallest else smallest
        return translation.ClassCards(class_name=class_name, most_cards_per_node=max(per_node.values(), default=None),
                                      smallest_card_mib=smallest or None)


@dataclass(frozen=True)
class NamespaceFacts:
    """What translation reads of one namespace."""

    meta: Mapping[str, Any]
    """The Namespace's metadata (labels: the opt-in; annotations: the class)."""
    limited: tuple[str, str] | None
    """(ResourceQuota, its key) that limits a translated name while the namespace has no ElasticGPUQuota."""


_NAMESPACES_KEPT = 4096  # cached namespaces before expired ones are dropped


class Translator:
    """Translates pods for the webhook; thread-safe (one HTTPS thread per connection)."""

    def __init__(self, *, reader: ClusterReader, table: translation.TranslationTable, cache_s: float = 10.0,
                 namespace_cache_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._reader = reader
        self.table = table
        self._cache_s = cache_s
        self._namespace_cache_s = namespace_cache_s
        self._clock = clock
        self._lock = threading.Lock()
        self._facts: ClusterFacts | None = None
        self._read_at = 0.0
        self._namespaces: dict[str, tuple[NamespaceFacts, float]] = {}

    def translate(self, pod: Mapping[str, Any], namespace: str) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        """(JSONPatch, the pod as patched) or None when the pod stays as written; raises `TranslationRefused`
        (and the `errors` of `publishing` when the API cannot be read)."""
        asked = translation.asked_names(pod, self.table)
        if not asked:
            return None
        own = self._namespace_facts(namespace)
        meta = own.meta
        if (meta.get("labels") or {}).get(names.LABEL_TRANSLATE_RESOURCES) != "true":
            return None
        pod_name = _pod_name(pod)
        facts = self._cluster_facts()
        mapped = sorted(name for name in asked if name in facts.dra_mapped)
        if mapped:
            name = mapped[0]
            raise TranslationRefused(
                f"pod {pod_name}: {name}: DeviceClass {facts.dra_mapped[name]} maps it (extendedResourceName,"
                " KEP-5004), so the scheduler would allocate a DRA device for it while elasticgpu claims a card:"
                f" remove the label {names.LABEL_TRANSLATE_RESOURCES} from namespace {namespace} to leave such pods"
                " to DRA, or remove extendedResourceName from the DeviceClass")
        if own.limited is not None:
            quota_name, key = own.limited
            raise TranslationRefused(
                f"pod {pod_name}: ResourceQuota {namespace}/{quota_name} limits {key}, which no longer counts once"
                f" {', '.join(sorted(asked))} is translated into a claim: create an ElasticGPUQuota in namespace"
                f" {namespace} with the same limit ({names.RESOURCE_NVIDIA_GPU} whole cards, {names.RESOURCE_CORE}"
                f" 100 per card; docs/quota.md), or remove the namespace's label {names.LABEL_TRANSLATE_RESOURCES}")
        class_name = self._class_of(meta, facts, namespace, pod_name)
        try:
            done = translation.translate_pod(pod, table=self.table, cards=facts.class_cards(class_name))
        except InvalidPodClaims as error:
            raise TranslationRefused(str(error)) from error
        except InvalidSpec as error:  # an annotation that cannot be read
            raise TranslationRefused(f"pod {pod_name}: {error}") from error
        if not done:
            return None
        logger.info("pod %s/%s: translated %s (namespace opted in)", namespace, pod_name,
                    ", ".join(f"{t.container}: {t.request or 'no GPU'}" for t in done))
        return translation.patch(pod, done), translation.apply(pod, done)

    def _namespace_facts(self, namespace: str) -> NamespaceFacts:
        """The namespace's facts, read again after `namespace_cache_s` (0: for every pod)."""
        now = self._clock()
        with self._lock:
            kept = self._namespaces.get(namespace)
        if kept is not None and now - kept[1] < self._namespace_cache_s:
            return kept[0]
        body = self._reader.read_namespace(namespace) or {}
        facts = NamespaceFacts(meta=body.get("metadata") or {}, limited=self._quota_limit(namespace))
        with self._lock:
            if len(self._namespaces) >= _NAMESPACES_KEPT:
                self._namespaces = {k: v for k, v in self._namespaces.items() if now - v[1] < self._namespace_cache_s}
            self._namespaces[namespace] = (facts, now)
        return facts

    def _quota_limit(self, namespace: str) -> tuple[str, str] | None:
        limited: list[tuple[str, str]] = []
        for quota in self._reader.list_in_namespace(RESOURCE_QUOTAS, namespace):
            hard = (quota.get("spec") or {}).get("hard") or {}
            for key in hard:
                if key.removeprefix("requests.").removeprefix("limits.") in self.table.resources:
                    limited.append(((quota.get("metadata") or {}).get("name", ""), key))
        if not limited:
            return None
        if self._reader.list_in_namespace(ELASTIC_QUOTAS, namespace):
            return None  # the ElasticGPUQuota charges every claim, translated ones included
        return sorted(limited)[0]

    def _class_of(self, meta: Mapping[str, Any], facts: ClusterFacts, namespace: str, pod_name: str) -> str:
        named = (meta.get("annotations") or {}).get(names.ANNOTATION_TRANSLATE_CLASS)
        if named:
            if named not in facts.classes:
                known = ", ".join(sorted(facts.classes)) or "none"
                raise TranslationRefused(
                    f"pod {pod_name}: namespace {namespace} annotation {names.ANNOTATION_TRANSLATE_CLASS}:"
                    " ElasticGPUClass"
                    f" {named} does not exist (classes: {known}): fix the namespace's annotation")
            return str(named)
        if facts.default_class is None:
            raise TranslationRefused(
                f"pod {pod_name}: no class for translated requests: annotate namespace {namespace} with"
                f" {names.ANNOTATION_TRANSLATE_CLASS}: <ElasticGPUClass>, or mark a class"
                f" {names.ANNOTATION_DEFAULT_CLASS}: \"true\"")
        return facts.default_class

    def _cluster_facts(self) -> ClusterFacts:
        with self._lock:
            now = self._clock()
            if self._facts is not None and now - self._read_at < self._cache_s:
                return self._facts
            facts = self._read_cluster()
            self._facts, self._read_at = facts, now
            return facts

    def _read_cluster(self) -> ClusterFacts:
        classes = {str(c["metadata"]["name"]): c for c in self._reader.list_cluster(CLASSES)}
        defaults = sorted(name for name, body in classes.items()
                          if ((body.get("metadata") or {}).get("annotations") or {}).get(
                              names.ANNOTATION_DEFAULT_CLASS) == "true")
        gpus = tuple(
            (str(spec.get("nodeName", "")), str(spec.get("model", "")), int(spec.get("memory") or 0))
            for spec in ((g.get("spec") or {}) for g in self._reader.list_cluster(GPUS)))
        mapped: dict[str, str] = {}
        for path in DEVICE_CLASSES:
            items = self._reader.list_cluster(path)
            for item in items:
                resource = (item.get("spec") or {}).get("extendedResourceName")
                if resource:
                    mapped[str(resource)] = str((item.get("metadata") or {}).get("name", ""))
            if items:
                break  # one served version lists them all
        return ClusterFacts(classes=classes, default_class=defaults[0] if defaults else None, gpus=gpus,
                            dra_mapped=mapped)


def _pod_name(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("name") or metadata.get("generateName") or "")
