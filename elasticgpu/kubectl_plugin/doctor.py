"""`kubectl egpu doctor NODE`: is this node's GPU hand-over sound? One line per check, from what the API shows.

The checks (each `ok`, `warn`, `FAIL` or `?` when it cannot be told from the API):
- opted in: the label `elasticgpu.io/agent=true` the agent's DaemonSet selects;
- the GPU Operator's device plugin switch for the node (`nvidia.com/gpu.deploy.device-plugin`);
- allocator conflicts: a GPU resource of a device plugin in the Node's allocatable, what the agent saw
  beside it (its GPUs' `GpuAllocatorConflict`, its `GpuAllocatorLive` Event when it stands by);
- the agent's cards: GPU objects of the node with a recent heartbeat;
- the node hook registered (NodeHook): the NRI plugin with the runtime, or the CRI proxy serving;
- the container toolkit's fail-open setting (FailOpenWindow: `accept-nvidia-visible-devices-envvar-when-
  unprivileged`), which the agent reads on the node.
Exit 0 when nothing FAILs, 1 otherwise.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from elasticgpu.api import names, node_handover, timestamps
from elasticgpu.kubectl_plugin import cluster

HEARTBEAT_FRESH_S = 120.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `doctor`."""
    parser.add_argument("node", metavar="NODE", help="the node to check")


def _conditions(gpus: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [c for g in gpus for c in (g.get("status") or {}).get("conditions") or [] if c.get("type") == type_]


def checks(node: dict[str, Any], gpus: list[dict[str, Any]], events: list[dict[str, Any]],
           now: float) -> list[tuple[str, str, str]]:  # fmt: skip
    """(verdict, check, detail) for each check; pure, for tests."""
    name = str((node.get("metadata") or {}).get("name"))
    labels = (node.get("metadata") or {}).get("labels") or {}
    out: list[tuple[str, str, str]] = []
    opted = labels.get(node_handover.LABEL_AGENT) == "true"
    out.append(("ok" if opted else "warn", "opted in",
                f"{node_handover.LABEL_AGENT}=true" if opted else
                f"no {node_handover.LABEL_AGENT}=true: the agent does not run here (kubectl egpu handover {name}"
                " --to elasticgpu)"))
    switch = labels.get(node_handover.LABEL_DEVICE_PLUGIN_DEPLOY)
    out.append(("ok" if switch == "false" or not opted else "warn", "GPU Operator's device plugin",
                f"{node_handover.LABEL_DEVICE_PLUGIN_DEPLOY}={switch}" if switch is not None else
                f"no {node_handover.LABEL_DEVICE_PLUGIN_DEPLOY} label (no GPU Operator here, or it does not run its"
                " device plugin on this node)"))
    offered = node_handover.from_node(node)
    conflicts = [c for c in _conditions(gpus, node_handover.CONDITION_ALLOCATOR_CONFLICT) if c.get("status") == "True"]
    standing = [e for e in events if e.get("reason") == node_handover.EVENT_ALLOCATOR_LIVE]
    taking = [e for e in events if e.get("reason") == node_handover.EVENT_TAKING_OVER]
    latest_live = str(standing[-1].get("lastTimestamp") or "") if standing else ""
    latest_take = str(taking[-1].get("lastTimestamp") or "") if taking else ""
    if offered or conflicts:
        seen = "; ".join([s.what for s in offered] + [str(c.get("message")) for c in conflicts[:1]])
        out.append(("FAIL" if opted and gpus else "warn", "allocator conflicts", seen + (
            ": both elasticgpu and a device plugin hand out this node's cards" if opted and gpus else
            ": a device plugin holds the node" + ("; the agent stands by" if opted else ""))))
    elif opted and standing and latest_live >= latest_take:
        out.append(("warn", "allocator conflicts", f"the agent stands by: {standing[-1].get('message')}"))
    else:
        out.append(("ok", "allocator conflicts", "no other GPU allocator is live"))
    fresh = [g for g in gpus if _fresh(g, now)]
    if not opted and not gpus:
        out.append(("ok", "agent's cards", "none (not opted in)"))
    elif not gpus:
        out.append(("FAIL" if opted else "ok", "agent's cards", "no GPU object of this node yet"))
    else:
        out.append(("ok" if len(fresh) == len(gpus) else "FAIL", "agent's cards",
                    f"{len(fresh)} of {len(gpus)} GPU objects with a heartbeat in the last {HEARTBEAT_FRESH_S:.0f} s"
                    f" (kubectl get pgpu -l {names.LABEL_NODE}={name})"))
    hooks = _conditions(gpus, node_handover.CONDITION_NODE_HOOK)
    if not hooks:
        out.append(("?", "node hook", "not reported (no GPU object of this node with a NodeHook condition)"))
    else:
        down = [c for c in hooks if c.get("status") != "True"]
        out.append(("FAIL" if down else "ok", "node hook", str((down or hooks)[0].get("message"))))
    fail_open = _conditions(gpus, node_handover.CONDITION_FAIL_OPEN)
    if not fail_open:
        out.append(("?", "toolkit setting", "not reported (the agent reads it once it has taken the node)"))
    else:
        c = fail_open[0]
        verdict = {"True": "warn", "False": "ok"}.get(str(c.get("status")), "?")
        out.append((verdict, "toolkit setting", str(c.get("message"))))
    return out


def _fresh(gpu: dict[str, Any], now: float) -> bool:
    for c in (gpu.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Heartbeat":
            beat = timestamps.epoch_seconds(c.get("lastTransitionTime"))
            return beat is not None and now - beat <= HEARTBEAT_FRESH_S
    return False


def run(args: argparse.Namespace, view: cluster.Cluster) -> int:
    """Print each check of NODE; 1 when one FAILs."""
    node = view.node(str(args.node))
    found = checks(node, view.node_gpus(str(args.node)), view.node_events(str(args.node)), time.time())
    for verdict, check, detail in found:
        print(f"{verdict:<4} {check}: {detail}")
    return 1 if any(verdict == "FAIL" for verdict, _, _ in found) else 0
