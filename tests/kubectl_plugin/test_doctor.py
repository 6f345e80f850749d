"""Issue 46: `kubectl egpu doctor NODE` reads a node's hand-over from what the API shows: one verdict per check."""

from __future__ import annotations

import time
from typing import Any

import pytest

from elasticgpu.api import node_handover
from elasticgpu.kubectl_plugin import doctor, handover

NOW = time.time()
STAMP = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW))
OLD = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - 600))


def _node(labels: dict[str, str], allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "labels": labels}, "status": {"allocatable": allocatable or {}}}


def _gpu(*, beat: str = STAMP, hook: str = "True", fail_open: str = "False", conflict: str = "False") -> dict[str, Any]:
    conditions = [
        {"type": "Heartbeat", "status": "True", "lastTransitionTime": beat},
        {"type": node_handover.CONDITION_NODE_HOOK, "status": hook, "message": f"hook {hook}"},
        {"type": node_handover.CONDITION_FAIL_OPEN, "status": fail_open, "message": f"toolkit {fail_open}"},
        {"type": node_handover.CONDITION_ALLOCATOR_CONFLICT, "status": conflict, "message": "nvidia-gpu.sock"},
    ]
    return {"metadata": {"name": "gpu-1"}, "status": {"conditions": conditions}}


OPTED = {node_handover.LABEL_AGENT: "true", node_handover.LABEL_DEVICE_PLUGIN_DEPLOY: "false"}
LIVE_EVENT = {"reason": node_handover.EVENT_ALLOCATOR_LIVE, "message": "stands by", "lastTimestamp": STAMP}


@pytest.mark.parametrize(("node", "gpus", "events", "expected"), [
    # A moved node, all well.
    (_node(OPTED), [_gpu()], [], {"opted in": "ok", "GPU Operator's device plugin": "ok", "allocator conflicts": "ok",
                                  "agent's cards": "ok", "node hook": "ok", "toolkit setting": "ok"}),
    # Not opted in, the device plugin's: nothing to fail.
    (_node({node_handover.LABEL_DEVICE_PLUGIN_DEPLOY: "true"}, {"nvidia.com/gpu": "8"}), [], [],
     {"opted in": "warn", "allocator conflicts": "warn", "agent's cards": "ok", "node hook": "?",
      "toolkit setting": "?"}),
    # Labelled, the device plugin still live, the agent standing by: no cards yet.
    (_node({node_handover.LABEL_AGENT: "true"}, {"nvidia.com/gpu": "8"}), [], [LIVE_EVENT],
     {"GPU Operator's device plugin": "warn", "allocator conflicts": "warn", "agent's cards": "FAIL"}),
    # Both allocators on one node's cards: the conflict FAILs.
    (_node(OPTED), [_gpu(conflict="True")], [], {"allocator conflicts": "FAIL"}),
    (_node(OPTED, {"nvidia.com/gpu": "2"}), [_gpu()], [], {"allocator conflicts": "FAIL"}),
    # A silent agent, a hook not registered, the toolkit open.
    (_node(OPTED), [_gpu(beat=OLD, hook="False", fail_open="True")], [],
     {"agent's cards": "FAIL", "node hook": "FAIL", "toolkit setting": "warn"}),
])
def test_each_check_says_its_verdict(node: dict[str, Any], gpus: list[dict[str, Any]], events: list[dict[str, Any]],
                                     expected: dict[str, str]) -> None:
    found = {check: verdict for verdict, check, _ in doctor.checks(node, gpus, events, NOW)}
    assert len(found) == 6, found
    assert {k: found[k] for k in expected} == expected, found


@pytest.mark.parametrize(("pod", "gpu", "drain"), [
    ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}, True, True),
    ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "0"}}}]}}, False, True),
    ({"spec": {"initContainers": [{"resources": {"requests": {"nvidia.com/gpumem": "4000"}}}]}}, True, True),
    ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/hostdev": "1"}}}]}}, False, True),
    ({"metadata": {"ownerReferences": [{"kind": "DaemonSet"}]},
      "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}, True, False),
    ({"status": {"phase": "Succeeded"}, "spec": {"containers": []}}, False, False),
])
def test_which_pods_the_handover_drains(pod: dict[str, Any], gpu: bool, drain: bool) -> None:
    assert handover.gpu_pod(pod) is gpu
    assert handover.drained(pod) is drain


def test_cards_are_published_once_each_beats_and_its_hook_is_registered() -> None:
    assert handover.cards_published([], NOW) == "no GPU object of this node yet"
    assert handover.cards_published([_gpu()], NOW) is None
    assert "no recent heartbeat" in str(handover.cards_published([_gpu(beat=OLD)], NOW))
    assert "node hook not registered (hook False)" in str(handover.cards_published([_gpu(hook="False")], NOW))


def test_the_device_plugin_switch_is_a_label_set_or_removed() -> None:
    assert handover._label_patch("nvidia.com/gpu.deploy.device-plugin=false") == {
        "nvidia.com/gpu.deploy.device-plugin": "false"}
    assert handover._label_patch("gpu-") == {"gpu": None}  # HAMi's device plugin selects gpu=on
    with pytest.raises(Exception, match="write LABEL=VALUE or LABEL-"):
        handover._label_patch("gpu")
