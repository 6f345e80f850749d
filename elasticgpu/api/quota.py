"""ElasticGPUQuota: limits on the GPU cores, memory and whole cards a namespace's claims hold,
in all and per class (the ResourceQuota analog, with `<class>.storageclass.storage.k8s.io/...`
style keys: `<class>.elasticgpu.io/gpu-core`).

Why a CRD and not ResourceQuota: Kubernetes' quota admission counts objects and the fields it
knows; it cannot sum fields of a custom resource, so a ResourceQuota with our resource names
would be enforced by the controller alone while its `status.used` belongs to kube-apiserver's
quota controller (which would write zeros over it). A CRD of our own carries who is charged
(`status.charges`, by claim uid) so the controller can guard every charge with the object's
resourceVersion, and `kubectl get egpuquota` shows used/hard (docs/quota.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from elasticgpu.api import cel, names
from elasticgpu.api.errors import InvalidQuantity
from elasticgpu.api.meta import ObjectMeta
from elasticgpu.api.quantities import parse_count, parse_memory_mib
from elasticgpu.api.schema import KubeModel, ResourceValue, crd_field, rule

QUOTA_RESOURCES = (names.RESOURCE_CORE, names.RESOURCE_MEMORY, names.RESOURCE_NVIDIA_GPU)
"""Cores (percent, 100 per whole card), memory (MiB or a quantity), whole cards."""
MAX_KEYS = 64
"""Bounds `spec.hard` (and the CEL cost of its rules): 3 namespace-wide keys and 3 per class."""
_RESOURCE_ALT = "|".join(r.replace(".", "[.]") for r in QUOTA_RESOURCES)
# An optional class-name prefix (a DNS-1123 subdomain and a dot), then one of the resources.
KEY_PATTERN = rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*[.])?({_RESOURCE_ALT})$"
# Memory may be 0 here (a namespace that may hold no memory), so no non-zero digit is required.
_MEMORY_TEXT = cel._MEMORY_TEXT  # the claim's memory syntax, shared so they cannot drift


def _hard_rules(field: str) -> list[dict[str, str]]:
    cores, memory, cards = (f"'{r}'" for r in QUOTA_RESOURCES)
    value = "string(self[k])"
    return [
        rule(
            f"self.all(k, k.matches('{KEY_PATTERN}'))",
            f"{field}: keys must be {', '.join(QUOTA_RESOURCES)}, or <class>.<one of them> for one class,"
            f" e.g. a100.{names.RESOURCE_CORE}",
            reason="FieldValueInvalid",
        ),
        rule(
            f"self.all(k, !(k.endsWith({cores}) || k.endsWith({cards})) || {value}.matches('^[0-9]+$'))",
            f"{field}: {names.RESOURCE_CORE} and {names.RESOURCE_NVIDIA_GPU} must be whole numbers, at least 0"
            " (cores: 100 per card)",
            reason="FieldValueInvalid",
        ),
        rule(
            f"self.all(k, !k.endsWith({memory}) || {value}.matches('{_MEMORY_TEXT}'))",
            f"{field}: {names.RESOURCE_MEMORY} must be MiB or a quantity such as 80Gi, at least 0",
            reason="FieldValueInvalid",
        ),
    ]


def split_key(key: str) -> tuple[str | None, str]:
    """`a100.elasticgpu.io/gpu-core` -> ("a100", "elasticgpu.io/gpu-core"); no class -> None."""
    for resource in QUOTA_RESOURCES:
        if key == resource:
            return None, resource
        if key.endswith("." + resource):
            return key[: -len(resource) - 1], resource
    raise InvalidQuantity(field=key, rule="is not a quota key", fix=f"use {', '.join(QUOTA_RESOURCES)} or"
                          f" <class>.<resource>")


def quota_key(class_name: str | None, resource: str) -> str:
    """The key of `resource` in `spec.hard`, for one class or (None) for the whole namespace."""
    return f"{class_name}.{resource}" if class_name else resource


def parse_amount(resource: str, value: object, *, field: str) -> int:
    """A quota value as an integer: cores and cards as counts, memory in MiB. Raises `InvalidQuantity`."""
    amount = parse_memory_mib(value, field=field) if resource == names.RESOURCE_MEMORY else parse_count(
        value, field=field)
    if amount < 0:
        raise InvalidQuantity(field=field, rule="must be at least 0", value=value)
    return amount


def parse_hard(hard: Mapping[str, object], *, field: str = "spec.hard") -> dict[tuple[str | None, str], int]:
    """`spec.hard` as {(class or None, resource): amount}; raises `InvalidQuantity` naming the key."""
    limits: dict[tuple[str | None, str], int] = {}
    for key, value in hard.items():
        class_name, resource = split_key(key)
        limits[(class_name, resource)] = parse_amount(resource, value, field=f"{field}[{key}]")
    return limits


class ElasticGPUQuotaSpec(KubeModel):
    """The limits."""

    hard: dict[str, ResourceValue] = Field(
        default_factory=dict,
        max_length=MAX_KEYS,
        description=f"Most the namespace's claims may hold: {names.RESOURCE_CORE} (percent, 100 per card),"
        f" {names.RESOURCE_MEMORY} (MiB or a quantity such as 80Gi), {names.RESOURCE_NVIDIA_GPU} (whole cards);"
        f" <class>.<resource> limits the claims of one class, e.g. a100.{names.RESOURCE_CORE}.",
        json_schema_extra=crd_field(**{"x-kubernetes-validations": _hard_rules("spec.hard")}),
    )


class QuotaCharge(KubeModel):
    """What one claim is charged: written before its reservation (the quota's commit point)."""

    claim: str = Field(description="Name of the claim (in the quota's namespace).")
    uid: str = Field(description="Uid of the claim: one charge per claim, however often a bind is retried.")
    class_name: str = Field(default="", description="Class the claim was provisioned with.")
    cores: int = Field(default=0, ge=0, description="Percent of one card's compute (100 per whole card).")
    memory: int = Field(default=0, ge=0, description="MiB of GPU memory.")
    cards: int = Field(default=0, ge=0, description="Whole cards.")
    since: str | None = Field(default=None, description="When the charge was written (RFC 3339).")


class QuotaSummary(KubeModel):
    """used/hard of the namespace-wide keys, for `kubectl get`."""

    cores: str = Field(default="", description="Cores used/hard, e.g. 120/400.")
    memory: str = Field(default="", description="Memory used/hard, e.g. 10Gi/80Gi.")
    cards: str = Field(default="", description="Whole cards used/hard, e.g. 1/4.")


class ElasticGPUQuotaStatus(KubeModel):
    """What the namespace's claims hold, written by the controller."""

    hard: dict[str, ResourceValue] = Field(default_factory=dict, description="The limits last enforced.")
    used: dict[str, ResourceValue] = Field(
        default_factory=dict, description="What the charged claims hold, with the keys of spec.hard."
    )
    charges: list[QuotaCharge] = Field(default_factory=list, description="One entry per claim charged.")
    summary: QuotaSummary = Field(default_factory=QuotaSummary, description="used/hard as text, for columns.")


class ElasticGPUQuota(KubeModel):
    """Limits on the GPU capacity a namespace's claims hold, in all and per class (namespaced)."""

    crd_rules: ClassVar[list[dict[str, str]]] = []

    api_version: str = Field(default=names.API_VERSION, description="elasticgpu.io/v1alpha1")
    kind: str = Field(default=names.KIND_QUOTA, description="ElasticGPUQuota")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ElasticGPUQuotaSpec = Field(default_factory=ElasticGPUQuotaSpec)
    status: ElasticGPUQuotaStatus = Field(default_factory=ElasticGPUQuotaStatus)

    def check(self) -> None:
        """Refuse what the CRD refuses; raises `InvalidQuantity` naming the key."""
        parse_hard(self.spec.hard)
