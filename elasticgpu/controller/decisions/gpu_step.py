"""The next step of one GPU sync, decided at once: the readiness the picture keeps for the card,
when to look again, and, when its `Ready` condition must change, the GPU body to write.

`flow.gpu_sync` asks this once per sync (under the picture's lock, on the GPU as the picture
holds it), then writes, then records the answer: the sync never comes back here in between.
The rules themselves are `gpu_health`'s (readiness by heartbeat, the condition to write, the
conditions kept); this module only puts them in order. No I/O, no clock: `now` and the
timestamp to write are parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticgpu.api import GPU
from elasticgpu.controller.decisions import gpu_health

Body = dict[str, Any]
REASON_NODE_GONE = "NodeGone"
"""The Event when a GPU object is deleted because its Node is gone (`delete`)."""


@dataclass(frozen=True)
class GPUStep:
    """What one sync of a GPU does."""

    ready: bool
    """Whether the card takes new reservations (the picture keeps it; no write needed)."""
    recheck_in_s: float | None
    """Seconds until the answer may change with no event (a heartbeat expiring), or None."""
    condition: Body | None = None
    """The `Ready` condition to write, or None when the object says so already."""
    body: Body | None = None
    """The GPU body to PUT when `condition` is set: the picture's copy (its resourceVersion is
    the precondition) with `condition` in its status and everything else as it was read."""
    delete: bool = False
    """Delete the GPU object: its Node has been gone for longer than the grace (the garbage
    collection of a deleted Node's cards, as the pod GC does for its pods)."""


def decide(gpu: GPU, body: Body, *, now: float, grace_s: float, now_rfc3339: str,
           node_gone_for_s: float | None = None, node_gone_grace_s: float = 60.0) -> GPUStep:
    """The step for GPU `gpu` (whose body as read is `body`) at `now` (seconds since the epoch),
    with heartbeats older than `grace_s` expired; `now_rfc3339` stamps a condition written.
    `node_gone_for_s`: seconds its Node has been missing (None: it exists, or nobody can tell);
    past `node_gone_grace_s` the object is deleted, before that it is looked at again then."""
    if node_gone_for_s is not None:
        if node_gone_for_s >= node_gone_grace_s:
            # OBSERVATION: its Node is gone for good: the card and its reports went with it.
            return GPUStep(ready=False, recheck_in_s=None, delete=True)
        # OBSERVATION: its Node went missing a moment ago: no new reservations; delete it after the grace.
        return GPUStep(ready=False, recheck_in_s=node_gone_grace_s - node_gone_for_s + 0.1)
    state = gpu_health.readiness(gpu, now=now, grace_s=grace_s)
    condition = gpu_health.condition_to_write(gpu, state, now_rfc3339=now_rfc3339)
    if condition is None:
        return GPUStep(ready=state.ready, recheck_in_s=state.recheck_in_s)
    status = dict(body.get("status") or {})
    status["conditions"] = gpu_health.with_condition(status.get("conditions") or [], condition)
    return GPUStep(ready=state.ready, recheck_in_s=state.recheck_in_s, condition=condition,
                   body={**body, "status": status})
