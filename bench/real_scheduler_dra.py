"""The DRA kinds of bench/real_scheduler.py served by OUR driver (issue 48 item 4): `dra-ours` (a whole
card) and `dra-ours-shared` (cores 10 / memory 1Gi of a card, consumable capacity).

What a node agent with DRA cards does, done for the simulated nodes with the agent's own code:

  * the cards are handed to DRA as a platform team does it, `spec.owner: DRA` on each GPU object, and
    our controller (the real process the bench runs) moves `status.owner` once nothing of ours holds
    the card (elasticgpu/controller/decisions/owner_move.py); the bench waits for every card;
  * each node's ResourceSlice is published by the agent's publisher: one
    `elasticgpu.agent.dra.slice_publishing.SlicePublisher` per node over the agent's own
    `elasticgpu.agent.kube.AgentKube` (field manager elasticgpu-agent, server-side apply), fed the
    node's GPU objects as the API server returns them, so `slice_content` builds the devices
    (attributes, capacity cores/memory with request policies, allowMultipleAllocations) exactly as
    on a node; nothing of the slice is written here;
  * the DeviceClasses are the chart's (deploy/chart/templates/dra.yaml): `gpu.elasticgpu.io` and
    `gpu-slice.elasticgpu.io`.

Fairness as for the made-up drivers (issue 49 item 5): the slices are published before the run's
idle window and withdrawn after it (each publisher is given no DRA card: it deletes its slice, as
for a node whose cards all went back), so no other run sees them. The owner moves happen outside
the measured windows, lazily: cards go to DRA before the first dra-ours run and back to ElasticGPU
before the next ours-* run (the move back waits the controller's unpublish grace, 10 s).
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from elasticgpu.agent import kube as agent_kube
from elasticgpu.agent.dra import slice_publishing
from elasticgpu.agent.settings import KubeSettings
from elasticgpu.api import dra_names, names

KINDS = ("dra-ours", "dra-ours-shared")
WHOLE_CLASS, SLICE_CLASS = "gpu.elasticgpu.io", "gpu-slice.elasticgpu.io"
RESOURCE = ("resource.k8s.io", "v1")
NEEDS_OWNER = {"dra-ours": names.OWNER_DRA, "dra-ours-shared": names.OWNER_DRA,
               "ours-whole": names.OWNER_ELASTIC_GPU, "ours-slice": names.OWNER_ELASTIC_GPU}  # fmt: skip
"""The cards' owner a kind needs; the other kinds run on either."""
REQUESTS = {
    # no capacity named: the request policy's default, the whole card (docs/dra.md)
    "dra-ours": {"deviceClassName": WHOLE_CLASS, "allocationMode": "ExactCount", "count": 1},
    "dra-ours-shared": {"deviceClassName": SLICE_CLASS, "allocationMode": "ExactCount", "count": 1,
                        "capacity": {"requests": {"cores": "10", "memory": "1Gi"}}},
}  # fmt: skip
"""The ResourceClaimTemplates' `exactly` of each kind, as a user of the chart's classes writes them."""


def create_device_classes(custom: Any) -> None:
    """The chart's two DeviceClasses of our driver (deploy/chart/templates/dra.yaml, dra.enabled)."""
    for klass, extra in ((WHOLE_CLASS, ""), (SLICE_CLASS, " && device.allowMultipleAllocations == true")):
        expression = f'device.driver == "{dra_names.DRIVER_NAME}"{extra}'
        custom.create_cluster_custom_object(*RESOURCE, "deviceclasses", {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": klass},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}})  # fmt: skip


def list_gpus(custom: Any) -> list[dict[str, Any]]:
    """Every GPU object, in pages (16,000 of them at 2,000 nodes)."""
    items: list[dict[str, Any]] = []
    token = None
    while True:
        page = custom.list_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL_GPU, limit=500,
                                                 **({"_continue": token} if token else {}))  # fmt: skip
        items += page["items"]
        token = page["metadata"].get("continue")
        if not token:
            return items


class OurDriver:
    """The simulated nodes' agents as far as DRA goes: the cards' owner and one publisher per node."""

    def __init__(self, api_client: Any, custom: Any, nodes: list[str]) -> None:
        self.custom = custom
        self.owner = names.OWNER_ELASTIC_GPU
        """The owner every card has now (spec and status), as the bench last made it."""
        field_manager = KubeSettings().field_manager
        self.publishers = {
            node: slice_publishing.SlicePublisher(
                agent_kube.AgentKube(api_client, node_name=node, field_manager=field_manager)
            )
            for node in nodes
        }

    def hand_to(self, owner: str, pool: ThreadPoolExecutor, timeout_s: float = 600) -> None:
        """Set every card's spec.owner to `owner` and wait until the controller has moved its status.owner."""
        if owner == self.owner:
            return
        t = time.monotonic()
        gpus = list_gpus(self.custom)

        def one(gpu: dict[str, Any]) -> None:
            if (gpu.get("spec") or {}).get("owner") != owner:
                name = gpu["metadata"]["name"]
                self.custom.patch_cluster_custom_object(
                    names.GROUP, names.VERSION, names.PLURAL_GPU, name, {"spec": {"owner": owner}}
                )

        list(pool.map(one, gpus))
        deadline = time.monotonic() + timeout_s
        while True:
            left = [g["metadata"]["name"] for g in list_gpus(self.custom)
                    if (g.get("status") or {}).get("owner", names.OWNER_ELASTIC_GPU) != owner]  # fmt: skip
            if not left:
                break
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"{len(left)} cards' status.owner not {owner} after {timeout_s:.0f} s (e.g. {left[0]})"
                )
            time.sleep(1.0)
        self.owner = owner
        print(
            f"  {len(gpus)} cards handed to {owner} (spec.owner, then the controller's move) in "
            f"{time.monotonic() - t:.0f} s",
            flush=True,
        )

    def publish(self, pool: ThreadPoolExecutor) -> int:
        """Each node's publisher given the node's GPU objects as listed; the slices it wrote."""
        by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for gpu in list_gpus(self.custom):
            by_node[((gpu.get("metadata") or {}).get("labels") or {}).get(names.LABEL_NODE, "")].append(gpu)
        wrote = list(pool.map(lambda node: self.publishers[node].publish(by_node.get(node, [])), self.publishers))
        return sum(wrote)

    def withdraw(self, pool: ThreadPoolExecutor, timeout_s: float = 600) -> None:
        """Each publisher given no DRA card (it deletes its slice); wait until none of our driver's is listed."""
        list(pool.map(lambda publisher: publisher.publish([]), self.publishers.values()))
        deadline = time.monotonic() + timeout_s
        ours = f"spec.driver={dra_names.DRIVER_NAME}"

        def listed() -> bool:
            return bool(self.custom.list_cluster_custom_object(*RESOURCE, "resourceslices", limit=1,
                                                               field_selector=ours)["items"])  # fmt: skip

        while listed():
            if time.monotonic() > deadline:
                raise SystemExit(f"{dra_names.DRIVER_NAME}'s ResourceSlices not gone after {timeout_s:.0f} s")
            print("  (waiting for our driver's ResourceSlices to go)", file=sys.stderr, flush=True)
            time.sleep(1.0)
