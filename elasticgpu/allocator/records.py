"""Plain records the allocator reads and writes: nodes, cards, requests and placements.

These are the allocator's own types, built from `elasticgpu.api` objects by whoever calls it
(the controller, `elasticgpu plan`, the benchmark), so the allocator never sees Kubernetes.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from elasticgpu.api.gpu import GPU, open_to_elastic_gpu
from elasticgpu.api.quantities import format_memory
from elasticgpu.api.resources import GpuRequest


class Health(enum.Enum):
    """Health of a card as the node agent reports it."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


def _frozen_labels(labels: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(labels or {}))


@dataclass(frozen=True, kw_only=True)
class NodeRecord:
    """A node: what the pods' CPU and memory may use, and its labels (for node selectors)."""

    name: str
    cpu_milli: int = 0
    """Allocatable CPU in milli-cores; 0 means "not tracked" (CPU never limits placement)."""
    memory_mib: int = 0
    """Allocatable main memory in MiB; 0 means "not tracked"."""
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _frozen_labels(self.labels))

    def __hash__(self) -> int:
        return hash((self.name, self.cpu_milli, self.memory_mib, tuple(sorted(self.labels.items()))))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NodeRecord):
            return NotImplemented
        return (self.name, self.cpu_milli, self.memory_mib, dict(self.labels)) == (
            other.name,
            other.cpu_milli,
            other.memory_mib,
            dict(other.labels),
        )


@dataclass(frozen=True, kw_only=True)
class CardRecord:
    """A physical card: 100 cores and `memory_mib` MiB, on one NUMA node, linked to peers."""

    uuid: str
    node: str
    index: int
    model: str
    memory_mib: int
    numa: int = 0
    links: frozenset[str] = frozenset()
    """uuids of the cards this one reaches over NVLink."""
    pcie_root: str = ""
    """PCI bus id of the root port above the card; empty when unknown."""
    nics: frozenset[str] = frozenset()
    """RDMA NICs (ibverbs names) under the card's PCIe root."""
    health: Health = Health.HEALTHY
    isolation: frozenset[str] = frozenset()
    """Isolation modes its node's agent provides on the card (MPS, HAMiCore; None is always there)."""

    def describe(self) -> str:
        """Short human name: `node-7 card 2`."""
        return f"{self.node} card {self.index}"

    @classmethod
    def from_gpu(cls, gpu: GPU) -> CardRecord:
        """The allocator's view of a GPU object; Unhealthy when its agent says so, and (to new placements)
        when the card is not ours alone: spec.owner or status.owner says DRA (docs/dra.md)."""
        spec = gpu.spec
        return cls(
            uuid=spec.uuid,
            node=spec.node_name,
            index=spec.index,
            model=spec.model,
            memory_mib=spec.memory,
            numa=spec.numa or 0,
            links=_frozen(spec.links),
            pcie_root=spec.pcie_root or "",
            nics=_frozen(spec.nics),
            health=Health.UNHEALTHY if gpu.status.health == "Unhealthy" or not open_to_elastic_gpu(gpu)
            else Health.HEALTHY,
            isolation=_frozen(gpu.status.isolation),
        )


_EMPTY: frozenset[str] = frozenset()


def _frozen(values: Collection[str]) -> frozenset[str]:
    """`frozenset(values)`, the one empty frozenset when there are none: an empty one is 216 bytes
    (not shared since Python 3.10), three per card at 40,000 cards (issue 49 item 2)."""
    return frozenset(values) if values else _EMPTY


@dataclass(frozen=True, kw_only=True)
class PlacementRequest:
    """What one claim (or one pod's claim, with delayed binding) needs from a node.

    `gpu` is the normalised request of the claim; `None` places only the pod's CPU and memory.
    `models` are globs over card models (`A100*`); any one may match. `node_selector` must
    match the node's labels exactly. `cpu_milli` / `memory_mib` are the pod's own needs, used
    with delayed binding; 0 means they do not constrain the choice. `nodes` restricts the
    choice to these node names (a pod already bound to a node); empty means any node.
    `isolation` is a mode the cards must provide (MPS, HAMiCore); empty (or None) asks for nothing.
    A node provides a mode when every card of it lists it (its agent's settings are per node, so
    its cards agree; a node whose cards disagree is not used for the mode, rather than risk the
    card that lacks it).
    `topology` is what a multi-card request requires of its cards (NVLink: one NVLink domain;
    SameNUMA: one NUMA node); Any requires nothing but still prefers them. `rdma` is how many
    RDMA NICs the placement needs on its cards' PCIe roots.
    """

    gpu: GpuRequest | None
    models: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    cpu_milli: int = 0
    memory_mib: int = 0
    nodes: frozenset[str] = frozenset()
    isolation: str = ""
    topology: str = "Any"
    rdma: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_selector", _frozen_labels(self.node_selector))

    @property
    def nics(self) -> int:
        """RDMA NICs wanted: the request's own count, else the claim's (`elasticgpu.io/rdma`)."""
        return self.rdma or (self.gpu.rdma if self.gpu is not None else 0)

    @property
    def needs_isolation(self) -> str:
        """The mode the cards must provide, or "" for none."""
        return "" if self.isolation in ("", "None") else self.isolation

    def __hash__(self) -> int:
        return hash(
            (
                self.gpu,
                self.models,
                tuple(sorted(self.node_selector.items())),
                self.cpu_milli,
                self.memory_mib,
                self.nodes,
                self.isolation,
                self.topology,
                self.rdma,
            )
        )

    def describe(self) -> str:
        """Short human form of the request."""
        parts = [self.gpu.describe() if self.gpu is not None else "no GPU"]
        if self.models:
            parts.append("model " + "|".join(self.models))
        if self.node_selector:
            parts.append("nodes " + ",".join(f"{k}={v}" for k, v in sorted(self.node_selector.items())))
        if self.needs_isolation:
            parts.append(f"isolation {self.needs_isolation}")
        if self.topology != "Any":
            parts.append(f"topology {self.topology}")
        if self.rdma and (self.gpu is None or self.gpu.rdma != self.rdma):
            parts.append(f"{self.rdma} RDMA NIC(s)")
        if self.cpu_milli:
            parts.append(f"{self.cpu_milli / 1000:g} CPU")
        if self.memory_mib:
            parts.append(f"{format_memory(self.memory_mib)} memory")
        return ", ".join(parts)


@dataclass(frozen=True, kw_only=True, order=True)
class CardShare:
    """What a placement takes from one card: cores (percent) and memory (MiB)."""

    uuid: str
    cores: int
    memory_mib: int
    whole: bool = False
    """The card is taken whole: nobody else may share it while this holds."""


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where a request goes: one node, the shares of its cards, and the pod's CPU and memory."""

    node: str
    cards: tuple[CardShare, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    nics: tuple[str, ...] = ()
    """RDMA NICs (ibverbs names) the claim gets, on its cards' PCIe roots."""

    @property
    def uuids(self) -> tuple[str, ...]:
        """uuids of the cards used, in placement order."""
        return tuple(card.uuid for card in self.cards)

    def describe(self) -> str:
        """Short human form: `node-3: GPU-a (30%, 10Gi)`."""
        shares = ", ".join(
            f"{c.uuid} ({'whole' if c.whole else f'{c.cores}%'}, {format_memory(c.memory_mib)})" for c in self.cards
        )
        return f"{self.node}: {shares or 'no GPU'}"


@dataclass(frozen=True, kw_only=True)
class Unplaceable:
    """Nothing fits. `reason` says why, in words a user can act on; `closest` names the
    candidate that came nearest (`node-7 card 2`), or is empty when none came near."""

    reason: str
    closest: str = ""

    def __bool__(self) -> bool:
        # So that `if result:` reads "if it was placed".
        return False
