"""A node's GPUs have one allocator at a time: what says another one is live there, and the names of the hand-over.

The agent (its take-over check), `kubectl egpu handover` and `kubectl egpu doctor` read the same signs, so
this is the one place that says what they are (pure: a Node body and socket names in, findings out):

- a device plugin registered with kubelet for GPUs: a socket in kubelet's device-plugin folder
  (`/var/lib/kubelet/device-plugins/`, beside kubelet's own `kubelet.sock`) whose name is a GPU
  plugin's (NVIDIA's `nvidia-gpu.sock`, `nvidia-mig-*.sock`; HAMi's `hami*.sock`, `vgpu*.sock`), and
  that answers a connection (the agent checks that; a dead file left behind is no allocator);
- the node's `status.allocatable` offering a GPU resource of a device plugin: `nvidia.com/gpu`, its
  renamed forms (`nvidia.com/gpu.shared` of time-slicing), `nvidia.com/mig-*`, and HAMi's
  `nvidia.com/gpumem`, `nvidia.com/gpucores`. kubelet sets a resource's allocatable to 0 as soon as
  its plugin goes (its capacity stays for a grace period), so allocatable, not capacity, is the sign.

The node opts in through the label `elasticgpu.io/agent=true` (the chart's agent DaemonSet selects it);
the GPU Operator's own per-node switch of its device plugin is `nvidia.com/gpu.deploy.device-plugin`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

LABEL_AGENT: Final = "elasticgpu.io/agent"
"""The node label that opts a node in: the chart's agent DaemonSet runs only where it is "true"."""
LABEL_DEVICE_PLUGIN_DEPLOY: Final = "nvidia.com/gpu.deploy.device-plugin"
"""The GPU Operator's per-node switch of its device plugin ("false": its DaemonSet leaves the node)."""
GPU_FEATURE_DISCOVERY_LABEL: Final = "nvidia.com/gfd.timestamp"
"""Set by GPU Feature Discovery on the nodes it labels (it keeps nvidia.com/gpu.* true there)."""

CONDITION_ALLOCATOR_CONFLICT: Final = "GpuAllocatorConflict"
"""GPU condition: True while another GPU allocator is live on the card's node (after the agent took over)."""
CONDITION_FAIL_OPEN: Final = "FailOpenWindow"
"""GPU condition: True when the node's container toolkit honours NVIDIA_VISIBLE_DEVICES of unprivileged
containers, so a container created while the node hook is not registered can reach every card."""
CONDITION_NODE_HOOK: Final = "NodeHook"
"""GPU condition: True while the node hook (NRI plugin, CRI proxy) that puts claims into containers is in place."""
NODE_CONDITIONS: Final = (CONDITION_ALLOCATOR_CONFLICT, CONDITION_FAIL_OPEN, CONDITION_NODE_HOOK)

EVENT_ALLOCATOR_LIVE: Final = "GpuAllocatorLive"
"""Warning Event on the Node: another GPU allocator is live there (the agent stands by, or reports a conflict)."""
EVENT_TAKING_OVER: Final = "TakingOverGpus"
"""Normal Event on the Node: no other allocator (or the override): the agent takes the node's GPUs."""

DEVICE_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET: Final = "kubelet.sock"

_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?")
_GPU_SOCKET = re.compile(r"(nvidia|gpu|hami|vgpu|mig)", re.IGNORECASE)
# NVIDIA's network operator registers nvidia.com/hostdev and similar NIC resources: not GPUs.
_GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu($|[.-])|mig-|gpumem|gpucores)")


@dataclass(frozen=True)
class LiveAllocator:
    """One sign that another GPU allocator is live on a node."""

    kind: str
    """`device-plugin-socket` or `allocatable`."""
    what: str
    """What was seen, in words (`socket nvidia-gpu.sock`, `nvidia.com/gpu: 8 allocatable`)."""
    hami: bool = False
    """The sign is HAMi's (its resources or its socket), not NVIDIA's device plugin."""


def gpu_socket(name: str) -> bool:
    """True for a socket name of a GPU device plugin in kubelet's device-plugin folder (not kubelet's own)."""
    return name != KUBELET_SOCKET and name.endswith(".sock") and bool(_GPU_SOCKET.search(name))


def gpu_resource(name: str) -> bool:
    """True for an extended resource a GPU device plugin (NVIDIA's, HAMi's) advertises."""
    return bool(_GPU_RESOURCE.match(name))


def _hami(name: str) -> bool:
    return "hami" in name.lower() or "vgpu" in name.lower() or name in ("nvidia.com/gpumem", "nvidia.com/gpucores")


def from_node(node: dict[str, Any]) -> list[LiveAllocator]:
    """The GPU resources a device plugin offers on this Node now (allocatable above 0), sorted by name."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    found = []
    for name in sorted(allocatable):
        if not gpu_resource(name):
            continue
        if quantity_above_zero(allocatable[name]):
            found.append(LiveAllocator("allocatable", f"{name}: {allocatable[name]} allocatable", hami=_hami(name)))
    return found


def from_sockets(live_sockets: list[str]) -> list[LiveAllocator]:
    """The GPU device plugins among the live sockets of kubelet's device-plugin folder."""
    return [LiveAllocator("device-plugin-socket", f"device plugin socket {DEVICE_PLUGIN_DIR}/{name}",
                          hami=_hami(name))
            for name in sorted(live_sockets) if gpu_socket(name)]  # fmt: skip


def hand_over_line(node: str, live: list[LiveAllocator]) -> str:
    """The one line that says which allocator holds the node and how to hand it over."""
    seen = "; ".join(sign.what for sign in live)
    if any(sign.hami for sign in live):
        how = ("HAMi's device plugin holds it: move the node off HAMi first (docs/admin-guide.md, \"HAMi beside"
               " elasticgpu\")")
    else:
        how = (f"hand the node over: kubectl egpu handover {node} --to elasticgpu (cordons, drains the GPU pods,"
               f" labels {LABEL_DEVICE_PLUGIN_DEPLOY}=false, waits for our cards)")
    return (f"node {node}: another GPU allocator is live here ({seen}); the elasticgpu agent stands by and takes"
            f" nothing until it is gone. {how}; or, for a migration you manage, set ELASTICGPU_AGENT_OTHER_ALLOCATORS"
            f"=ignore (docs/admin-guide.md, \"Moving a GPU Operator cluster\")")


def quantity_above_zero(value: object) -> bool:
    """True when a resource quantity (as a Node's status spells it) is above 0."""
    match = _NUMBER.match(str(value).strip())
    # Unreadable: count it as offered, the safe side (the agent then stands by rather than share cards).
    return float(match.group(0)) > 0 if match else True
