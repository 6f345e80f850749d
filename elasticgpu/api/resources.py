"""The three GPU resources a claim can request, normalised into one `GpuRequest`.

Rules (DESIGN.md, "Resources a claim can request"):
- `elasticgpu.io/gpu-core`: 1..100 is a share of one card; above 100 a multiple of 100, meaning
  that many whole cards on one node.
- `elasticgpu.io/gpu-memory`: MiB as an integer or a quantity (`8Gi` = 8192).
- `nvidia.com/gpu`: N whole cards (gpu-core 100*N).
- Cores without memory: memory in proportion to the cores, resolved on the chosen card.
  Memory without cores: a best-effort share with no compute reservation.
- With whole cards, a memory value is the least memory each card must have.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from elasticgpu.api import names
from elasticgpu.api.errors import InvalidRequest
from elasticgpu.api.quantities import format_memory, parse_count, parse_memory_mib


class GpuRequest(BaseModel):
    """What a claim asks for, in one shape the allocator understands.

    Either a share of one card (`cards == 0`, `cores` in 0..100, `memory_mib` MiB or None for
    "in proportion to cores"), or `cards` whole cards on one node (`cores == 100 * cards`).
    """

    model_config = ConfigDict(frozen=True)

    cards: int = Field(default=0, ge=0, description="Whole cards on one node; 0 for a share of one card.")
    cores: int = Field(
        default=0, ge=0, description="Percent of one card's compute for a share; 100*cards for whole cards."
    )
    memory_mib: int | None = Field(
        default=None,
        ge=1,
        description="Share: MiB on the card (None: in proportion to cores). Whole cards: least MiB per card.",
    )
    rdma: int = Field(default=0, ge=0, description="RDMA NICs on the PCIe roots of the whole cards (0: none).")

    @model_validator(mode="after")
    def _asks_for_something(self) -> GpuRequest:
        # A share of nothing would "fit" everywhere and reserve nothing: refuse it at the source.
        if self.cards == 0 and self.cores == 0 and self.memory_mib is None:
            raise ValueError("a share of one card needs cores, memory or both")
        if self.cards == 0 and self.cores > names.CORES_PER_CARD:
            raise ValueError("a share of one card has at most 100 cores; ask for whole cards instead")
        if self.cards == 0 and self.rdma:
            raise ValueError("RDMA NICs go with whole cards; ask for nvidia.com/gpu")
        return self

    @property
    def is_whole(self) -> bool:
        """True when the request is for whole cards."""
        return self.cards > 0

    def memory_on(self, card_memory_mib: int) -> int:
        """MiB this request takes on a card of `card_memory_mib` (whole cards take all of it)."""
        if self.is_whole:
            return card_memory_mib
        if self.memory_mib is not None:
            return self.memory_mib
        return card_memory_mib * self.cores // names.CORES_PER_CARD

    def cores_on_card(self) -> int:
        """Cores this request takes on each card it uses."""
        return names.CORES_PER_CARD if self.is_whole else self.cores

    def describe(self) -> str:
        """Short human form: `2 whole cards`, `30% cores, 10Gi`."""
        if self.is_whole:
            plural = "s" if self.cards > 1 else ""
            least = f" with at least {format_memory(self.memory_mib)} each" if self.memory_mib else ""
            nics = f" and {self.rdma} RDMA NIC{'s' if self.rdma > 1 else ''}" if self.rdma else ""
            return f"{self.cards} whole card{plural}{least}{nics}"
        memory = format_memory(self.memory_mib) if self.memory_mib is not None else "memory in proportion"
        return f"{self.cores}% cores, {memory}"

    @classmethod
    def share(cls, cores: int, memory_mib: int | None = None) -> GpuRequest:
        """A share of one card."""
        return cls(cards=0, cores=cores, memory_mib=memory_mib)

    @classmethod
    def whole(cls, cards: int, memory_mib: int | None = None, *, rdma: int = 0) -> GpuRequest:
        """`cards` whole cards on one node (and `rdma` NICs on their PCIe roots)."""
        return cls(cards=cards, cores=names.CORES_PER_CARD * cards, memory_mib=memory_mib, rdma=rdma)


def parse_resource_map(resources: Mapping[str, object], *, field: str) -> GpuRequest:
    """Turn one resource map (`requests` or `limits`) into a `GpuRequest`.

    Raises `InvalidRequest` naming `field.<resource>` and the broken rule.
    """
    unknown = sorted(set(resources) - set(names.KNOWN_RESOURCES))
    if unknown:
        raise InvalidRequest(
            field=f"{field}[{unknown[0]}]",
            rule="is not a resource elasticgpu knows",
            fix="use " + ", ".join(names.KNOWN_RESOURCES),
        )
    if not resources:
        raise InvalidRequest(
            field=field,
            rule="must request at least one resource",
            fix=f"set {names.RESOURCE_CORE}, {names.RESOURCE_MEMORY} or {names.RESOURCE_NVIDIA_GPU}",
        )
    core_field = f"{field}[{names.RESOURCE_CORE}]"
    memory_field = f"{field}[{names.RESOURCE_MEMORY}]"
    nvidia_field = f"{field}[{names.RESOURCE_NVIDIA_GPU}]"
    rdma_field = f"{field}[{names.RESOURCE_RDMA}]"
    rdma = 0
    if names.RESOURCE_RDMA in resources:
        rdma = parse_count(resources[names.RESOURCE_RDMA], field=rdma_field)
        if rdma <= 0:
            raise InvalidRequest(field=rdma_field, rule="must be at least 1 NIC (or left out)", value=rdma)

    cores: int | None = None
    if names.RESOURCE_CORE in resources:
        cores = parse_count(resources[names.RESOURCE_CORE], field=core_field)
        if cores <= 0:
            raise InvalidRequest(field=core_field, rule="must be at least 1", value=cores)
        if cores > names.CORES_PER_CARD and cores % names.CORES_PER_CARD:
            raise InvalidRequest(
                field=core_field,
                rule="must be 1..100 (a share of one card) or a multiple of 100 (whole cards)",
                value=cores,
                fix=f"ask for {cores // 100 * 100} or {(cores // 100 + 1) * 100}",
            )
    memory: int | None = None
    if names.RESOURCE_MEMORY in resources:
        memory = parse_memory_mib(resources[names.RESOURCE_MEMORY], field=memory_field)
        if memory <= 0:
            raise InvalidRequest(field=memory_field, rule="must be more than 0 MiB", value=memory)
    whole: int | None = None
    if names.RESOURCE_NVIDIA_GPU in resources:
        whole = parse_count(resources[names.RESOURCE_NVIDIA_GPU], field=nvidia_field)
        if whole <= 0:
            raise InvalidRequest(field=nvidia_field, rule="must be at least 1 whole card", value=whole)

    if whole is not None:
        if cores is not None and cores != names.CORES_PER_CARD * whole:
            raise InvalidRequest(
                field=core_field,
                rule=f"must equal 100 x {names.RESOURCE_NVIDIA_GPU} ({100 * whole}) when both are set",
                value=cores,
                fix="set only one of them",
            )
        return GpuRequest.whole(whole, memory, rdma=rdma)
    if cores is not None and cores >= names.CORES_PER_CARD:
        # 100 cores is one whole card: nobody else may share it.
        return GpuRequest.whole(cores // names.CORES_PER_CARD, memory, rdma=rdma)
    if rdma:
        raise InvalidRequest(field=rdma_field, rule="goes with whole cards only (a NIC is not shared)",
                             value=rdma, fix=f"ask for {names.RESOURCE_NVIDIA_GPU} too, or drop {names.RESOURCE_RDMA}")
    return GpuRequest.share(cores or 0, memory)


def parse_claim_resources(
    requests: Mapping[str, object] | None,
    limits: Mapping[str, object] | None = None,
    *,
    field: str = "spec.resources",
) -> tuple[GpuRequest, GpuRequest]:
    """Read a claim's `requests` and `limits` into (request, limit).

    As for Kubernetes containers, missing requests default to the limits and missing limits to
    the requests; a limit below its request is refused.
    """
    if not requests and not limits:
        raise InvalidRequest(
            field=f"{field}.requests",
            rule="must request at least one resource",
            fix=f"set {names.RESOURCE_CORE}, {names.RESOURCE_MEMORY} or {names.RESOURCE_NVIDIA_GPU}",
        )
    request = parse_resource_map(requests or limits or {}, field=f"{field}.{'requests' if requests else 'limits'}")
    if not limits:
        return request, request
    limit = parse_resource_map(limits, field=f"{field}.limits")
    same_whole = (limit.cards, limit.rdma) == (request.cards, request.rdma)
    if limit.is_whole != request.is_whole or (limit.is_whole and not same_whole):
        raise InvalidRequest(
            field=f"{field}.limits",
            rule="must ask for the same shape as requests (the same whole cards and NICs, or a share of one card)",
            fix="make limits equal to requests, or drop limits",
        )
    if limit.cores < request.cores:
        raise InvalidRequest(
            field=f"{field}.limits[{names.RESOURCE_CORE}]", rule="must not be below the request", value=limit.cores
        )
    if limit.memory_mib is not None and request.memory_mib is not None and limit.memory_mib < request.memory_mib:
        raise InvalidRequest(
            field=f"{field}.limits[{names.RESOURCE_MEMORY}]",
            rule="must not be below the request",
            value=limit.memory_mib,
        )
    return request, limit
