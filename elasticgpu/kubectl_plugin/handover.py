"""`kubectl egpu handover NODE --to elasticgpu|device-plugin`: move one node's GPUs between allocators.

A node's cards have one allocator at a time (elasticgpu.api.node_handover). Moving a node, either way:

    to elasticgpu                                   to device-plugin
    1 cordon                                        1 cordon
    2 drain the pods that use nvidia.com/gpu        2 drain the pods that use claims
      (evictions: PodDisruptionBudgets hold it)       (evictions); wait until the ElasticGPUs of
                                                      deleted claims are gone (refused up front
                                                      while a claim not being deleted holds a card)
    3 the device plugin off for this node           3 the agent off: label elasticgpu.io/agent removed;
      (nvidia.com/gpu.deploy.device-plugin=false,     wait until its pod has left the node
      the GPU Operator's own switch); wait until    4 our GPU objects of the node deleted (refused while
      the Node offers no nvidia.com/gpu               an ElasticGPU is still bound to one of its cards);
    4 the agent on: elasticgpu.io/agent=true;         our nvidia.com/gpu.* labels removed, unless GPU
      wait until its cards are published with a       Feature Discovery keeps them there
      heartbeat and its node hook registered        5 the device plugin on (=true); wait until the Node
    5 uncordon                                        offers nvidia.com/gpu again
                                                    6 uncordon

Each step says what it waits for and for how long (`--step-timeout-s`); a step that runs out of time
stops the command with the node left cordoned and says what to look at. Every step is idempotent:
run the command again. The node is uncordoned at the end only if this command cordoned it (the
annotation `elasticgpu.io/handover` remembers that across runs).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Collection
from typing import Any

from elasticgpu import user_errors
from elasticgpu.api import names, node_handover, timestamps
from elasticgpu.kubectl_plugin import cluster

ANNOTATION_HANDOVER = "elasticgpu.io/handover"
"""On a node this command cordoned: where it is moving ("elasticgpu" or "device-plugin"); removed at the end."""
AGENT_POD_SELECTOR = "app.kubernetes.io/name=elasticgpu,app.kubernetes.io/component=agent"
GPU_LABELS = ("nvidia.com/gpu.present", "nvidia.com/gpu.count", "nvidia.com/gpu.product", "nvidia.com/gpu.memory")
"""The GPU Feature Discovery labels the agent writes on its node (agent/inventory.py)."""
POLL_S = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `handover`."""
    parser.add_argument("node", metavar="NODE", help="the node to move")
    parser.add_argument("--to", required=True, choices=("elasticgpu", "device-plugin"),
                        help="elasticgpu: from the device plugin to the agent; device-plugin: back")
    parser.add_argument("--step-timeout-s", type=float, default=600.0,
                        help="how long each step may wait (drain, device plugin gone, cards published; default 600)")
    parser.add_argument("--device-plugin-off", default=f"{node_handover.LABEL_DEVICE_PLUGIN_DEPLOY}=false",
                        metavar="LABEL=VALUE|LABEL-",
                        help="the node label that takes the device plugin off the node (default: the GPU Operator's"
                             " own switch, %(default)s; HAMi: e.g. gpu-)")
    parser.add_argument("--device-plugin-on", default=f"{node_handover.LABEL_DEVICE_PLUGIN_DEPLOY}=true",
                        metavar="LABEL=VALUE|LABEL-",
                        help="the node label that brings it back (default %(default)s; HAMi: e.g. gpu=on)")
    parser.add_argument("--agent-namespace", default="elasticgpu-system",
                        help="namespace of the agent's DaemonSet pods (default %(default)s)")
    parser.add_argument("--disable-eviction", action="store_true",
                        help="delete the pods instead of evicting them (PodDisruptionBudgets are not consulted;"
                             " as kubectl drain's flag)")
    parser.add_argument("--grace-period-s", type=int, default=None,
                        help="seconds each drained pod gets to stop (default: the pod's own)")


def _label_patch(spec: str) -> dict[str, str | None]:
    """`key=value` sets a label, `key-` removes it (kubectl label's spelling)."""
    if spec.endswith("-") and "=" not in spec:
        return {spec[:-1]: None}
    key, sep, value = spec.partition("=")
    if not sep or not key:
        raise user_errors.UserError(f"--device-plugin-off/--device-plugin-on {spec!r}: write LABEL=VALUE or LABEL-")
    return {key: value}


def gpu_pod(pod: dict[str, Any]) -> bool:
    """A pod a device plugin gave cards to: a container (or init container) asks a GPU resource."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        if any(node_handover.gpu_resource(name) and node_handover.quantity_above_zero(value)
               for name, value in asked.items()):  # fmt: skip
            return True
    return False


def drained(pod: dict[str, Any]) -> bool:
    """Pods a drain leaves: finished ones, DaemonSet pods (their controller puts them back), mirror pods."""
    meta = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return not any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or [])


class Step:
    """Prints the steps, numbered, and waits with a deadline."""

    def __init__(self, node: str, total: int, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._node = node
        self._total = total
        self._n = 0
        self._timeout_s = timeout_s
        self._clock = clock

    def say(self, text: str) -> None:
        self._n += 1
        print(f"[{self._n}/{self._total}] {text}", flush=True)

    def wait(self, what: str, done: Callable[[], str | None], hint: Callable[[], str] = lambda: "") -> None:
        """Wait until `done()` returns None (it returns what is still missing), up to the step's deadline."""
        began = self._clock()
        print(f"      waiting up to {self._timeout_s:.0f} s for {what}", flush=True)
        missing = done()
        while missing is not None:
            if self._clock() - began > self._timeout_s:
                more = hint()
                raise user_errors.UserError(
                    f"node {self._node}: {what} did not happen within {self._timeout_s:.0f} s ({missing})"
                    + (f"; {more}" if more else "")
                    + "; the node stays cordoned: fix it and run the same command again (every step is idempotent)")
            time.sleep(POLL_S)
            missing = done()
        print(f"      done ({self._clock() - began:.0f} s)", flush=True)


def _cordon(view: cluster.Cluster, node: str, to: str, step: Step) -> None:
    body = view.node(node)
    spec = body.get("spec") or {}
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if spec.get("unschedulable") and ANNOTATION_HANDOVER not in annotations:
        step.say(f"node {node} is cordoned already (not by this command): it stays cordoned at the end")
        return
    view.patch_node(node, {"spec": {"unschedulable": True}, "metadata": {"annotations": {ANNOTATION_HANDOVER: to}}})
    step.say(f"cordoned node {node}: no new pod lands there while it moves")


def _uncordon(view: cluster.Cluster, node: str, step: Step) -> None:
    annotations = (view.node(node).get("metadata") or {}).get("annotations") or {}
    if ANNOTATION_HANDOVER in annotations:
        view.patch_node(node, {"spec": {"unschedulable": None},
                               "metadata": {"annotations": {ANNOTATION_HANDOVER: None}}})
        step.say(f"uncordoned node {node}")
    else:
        step.say(f"node {node} left as it was (this command did not cordon it)")


def _drain(view: cluster.Cluster, node: str, args: argparse.Namespace, step: Step, which: str,
           chosen: Callable[[dict[str, Any]], bool], label_selector: str = "") -> None:  # fmt: skip
    def pods() -> list[dict[str, Any]]:
        return [p for p in view.pods_on_node(node, label_selector=label_selector) if drained(p) and chosen(p)]

    names_ = [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods()]
    how = "deleting" if args.disable_eviction else "evicting"
    step.say(f"draining the pods that use {which} on node {node}: "
             + (f"{how} {', '.join(names_)}" if names_ else "none"))
    told: set[str] = set()

    def remaining() -> str | None:
        left = pods()
        for pod in left:
            meta = pod["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            if meta.get("deletionTimestamp"):
                continue  # on its way out: its grace period runs
            if args.disable_eviction:
                view.delete_pod(meta["namespace"], meta["name"], grace_s=args.grace_period_s)
            elif not view.evict(meta["namespace"], meta["name"], grace_s=args.grace_period_s) and key not in told:
                told.add(key)
                print(f"      {key}: a PodDisruptionBudget refuses its eviction now; retrying", flush=True)
        return f"{len(left)} left: " + ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                                                 for p in left) if left else None  # fmt: skip

    step.wait(f"the pods that use {which} to leave node {node}", remaining)


def _offered(view: cluster.Cluster, node: str) -> list[node_handover.LiveAllocator]:
    return node_handover.from_node(view.node(node))


def _agent_event(view: cluster.Cluster, node: str) -> str:
    live = [e for e in view.node_events(node) if e.get("reason") == node_handover.EVENT_ALLOCATOR_LIVE]
    return f"the agent says: {live[-1].get('message')}" if live else (
        f"is the agent's pod running there? kubectl get pods -A -o wide --field-selector spec.nodeName={node};"
        f" kubectl egpu doctor {node}")


def cards_published(gpus: list[dict[str, Any]], now: float, *, fresh_s: float = 120.0) -> str | None:
    """None when the node's agent publishes its cards: at least one GPU object, each with a recent heartbeat and
    the node hook registered; else what is missing."""
    if not gpus:
        return "no GPU object of this node yet"
    for gpu in gpus:
        conditions = {c.get("type"): c for c in (gpu.get("status") or {}).get("conditions") or []}
        name = gpu["metadata"]["name"]
        beat = timestamps.epoch_seconds((conditions.get("Heartbeat") or {}).get("lastTransitionTime"))
        if beat is None or now - beat > fresh_s:
            return f"GPU {name} has no recent heartbeat"
        hook = conditions.get(node_handover.CONDITION_NODE_HOOK) or {}
        if hook.get("status") != "True":
            return f"GPU {name}: node hook not registered ({hook.get('message') or 'no NodeHook condition yet'})"
    return None


def _deleting_claims(view: cluster.Cluster) -> set[tuple[str, str]]:
    """(namespace, name) of the claims being deleted: claim protection keeps each while a pod uses it."""
    return {((c.get("metadata") or {}).get("namespace", ""), (c.get("metadata") or {}).get("name", ""))
            for c in view.claim_bodies() if (c.get("metadata") or {}).get("deletionTimestamp")}  # fmt: skip


def _bound_elastic_gpus(view: cluster.Cluster, gpu_names: set[str],
                        going: Collection[tuple[str, str]] = ()) -> list[str]:  # fmt: skip
    """The ElasticGPUs that hold one of `gpu_names`, less those of the claims in `going`."""
    held = []
    for egpu in view.elastic_gpu_bodies():
        spec = egpu.get("spec") or {}
        ref = spec.get("claimRef") or {}
        if (ref.get("namespace"), ref.get("name")) in going:
            continue
        cards = set((spec.get("physicalGPU") or {}).get("gpuNames") or [])
        share = (spec.get("gpuShare") or {}).get("gpuName")
        if share:
            cards.add(share)
        # Any phase: a Released one with reclaim Retain keeps its reservation too, until an admin deletes it.
        phase = (egpu.get("status") or {}).get("phase") or "no phase"
        if cards & gpu_names:
            claim = f"claim {ref.get('namespace')}/{ref.get('name')}, " if ref else ""
            held.append(f"{egpu['metadata']['name']} ({claim}{phase})")
    return held


def to_elasticgpu(view: cluster.Cluster, node: str, args: argparse.Namespace) -> None:
    step = Step(node, 5, args.step_timeout_s)
    _cordon(view, node, "elasticgpu", step)
    _drain(view, node, args, step, "nvidia.com/gpu (or another GPU device plugin's resource)", gpu_pod)
    off = _label_patch(args.device_plugin_off)
    view.patch_node(node, {"metadata": {"labels": off}})
    step.say(f"device plugin off for node {node}: " + ", ".join(f"{k}={v}" if v is not None else f"{k} removed"
                                                               for k, v in off.items()))

    def plugin_gone() -> str | None:
        live = _offered(view, node)
        return "; ".join(sign.what for sign in live) if live else None

    step.wait(f"node {node} to offer no GPU resource of a device plugin (its pod leaves; kubelet drops the"
              " allocatable)", plugin_gone,
              lambda: "the device plugin still runs there: with the GPU Operator check the label above on the node"
                      " and `kubectl get pods -n gpu-operator -o wide`; without it, stop the plugin's DaemonSet on"
                      " this node yourself (--device-plugin-off names the label its nodeSelector reads)")
    view.patch_node(node, {"metadata": {"labels": {node_handover.LABEL_AGENT: "true"}}})
    step.say(f"labelled node {node} {node_handover.LABEL_AGENT}=true: the agent's DaemonSet starts a pod there")
    step.wait(f"the agent to publish node {node}'s cards (GPU objects with a heartbeat, node hook registered)",
              lambda: cards_published(view.node_gpus(node), time.time()), lambda: _agent_event(view, node))
    _uncordon(view, node, step)
    print(f"node {node} is elasticgpu's: kubectl get pgpu -l {names.LABEL_NODE}={node}")


def to_device_plugin(view: cluster.Cluster, node: str, args: argparse.Namespace) -> None:
    step = Step(node, 6, args.step_timeout_s)
    gpus = {g["metadata"]["name"] for g in view.node_gpus(node)}
    # A claim being deleted does not hold the move back: its pods are drained below, then claim protection lets
    # it go and the controller releases its ElasticGPU (waited for before the GPU objects go).
    held = _bound_elastic_gpus(view, gpus, _deleting_claims(view))
    if held:
        raise user_errors.UserError(
            f"node {node}: ElasticGPUs still hold its cards: {', '.join(held)}; delete those claims (their pods may"
            " still run: this command drains them) or move their workloads to another node's claims, and delete"
            " Released ElasticGPUs kept by reclaim Retain, first: a claim outlives its pods, as a"
            " PersistentVolumeClaim does. Nothing was changed")
    _cordon(view, node, "device-plugin", step)
    _drain(view, node, args, step, "elasticgpu claims", lambda _: True, f"{names.LABEL_USES_CLAIMS}=true")
    step.wait(f"the ElasticGPUs of the deleted claims on node {node} to go (each once its claim's pods have left)",
              lambda: ", ".join(_bound_elastic_gpus(view, gpus)) or None,
              lambda: "is the controller running? an ElasticGPU its claim's reclaim Retain keeps stays Released:"
                      " delete it")
    view.patch_node(node, {"metadata": {"labels": {node_handover.LABEL_AGENT: None}}})
    step.say(f"removed the label {node_handover.LABEL_AGENT} from node {node}: the agent's DaemonSet leaves it")

    def agent_gone() -> str | None:
        pods = [p for p in view.pods_on_node(node, label_selector=AGENT_POD_SELECTOR)
                if (p.get("metadata") or {}).get("namespace") == args.agent_namespace]
        return f"agent pod {pods[0]['metadata']['name']} still there" if pods else None

    step.wait(f"the agent's pod to leave node {node}", agent_gone)
    gpus = {g["metadata"]["name"] for g in view.node_gpus(node)}
    for name in sorted(gpus):
        view.delete_gpu(name)
    labels = (view.node(node).get("metadata") or {}).get("labels") or {}
    gfd = node_handover.GPU_FEATURE_DISCOVERY_LABEL in labels or any(
        k.startswith("nvidia.com/gpu.deploy.") for k in labels)
    ours = [k for k in GPU_LABELS if k in labels]
    if ours and not gfd:
        view.patch_node(node, {"metadata": {"labels": dict.fromkeys(ours)}})
        kept = f"removed the labels {', '.join(ours)}"
    elif ours:
        kept = (f"kept the labels {', '.join(ours)}: GPU Feature Discovery writes the same ones here and keeps them"
                " true (the GPU Operator schedules its operands by nvidia.com/gpu.present)")
    else:
        kept = "no nvidia.com/gpu.* label of ours"
    step.say(f"deleted node {node}'s GPU objects ({', '.join(sorted(gpus)) or 'none'}); {kept}")
    on = _label_patch(args.device_plugin_on)
    view.patch_node(node, {"metadata": {"labels": on}})
    step.say(f"device plugin on for node {node}: " + ", ".join(f"{k}={v}" if v is not None else f"{k} removed"
                                                              for k, v in on.items()))

    def plugin_back() -> str | None:
        return None if _offered(view, node) else "no nvidia.com/gpu in the Node's allocatable yet"

    step.wait(f"node {node} to offer nvidia.com/gpu again (the device plugin registers with kubelet)", plugin_back)
    _uncordon(view, node, step)
    print(f"node {node} is the device plugin's. Left on the node itself (no API object; remove by hand if you"
          " want): the agent's ledger /var/lib/elasticgpu, its CDI spec /var/run/cdi/elasticgpu.io-gpu.json and"
          " /var/run/elasticgpu (docs/admin-guide.md, \"Moving a GPU Operator cluster\")")


def run(args: argparse.Namespace, view: cluster.Cluster) -> int:
    """Move NODE to the allocator `--to` names."""
    node = str(args.node)
    view.node(node)  # a node that does not exist: told before anything changes
    if args.to == "elasticgpu":
        to_elasticgpu(view, node, args)
    else:
        to_device_plugin(view, node, args)
    return 0
