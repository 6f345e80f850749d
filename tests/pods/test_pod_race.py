"""Two controllers (leader election off: two `Controller`s in this process, each with its own
watches and worker) race on the same gated pods: 12 pods, each with two WaitForFirstConsumer
inline claims of 40% that must share a node, on 4 nodes of 2 cards (room for 8 such pods).
Afterwards: every lifted pod's claims are Bound on the node it is pinned to, no card is
oversubscribed, no claim has two ElasticGPUs or two reservations, the pods left gated say
FailedClaimPlacement and hold nothing, and all the room is used."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from elasticgpu.api import names
from elasticgpu.controller.decisions import pod_gate
from elasticgpu.controller.process.reconciling import Controller
from tests.binding import objects as o
from tests.pods.claim_world import World, controller_for, kube, world

__all__ = ["kube", "world"]  # fixtures

NODES = 4
PODS = 12
ROOM = 2 * NODES  # two pods (four claims of 40%) per node of two cards
DEADLINE_S = 120.0


def _run(controller: Controller, stop: threading.Event) -> list[threading.Thread]:
    listed = controller.rebuild()
    threads = controller.informer.start(stop, timeout_s=30, listed=listed)
    worker = threading.Thread(target=controller.run_worker, args=(stop,), name="worker", daemon=True)
    worker.start()
    return [*threads, worker]


def _state(world: World) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pods = [world.core.api_client.sanitize_for_serialization(p)
            for p in world.core.list_namespaced_pod(world.namespace).items]
    return pods, world.kube.list_claims(world.namespace)


def _settled(world: World) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Wait until every pod is lifted or says why not, and nothing changed for 3 s."""
    deadline = time.monotonic() + DEADLINE_S
    last: tuple[Any, ...] = ()
    since = time.monotonic()
    while time.monotonic() < deadline:
        pods, claims = _state(world)
        done = all(not pod_gate.is_gated(p) or (pod_gate.condition_of(p) or {}).get("reason") for p in pods)
        fingerprint = tuple(sorted(str(o_["metadata"]["resourceVersion"]) for o_ in [*pods, *claims]))
        if fingerprint != last:
            last, since = fingerprint, time.monotonic()
        elif done and time.monotonic() - since > 3.0:
            return pods, claims
        time.sleep(0.3)
    raise AssertionError(f"the controllers did not settle in {DEADLINE_S:.0f}s")


def test_two_controllers_race_on_the_same_gated_pods(world: World) -> None:
    model = f"T{world.prefix}"
    gpus = []
    for n in range(NODES):
        node = world.node(f"{world.prefix}-n{n}")
        for i in range(2):
            gpus.append(f"gpu-{node}-{i}")
            world.gpu(o.gpu(gpus[-1], node=node, index=i, model=model))
    wffc = f"{world.prefix}-wffc"
    world.klass(o.klass(wffc, mode="WaitForFirstConsumer", parameters={"gpuModel": model}))
    request = f"gpu-core=40,gpu-memory=1Gi,class={wffc}"
    stop = threading.Event()
    threads: list[threading.Thread] = []
    controllers = [controller_for(world), controller_for(world)]
    try:
        for controller in controllers:
            threads += _run(controller, stop)
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda i: world.pod(f"p{i}", inline={"main": request, "side": request}), range(PODS)))
        pods, claims = _settled(world)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=40)
        for controller in controllers:
            controller.close()

    by_name = {c["metadata"]["name"]: c for c in claims}
    lifted = [p for p in pods if not pod_gate.is_gated(p)]
    for pod in lifted:
        name = pod["metadata"]["name"]
        node = pod_gate.pinned_node(pod)
        pair = [by_name[f"{name}-main"], by_name[f"{name}-side"]]
        assert [c["status"]["phase"] for c in pair] == ["Bound", "Bound"], name
        assert {c["status"]["nodeName"] for c in pair} == {node}, f"{name}: claims not on its node {node}"
        for claim in pair:
            assert claim["status"]["users"] == [{"name": name, "uid": pod["metadata"]["uid"]}]
    for pod in pods:
        if pod_gate.is_gated(pod):
            name = pod["metadata"]["name"]
            assert pod_gate.condition_of(pod)["reason"] == "FailedClaimPlacement", name  # type: ignore[index]
            assert {by_name[f"{name}-{c}"]["status"].get("phase") for c in ("main", "side")} == {"Pending"}
    assert len(lifted) == ROOM, f"{len(lifted)} pods lifted, room for {ROOM}"

    # No card oversubscribed; every reservation is a Bound claim's, once.
    held: Counter[str] = Counter()
    for gpu in gpus:
        allocations = (world.kube.get_gpu(gpu).get("status") or {}).get("allocations") or []
        assert sum(a["cores"] for a in allocations) <= 100, gpu
        held.update(a["elasticGPU"] for a in allocations)
    bound = {c["spec"]["elasticGPUName"] for c in claims if (c.get("status") or {}).get("phase") == "Bound"}
    assert set(held) == bound and all(count == 1 for count in held.values()), held
    # No claim bound twice: one ElasticGPU per claim uid.
    refs = Counter((e["spec"].get("claimRef") or {}).get("uid") for e in world.kube.list_elastic_gpus()
                   if (e["spec"].get("claimRef") or {}).get("namespace") == world.namespace)
    assert all(count == 1 for count in refs.values()), refs
    assert len(refs) == 2 * ROOM
    selected = [p["metadata"].get("annotations", {}).get(names.ANNOTATION_SELECTED_NODE) for p in lifted]
    assert selected == [pod_gate.pinned_node(p) for p in lifted]
