"""Which claims a pod uses, read from its annotations (DESIGN.md, "Pods").

Two annotations per container, at most one of them:

- `egpuc.elasticgpu.io/<container>: <claim>` names a claim of the pod's namespace; several
  containers of one pod may name the same claim.
- `elasticgpu.io/request.<container>: "gpu-core=30,gpu-memory=10Gi[,class=NAME]"` is an inline
  request: the controller makes a claim `<pod>-<container>` owned by the pod (a generic
  ephemeral volume's analog). Keys are `gpu-core`, `gpu-memory`, `gpu` (whole cards, as
  `nvidia.com/gpu`), the full resource names, and `class`.

An inline request is checked by building the `ElasticGPUClaimSpec` the controller will create
and normalising it with `ElasticGPUClaimSpec.gpu_request` (`resources.parse_claim_resources`):
the same rules as a claim written by hand, one implementation. Every problem of a pod is
collected into one `InvalidPodClaims`, each naming the annotation, the rule and the fix.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from elasticgpu.api import names
from elasticgpu.api.claim import ElasticGPUClaimSpec
from elasticgpu.api.errors import InvalidPodClaims, InvalidSpec
from elasticgpu.api.resources import GpuRequest

# DNS-1123 subdomain: what the API server requires of a custom object's name (and a class's).
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_SUBDOMAIN_MAX = 253
INLINE_CLAIM_NAME_MAX = 63
"""An inline claim's name is at most 63 characters: the provisioner copies a claim's name into
the label `elasticgpu.io/claim-name` of its ElasticGPU, and label values stop at 63."""
_HASH_CHARS = 10  # 40 bits of sha256: collisions need ~10^6 long names sharing one 52-char head

# Keys of an inline request and the resource each one stands for.
INLINE_KEYS: Mapping[str, str] = {
    "gpu-core": names.RESOURCE_CORE,
    "gpu-memory": names.RESOURCE_MEMORY,
    "gpu": names.RESOURCE_NVIDIA_GPU,
    **{resource: resource for resource in names.KNOWN_RESOURCES},
}
INLINE_CLASS_KEY = "class"
INLINE_FORMAT = "gpu-core=30,gpu-memory=10Gi[,class=NAME]"


class ClaimReference(BaseModel):
    """Container `container` uses the existing claim `claim_name` of the pod's namespace."""

    model_config = ConfigDict(frozen=True)

    container: str
    claim_name: str


class InlineRequest(BaseModel):
    """Container `container` asks for a claim of its own, made from `spec` and owned by the pod."""

    model_config = ConfigDict(frozen=True)

    container: str
    text: str
    """The annotation's value as written."""
    spec: ElasticGPUClaimSpec
    """The spec of the claim the controller creates; valid by the CRD's rules."""
    request: GpuRequest
    """`spec` normalised (what the allocator reads)."""

    def claim_name(self, pod_name: str) -> str:
        """Name of this request's claim for pod `pod_name` (see `inline_claim_name`)."""
        return inline_claim_name(pod_name, self.container)


class PodClaims(BaseModel):
    """Every claim a pod uses, one entry per container that uses one."""

    model_config = ConfigDict(frozen=True)

    references: tuple[ClaimReference, ...] = ()
    inline: tuple[InlineRequest, ...] = ()

    @property
    def is_empty(self) -> bool:
        """True when no container of the pod uses a claim."""
        return not self.references and not self.inline

    def claims_by_container(self, pod_name: str) -> dict[str, str]:
        """Container -> name of the claim it uses (inline claims named for `pod_name`)."""
        used = {reference.container: reference.claim_name for reference in self.references}
        used.update({request.container: request.claim_name(pod_name) for request in self.inline})
        return dict(sorted(used.items()))

    def claim_names(self, pod_name: str) -> list[str]:
        """Names of the claims the pod uses, each once, sorted."""
        return sorted(set(self.claims_by_container(pod_name).values()))


def annotation_field(key: str) -> str:
    """The field path of an annotation, as error messages name it."""
    return f"metadata.annotations[{key}]"


def is_claim_annotation(key: str) -> bool:
    """True for the annotations this module reads (the admission webhook's matchConditions say
    the same in CEL)."""
    return key.startswith((names.ANNOTATION_CLAIM_PREFIX, names.ANNOTATION_INLINE_REQUEST_PREFIX))


def has_claim_annotations(annotations: Mapping[str, str] | None) -> bool:
    """True when the pod carries at least one claim annotation."""
    return any(is_claim_annotation(key) for key in annotations or {})


def is_dns1123_subdomain(name: str) -> bool:
    """True when `name` is a valid name for a claim or a class (DNS-1123 subdomain)."""
    return len(name) <= DNS1123_SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.match(name) is not None


def inline_claim_name(pod_name: str, container: str) -> str:
    """`<pod>-<container>` when that fits in 63 characters; else its first characters, `-` and
    a hash of pod and container, so that the name is stable (retries find the claim) and two
    long pod names that share a beginning still get two claims."""
    name = f"{pod_name}-{container}"
    if len(name) <= INLINE_CLAIM_NAME_MAX:
        return name
    digest = hashlib.sha256(f"{pod_name}/{container}".encode()).hexdigest()[:_HASH_CHARS]
    head = name[: INLINE_CLAIM_NAME_MAX - _HASH_CHARS - 1].rstrip("-.")
    return f"{head}-{digest}"


def container_names(pod: Mapping[str, Any]) -> list[str]:
    """Names of a pod's containers and init containers (a sidecar may use a claim too)."""
    spec = pod.get("spec") or {}
    return [
        str(container.get("name", "")) for key in ("initContainers", "containers") for container in spec.get(key) or []
    ]


def read_pod_claims(pod: Mapping[str, Any]) -> PodClaims:
    """The claims of a pod given as its API body (a dict); raises `InvalidPodClaims`."""
    metadata = pod.get("metadata") or {}
    return parse_pod_claims(
        metadata.get("annotations") or {},
        containers=container_names(pod),
        pod=metadata.get("name") or metadata.get("generateName") or "",
    )


def parse_pod_claims(annotations: Mapping[str, str], *, containers: Collection[str], pod: str = "") -> PodClaims:
    """Read the claim annotations among `annotations` of a pod with `containers`.

    Raises `InvalidPodClaims` holding every problem found: a container the pod does not have,
    an unparsable inline request, a value a claim may not have, a claim name that is not a
    DNS-1123 name, or both annotations on one container. `pod` only names the pod in messages.
    """
    problems: list[InvalidSpec] = []
    references: list[ClaimReference] = []
    inline: list[InlineRequest] = []
    for key in sorted(annotations):
        if key.startswith(names.ANNOTATION_CLAIM_PREFIX):
            container = key.removeprefix(names.ANNOTATION_CLAIM_PREFIX)
            value = annotations[key]
            if not _has_container(key, container, containers, problems):
                continue
            if not is_dns1123_subdomain(value):
                problems.append(
                    InvalidSpec(
                        field=annotation_field(key),
                        rule="must name a claim: a DNS-1123 name (lowercase letters, digits, '-' and '.',"
                        " starting and ending with a letter or digit, at most 253 characters)",
                        value=value,
                        fix="write the name of an ElasticGPUClaim of the pod's namespace",
                    )
                )
                continue
            references.append(ClaimReference(container=container, claim_name=value))
        elif key.startswith(names.ANNOTATION_INLINE_REQUEST_PREFIX):
            container = key.removeprefix(names.ANNOTATION_INLINE_REQUEST_PREFIX)
            if not _has_container(key, container, containers, problems):
                continue
            try:
                inline.append(parse_inline_request(key, container, annotations[key]))
            except InvalidSpec as problem:
                problems.append(problem)
    both = sorted({reference.container for reference in references} & {request.container for request in inline})
    problems.extend(
        InvalidSpec(
            field=annotation_field(names.inline_request_annotation(container)),
            rule=f"container {container!r} also names a claim in {names.claim_annotation(container)}",
            fix="a container uses one claim: keep one of the two annotations",
        )
        for container in both
    )
    if problems:
        raise InvalidPodClaims(problems, pod=pod)
    return PodClaims(references=tuple(references), inline=tuple(inline))


def _has_container(key: str, container: str, containers: Collection[str], problems: list[InvalidSpec]) -> bool:
    if container in containers:
        return True
    known = ", ".join(sorted(containers)) or "none"
    prefix = key.removesuffix(container)
    problems.append(
        InvalidSpec(
            field=annotation_field(key),
            rule=f"the pod has no container {container!r} (its containers: {known})",
            fix=f"name one of its containers after {prefix!r}",
        )
    )
    return False


def parse_inline_request(key: str, container: str, text: str) -> InlineRequest:
    """Read one inline request (`gpu-core=30,gpu-memory=10Gi[,class=NAME]`) of annotation `key`.

    The values are checked by the claim model's own rules; an error names the annotation and,
    for a value, the key (`gpu-core`) the user wrote.
    """
    field = annotation_field(key)
    requests: dict[str, int | str] = {}
    written: dict[str, str] = {}  # resource -> the key the user wrote, for messages
    class_name: str | None = None
    items = [item.strip() for item in text.split(",")]
    if not text.strip():
        raise InvalidSpec(field=field, rule="is empty", fix=f"write {INLINE_FORMAT}")
    for item in items:
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not name or not value:
            raise InvalidSpec(field=field, rule=f"{item!r} is not KEY=VALUE", value=text, fix=f"write {INLINE_FORMAT}")
        if name == INLINE_CLASS_KEY:
            if class_name is not None:
                raise InvalidSpec(field=field, rule="gives class twice", value=text, fix="keep one class=NAME")
            if not is_dns1123_subdomain(value):
                raise InvalidSpec(
                    field=field,
                    rule="class must be the name of an ElasticGPUClass (a DNS-1123 name)",
                    value=value,
                    fix="write class=NAME with the name of an existing class, or leave it out for the default",
                )
            class_name = value
            continue
        resource = INLINE_KEYS.get(name)
        if resource is None:
            raise InvalidSpec(
                field=field,
                rule=f"{name!r} is not a key of an inline request",
                value=text,
                fix=f"use gpu-core, gpu-memory, gpu or class: {INLINE_FORMAT}",
            )
        if resource in requests:
            raise InvalidSpec(
                field=field, rule=f"gives {name} twice (as {written[resource]!r} too)", value=text, fix="keep one"
            )
        if resource != names.RESOURCE_MEMORY and not value.isdigit():
            # Counts are written as digits: the claim's CEL rule reads them so (`+30` would pass
            # Python's int() but not the CRD).
            raise InvalidSpec(
                field=field, rule=f"{name} must be a whole number", value=value, fix=f"write {INLINE_FORMAT}"
            )
        # A plain number is an integer, as YAML would give it in a claim written by hand.
        requests[resource] = int(value) if value.isdigit() else value
        written[resource] = name
    if not requests:
        raise InvalidSpec(
            field=field,
            rule="asks for no GPU resource",
            value=text,
            fix=f"add gpu-core and/or gpu-memory: {INLINE_FORMAT}",
        )
    try:
        spec = ElasticGPUClaimSpec.model_validate(
            {"resources": {"requests": requests}, "elasticGPUClassName": class_name}
        )
        request, _ = spec.gpu_request()
    except InvalidSpec as error:
        raise InvalidSpec(
            field=field, rule=_rule_as_written(error, written), value=error.value, fix=error.fix
        ) from error
    except ValidationError as error:  # the model's own types; parse_claim_resources sees the rest
        raise InvalidSpec(
            field=field, rule=str(error.errors()[0]["msg"]), value=text, fix=f"write {INLINE_FORMAT}"
        ) from error
    return InlineRequest(container=container, text=text, spec=spec, request=request)


def _rule_as_written(error: InvalidSpec, written: Mapping[str, str]) -> str:
    # `spec.resources.requests[elasticgpu.io/gpu-core]: must be ...` -> `gpu-core must be ...`
    for resource, key in written.items():
        if f"[{resource}]" in error.field:
            return f"{key}: {error.rule}"
    return error.rule


def claim_annotations(annotations: Mapping[str, str] | None) -> dict[str, str]:
    """Only the claim annotations of `annotations` (to compare two versions of a pod)."""
    return {key: value for key, value in (annotations or {}).items() if is_claim_annotation(key)}
