"""Why a request fits nowhere, in words a user can act on.

Runs only when placement failed, so it may walk the whole inventory. It narrows the nodes the
way placement does (node names, selector, model, health, CPU and memory, GPU room) and reports
the first step that left nothing, naming the closest candidate and what it lacked.
"""

from __future__ import annotations

from elasticgpu.allocator.inventory import CardState, Inventory, NodeState
from elasticgpu.allocator.records import PlacementRequest, Unplaceable
from elasticgpu.allocator.shapes import Shape, model_matches, share_memory
from elasticgpu.api import names
from elasticgpu.api.quantities import format_memory

ISOLATION_HINT = {
    "MPS": "a node's agent offers MPS where it finds the driver's nvidia-cuda-mps-control under its driver root",
    "HAMiCore": "a node's agent offers HAMiCore where the admin installed libvgpu.so at its --hami-core-library path",
}
"""What makes a node offer each mode, for the reason a user reads (docs/isolation.md)."""


def _labels_match(node: NodeState, request: PlacementRequest) -> bool:
    labels = node.record.labels
    return all(labels.get(k) == v for k, v in request.node_selector.items())


def _card_model_ok(card: CardState, shape: Shape) -> bool:
    return not shape.models or model_matches(card.record.model, shape.models)


def _cpu(milli: int) -> str:
    return f"{milli / 1000:g} CPU"


def _share_gap(card: CardState, shape: Shape) -> tuple[float, str]:
    """How far a card is from taking a share (0 = fits), and the sentence that says so."""
    where = card.record.describe()
    if card.whole:
        return 2.0, f"{where} is taken whole by another claim"
    want_mem = share_memory(shape, card.record.memory_mib)
    core_gap = max(0, shape.cores - card.free_cores) / names.CORES_PER_CARD
    mem_gap = max(0, want_mem - card.free_memory) / max(card.record.memory_mib, 1)
    if mem_gap >= core_gap and mem_gap > 0:
        return mem_gap, (
            f"{where} has {format_memory(card.free_memory)} free, the claim asks {format_memory(want_mem)}"
        )
    if core_gap > 0:
        return core_gap, f"{where} has {card.free_cores}% cores free, the claim asks {shape.cores}%"
    return 0.0, f"{where} has room"


def _whole_free(card: CardState, shape: Shape) -> bool:
    return (
        not card.holders
        and card.free_cores == names.CORES_PER_CARD
        and card.record.memory_mib >= (shape.memory_mib or 0)
    )


def explain(inventory: Inventory, request: PlacementRequest, shape: Shape) -> Unplaceable:
    """The reason `request` fits nowhere in `inventory` (call it after placement failed)."""
    nodes = list(inventory.nodes())
    if not nodes:
        return Unplaceable(reason="the cluster has no GPU nodes yet")
    if request.nodes:
        nodes = [n for n in nodes if n.record.name in request.nodes]
        if not nodes:
            wanted = ", ".join(sorted(request.nodes))
            return Unplaceable(reason=f"node {wanted} has no GPUs in the inventory")
    if request.node_selector:
        nodes = [n for n in nodes if _labels_match(n, request)]
        if not nodes:
            selector = ",".join(f"{k}={v}" for k, v in sorted(request.node_selector.items()))
            return Unplaceable(reason=f"no node matches the node selector {selector}")
    if shape.cards >= 0:
        with_model = [n for n in nodes if any(_card_model_ok(c, shape) for c in n.cards)]
        if not with_model:
            if shape.models:
                have = sorted({c.record.model for n in nodes for c in n.cards})
                globs = "|".join(shape.models)
                # NoCapacity, not NeverFits: a node with such cards may still join (an autoscaled pool).
                return Unplaceable(reason=f"no node has a {globs} card yet (models here: {', '.join(have) or 'none'});"
                                          " it binds once one joins, or fix the class's gpuModel")
            return Unplaceable(reason="no node that matches has any GPU card")
        nodes = with_model
    mode = request.needs_isolation if shape.cards == 0 else ""  # whole cards need no isolation
    if mode:
        isolated = [n for n in nodes if n.cards and all(mode in c.record.isolation for c in n.cards)]
        if not isolated:
            where = "any node" if len(nodes) == len(list(inventory.nodes())) else "the nodes that match"
            hint = ISOLATION_HINT.get(mode, "no agent offers it")
            return Unplaceable(reason=f"no card on {where} supports isolation {mode} ({hint})")
        nodes = isolated
    # CPU and memory of the pod (delayed binding).
    roomy = [n for n in nodes if n.cpu_free >= request.cpu_milli and n.memory_free >= request.memory_mib]
    if not roomy:
        closest = max(nodes, key=lambda n: (min(n.cpu_free - request.cpu_milli, 0), n.memory_free))
        if closest.cpu_free < request.cpu_milli:
            return Unplaceable(
                reason=(
                    f"{closest.record.name} has {_cpu(closest.cpu_free)} free, the pod asks {_cpu(request.cpu_milli)}"
                ),
                closest=closest.record.name,
            )
        return Unplaceable(
            reason=(
                f"{closest.record.name} has {format_memory(closest.memory_free)} memory free, "
                f"the pod asks {format_memory(request.memory_mib)}"
            ),
            closest=closest.record.name,
        )
    if shape.cards < 0:
        return Unplaceable(reason="no node has room for the pod")  # pragma: no cover - roomy means it fits
    cards = [(n, c) for n in roomy for c in n.cards if _card_model_ok(c, shape)]
    if shape.cards > 0:
        return _explain_whole(roomy, cards, shape)
    return _explain_share(cards, shape)


def _explain_whole(roomy: list[NodeState], cards: list[tuple[NodeState, CardState]], shape: Shape) -> Unplaceable:
    want = shape.cards
    best: NodeState | None = None
    best_free = -1
    best_unhealthy = 0
    for node in roomy:
        usable = [c for c in node.cards if _card_model_ok(c, shape) and _whole_free(c, shape)]
        healthy = sum(c.healthy for c in usable)
        if healthy > best_free:
            best, best_free, best_unhealthy = node, healthy, len(usable) - healthy
    assert best is not None
    if (
        best_free == 0
        and all(not c.healthy for _, c in cards if _whole_free(c, shape))
        and any(_whole_free(c, shape) for _, c in cards)
    ):
        return Unplaceable(reason="every card with room is Unhealthy")
    plural = "s" if want > 1 else ""
    total = sum(_card_model_ok(c, shape) for c in best.cards)
    extra = f" ({best_unhealthy} more are Unhealthy)" if best_unhealthy else ""
    floor = f" with at least {format_memory(shape.memory_mib)}" if shape.memory_mib else ""
    return Unplaceable(
        reason=(
            f"{best.record.name} has {best_free} free card{'s' if best_free != 1 else ''}{floor} "
            f"(of {total}){extra}, the claim asks {want} whole card{plural} on one node"
        ),
        closest=best.record.name,
    )


def _explain_share(cards: list[tuple[NodeState, CardState]], shape: Shape) -> Unplaceable:
    healthy = [(n, c) for n, c in cards if c.healthy]
    if not healthy:
        return Unplaceable(reason="every card that matches is Unhealthy")
    gaps = [(_share_gap(c, shape), c) for _, c in healthy]
    (gap, sentence), card = min(gaps, key=lambda g: (g[0][0], g[1].record.node, g[1].record.index))
    if gap == 0:  # pragma: no cover - a healthy card with room would have been placed
        return Unplaceable(reason=sentence, closest=card.record.describe())
    unhealthy_roomy = [c for _, c in cards if not c.healthy and _share_gap(c, shape)[0] == 0]
    if unhealthy_roomy:
        return Unplaceable(
            reason=f"every card with room is Unhealthy ({unhealthy_roomy[0].record.describe()}); closest healthy: "
            + sentence,
            closest=card.record.describe(),
        )
    return Unplaceable(reason=sentence, closest=card.record.describe())
