"""What the cluster's cards can give a class: free capacity now (the `elasticgpu_class_free_*`
gauges), and whether a request could ever fit, even on empty cards (`NeverFits`).

A card counts for a class when its model matches the class's `gpuModel` and its node's labels
match the class's `nodeSelector`, as placement narrows them. Free capacity counts healthy cards
only (the allocator places nothing on the others); "could ever fit" counts every card, healthy
or not (a card that recovers is as large as before).

Pure: reads the allocator's inventory and the classes, changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from elasticgpu.allocator import CardState, Inventory, Unplaceable
from elasticgpu.allocator.shapes import model_matches
from elasticgpu.api import ElasticGPUClass, GpuRequest, InvalidClassParameters, format_memory, names

REASON_NEVER_FITS = "NeverFits"
"""A claim's reason when no card (or node) of the cluster could hold it even empty: waiting will
not help, a smaller request or larger cards will. `NoCapacity` is "no room now"."""


@dataclass(frozen=True)
class Free:
    """Free capacity for one class: cores (percent of a card, summed over cards), memory (MiB)
    and whole cards nobody holds any of."""

    cores: int = 0
    memory_mib: int = 0
    cards: int = 0


def _cards(inventory: Inventory, *, models: tuple[str, ...], node_selector: Mapping[str, str],
           healthy_only: bool) -> Iterator[tuple[str, CardState]]:
    """(node, card) for every card the class may use."""
    for node in inventory.nodes():
        labels = node.record.labels
        if any(labels.get(k) != v for k, v in node_selector.items()):
            continue
        for card in node.cards:
            if healthy_only and not card.healthy:
                continue
            if models and not model_matches(card.record.model, models):
                continue
            yield node.record.name, card


def free_for(inventory: Inventory, *, models: tuple[str, ...], node_selector: Mapping[str, str]) -> Free:
    """Free capacity on the healthy cards a class with these parameters may use."""
    cores = memory = cards = 0
    for _node, card in _cards(inventory, models=models, node_selector=node_selector, healthy_only=True):
        if card.whole:
            continue  # taken whole: nothing left on it for anyone
        cores += card.free_cores
        memory += card.free_memory
        if not card.holders:
            cards += 1
    return Free(cores=cores, memory_mib=memory, cards=cards)


def free_by_class(inventory: Inventory, classes: Mapping[str, ElasticGPUClass]) -> dict[str, Free]:
    """Free capacity of every class of ours whose parameters parse (others have nothing to say)."""
    free: dict[str, Free] = {}
    for name, klass in classes.items():
        if klass.provisioner not in names.OWN_PROVISIONERS:
            continue
        try:
            parameters = klass.parsed_parameters()
        except InvalidClassParameters:
            continue
        free[name] = free_for(inventory, models=parameters.gpu_model, node_selector=parameters.node_selector)
    return free


def card_memory(inventory: Inventory, *, models: tuple[str, ...], node_selector: Mapping[str, str]) -> int | None:
    """The memory (MiB) of the largest card a class may use, healthy or not; None when it has none
    yet (a pool scaled to zero): what a new node's card is taken to hold when shares are packed."""
    sizes = [card.record.memory_mib for _node, card in
             _cards(inventory, models=models, node_selector=node_selector, healthy_only=False)]
    return max(sizes, default=None)


def never_fits(inventory: Inventory, request: GpuRequest, *, models: tuple[str, ...],
               node_selector: Mapping[str, str]) -> str:
    """Why `request` could not fit on any card (or node) the class may use even if all were
    empty, naming the largest; "" when it could (or when the class has no card yet: cards may
    still join, and `NoCapacity` says so)."""
    cards = list(_cards(inventory, models=models, node_selector=node_selector, healthy_only=False))
    if not cards:
        return ""
    which = f" matching gpuModel {'|'.join(models)}" if models else ""
    if request.is_whole:
        per_node: dict[str, int] = {}
        for node, card in cards:
            if not request.memory_mib or card.record.memory_mib >= request.memory_mib:
                per_node[node] = per_node.get(node, 0) + 1
        best_node, most = max(per_node.items(), key=lambda item: (item[1], item[0]), default=("", 0))
        if most >= request.cards:
            return ""
        if most == 0:
            node, largest = max(cards, key=lambda nc: (nc[1].record.memory_mib, nc[0]))
            return (f"no card{which} in this cluster has the {format_memory(request.memory_mib or 0)} per card the"
                    f" claim asks for: the largest is {largest.record.model} with"
                    f" {format_memory(largest.record.memory_mib)} (node {node}); ask for less memory per card")
        return (f"no node{which} in this cluster has {request.cards} such cards: the most on one node is {most}"
                f" (node {best_node}); ask for at most {most} cards, or split the work over several claims")
    node, largest = max(cards, key=lambda nc: (nc[1].record.memory_mib, nc[0]))
    wanted = request.memory_on(largest.record.memory_mib)
    if wanted <= largest.record.memory_mib:
        return ""
    return (f"no card{which} in this cluster can ever give {request.describe()}: the largest is"
            f" {largest.record.model} with {format_memory(largest.record.memory_mib)} (node {node});"
            " ask for less memory, or add larger cards")


def no_capacity_message(request: GpuRequest, unplaceable: Unplaceable) -> str:
    """The message of a claim that waits with `NoCapacity`: what it asks for, why no card gives it
    now and the closest candidate. `elasticgpu plan` prints it as is; the controller
    (flow/binding/reserving.py) writes the same words and adds what only it knows (nodes kept for a starved
    claim group, a preemption's note)."""
    message = f"no card can give {request.describe()}: {unplaceable.reason}"
    return message + (f" (closest: {unplaceable.closest})" if unplaceable.closest else "")
