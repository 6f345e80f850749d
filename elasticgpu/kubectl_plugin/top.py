"""`kubectl egpu top`: per node and card, what is reserved, what is used, health, the claims.

Everything comes from the GPU objects: `status.allocations` (the controller's reservations),
`status.usage` and `status.runningClaims` (written by the node's agent), `status.health` and
the `Ready` condition (the controller's heartbeat check), `spec.owner` and `status.owner` (who
allocates the card). One row per card, sorted by node and
index, then one TOTAL row per node that has more than one card.
"""

from __future__ import annotations

import argparse

from elasticgpu.api import GPU, format_memory, names
from elasticgpu.api.gpu import effective_owner
from elasticgpu.kubectl_plugin import cluster, table

HEADER = ("NODE", "GPU", "INDEX", "MODEL", "HEALTH", "OWNER", "CORES", "CORES-USED", "MEMORY", "MEMORY-USED",
          "CLAIMS")
"""OWNER: who allocates the card (ElasticGPU or DRA; `ElasticGPU->DRA` while a move waits, docs/dra.md);
CORES: percent of the card reserved; MEMORY: reserved/total; *-USED: measured by the agent."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `top` (beyond the plugin's common ones)."""
    parser.add_argument("-A", "--all-namespaces", action="store_true",
                        help="list the claims of every namespace (the default unless -n is given)")


def _health(gpu: GPU) -> str:
    health = gpu.status.health or "Unknown"
    ready = next((c for c in gpu.status.conditions if c.type == "Ready"), None)
    # Ready=False is the controller's verdict that the node's agent went silent: nothing new lands here.
    if ready is not None and ready.status == "False":
        return f"{health},NotReady({ready.reason})" if ready.reason else f"{health},NotReady"
    return health


def _owner(gpu: GPU) -> str:
    current = effective_owner(gpu)
    return current if gpu.spec.owner == current else f"{current}->{gpu.spec.owner}"


def _claims(gpu: GPU, namespace: str | None) -> str:
    """`ns/name:30%/10Gi` per reservation; `+running` when the agent sees its containers on the card."""
    running = {(r.namespace, r.name) for r in gpu.status.running_claims}
    shown: list[str] = []
    listed: set[tuple[str, str]] = set()
    for allocation in gpu.status.allocations:
        ref = allocation.claim_ref
        key = (ref.namespace or "", ref.name or "") if ref is not None else ("", allocation.elastic_gpu)
        if namespace is not None and key[0] != namespace:
            continue
        size = "whole" if allocation.exclusive else f"{allocation.cores}%/{format_memory(allocation.memory)}"
        who = f"{key[0]}/{key[1]}" if ref is not None else f"egpu/{allocation.elastic_gpu}"
        shown.append(f"{who}:{size}{'+running' if key in running else ''}")
        listed.add(key)
    # A claim that runs here but holds no reservation any more (being released): show it too.
    for key in sorted(running - listed):
        if namespace is None or key[0] == namespace:
            shown.append(f"{key[0]}/{key[1]}:released+running")
    return ",".join(shown)


def _reserved(gpu: GPU) -> tuple[int, int]:
    cores = sum(names.CORES_PER_CARD if a.exclusive else a.cores for a in gpu.status.allocations)
    memory = sum(gpu.spec.memory if a.exclusive else a.memory for a in gpu.status.allocations)
    return cores, memory


def rows(gpus: list[GPU], *, namespace: str | None) -> list[list[str]]:
    """The table's rows; `namespace` None lists the claims of every namespace."""
    out: list[list[str]] = []
    by_node: dict[str, list[GPU]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.spec.node_name, []).append(gpu)
    for node in sorted(by_node):
        cards = sorted(by_node[node], key=lambda g: g.spec.index)
        totals = [0, 0, 0, 0, 0]  # reserved cores, reserved MiB, used cores, used MiB, total MiB
        for gpu in cards:
            cores, memory = _reserved(gpu)
            usage = gpu.status.usage
            out.append([
                node, gpu.metadata.name or names.gpu_object_name(gpu.spec.uuid), str(gpu.spec.index),
                gpu.spec.model, _health(gpu), _owner(gpu), f"{cores}%",
                f"{usage.cores_used}%" if usage is not None else "-",
                f"{format_memory(memory)}/{format_memory(gpu.spec.memory)}",
                format_memory(usage.memory_used) if usage is not None else "-",
                _claims(gpu, namespace),
            ])
            used = (usage.cores_used, usage.memory_used) if usage is not None else (0, 0)
            for i, value in enumerate((cores, memory, *used, gpu.spec.memory)):
                totals[i] += value
        if len(cards) > 1:
            # Cores of a node add up in cards: 250% is two and a half cards reserved.
            out.append([node, "TOTAL", "-", "-", "-", "-", f"{totals[0]}%", f"{totals[2]}%",
                        f"{format_memory(totals[1])}/{format_memory(totals[4])}", format_memory(totals[3]), "-"])
    return out


def run(args: argparse.Namespace, view: cluster.Cluster) -> int:
    """Print the table; a cluster with no GPU objects says so and how to get some."""
    gpus = view.gpus()
    if not gpus:
        print("No GPU objects in the cluster: is the elasticgpu node agent running on the GPU nodes?"
              " (see docs/admin-guide.md)")
        return 0
    namespace = None if args.all_namespaces or args.namespace is None else view.namespace
    print(table.render(HEADER, rows(gpus, namespace=namespace)), end="")
    return 0
