"""`bench/fleet_controller.py --prebound`: the bound state written by the controller's own code.

Having the real controller bind 50,000 claims one sync at a time took too long on this box (34
claims/s at 8,000 cards, 10/s at 16,000: its allocator searches every card of one picture). Here
each writer process owns a slice of the cards and its claims, holds a picture of that slice
alone, and drives the controller's own classes over the real API server, in the controller's
order:

  1. its GPU objects created (as the agents would), taken into its picture;
  2. per claim, either a claim a user made, or (most of them) a pod with an inline request, as
     the admission webhook leaves it (`admission.reviewing.decide`'s patch applied), then the
     controller's pod sync (`PodSync.sync`), which creates the pod's inline claim;
  3. the reservations: `Commit.plan_slice` (the allocator, on the slice's picture) and
     `Commit.commit_batch` (one GPU status write per card, with every reservation on it);
  4. the rest of each bind: `ClaimBinding.after_commit` (the ElasticGPU created, the claim's
     spec and status, the ElasticGPU's status, the Event of a user's claim);
  5. the pod sync again, which lifts the gate (`pod_gate.lift_patch`).

So every object is what the controller would leave, written by its functions; nothing is built
by hand but the user's claim and pod (the inputs) and the cards. A controller started on it
should find nothing to repair (the bench counts its writes).
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from elasticgpu.api import names
from elasticgpu.controller.admission import reviewing
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.flow.binding.commit import Commit, Planned
from elasticgpu.controller.flow.binding.elasticgpu_sync import ElasticGPUSync
from elasticgpu.controller.flow.claim_sync import ClaimSync
from elasticgpu.controller.flow.machinery.events import EventRecorder
from elasticgpu.controller.flow.machinery.failures import Failures
from elasticgpu.controller.flow.machinery.handoff import HandOff
from elasticgpu.controller.flow.machinery.workqueue import Key, WorkQueue
from elasticgpu.controller.picture.picture import Picture
from elasticgpu.controller.pods.pod_sync import PodSync
from elasticgpu.controller.settings import BindingSettings, ControllerSettings

CONTAINER = "main"


def is_inline(index: int, pods_percent: int) -> bool:
    """True when claim `index` comes from a pod's inline request (`pods_percent` of every 100)."""
    user = 100 - pods_percent
    return (index * user) // 100 == ((index + 1) * user) // 100


def pod_name(index: int) -> str:
    return f"pod-{index:06d}"


def user_claim_name(index: int) -> str:
    return f"claim-{index:06d}"


def _add(document: dict[str, Any], path: str, value: Any) -> None:
    """RFC 6902 `add` (all the webhook's patch uses): the member set, or appended for `-`."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    target: Any = document
    for part in parts[:-1]:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if isinstance(target, list) and parts[-1] == "-":
        target.append(value)
    elif isinstance(target, list):
        target.insert(int(parts[-1]), value)
    else:
        target[parts[-1]] = value


def admitted_pod(name: str, namespace: str, request: str) -> dict[str, Any]:
    """A pod with one inline request, as the admission webhook lets it in (gate and label added by
    the webhook's own decision)."""
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "annotations": {names.inline_request_annotation(CONTAINER): request}},
        "spec": {"containers": [{"name": CONTAINER, "image": "busybox:1.36",
                                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
    }
    verdict = reviewing.decide({"operation": "CREATE", "kind": {"kind": "Pod"}, "namespace": namespace,
                                "object": pod})
    if not verdict.allowed:
        raise ValueError(f"pod {namespace}/{name}: the webhook refuses it: {verdict.message}")
    admitted = copy.deepcopy(pod)
    for operation in verdict.patch:
        assert operation["op"] == "add", operation
        _add(admitted, operation["path"], operation["value"])
    return admitted


def prebind_range(kubeconfig: str, namespace: str, gpus: list[dict[str, Any]], claims: list[int], *,
                  user_claim: dict[str, Any], pod_request: str, pods_percent: int,
                  threads: int) -> dict[str, float]:
    """In a writer process: create `gpus` and bind the claims numbered `claims` on them (see the
    module docstring); seconds of each step, and the counts."""
    kube = KubeApi.from_kubeconfig(kubeconfig)
    settings = ControllerSettings()
    picture = Picture()
    queue = WorkQueue(settings.retry)  # the keys the syncs queue: not worked here, each step is driven below
    events = EventRecorder(kube, background=False)
    pool = ThreadPoolExecutor(threads)
    commit = Commit(kube=kube, picture=picture, queue=queue, settings=settings, pool=pool)
    elastic_gpus = ElasticGPUSync(kube=kube, picture=picture, queue=queue, events=events, commit=commit,
                                  settings=settings.gpu_health)
    # No hand-off pool: each bind's steps after its commit point run on the calling thread.
    hand_off = HandOff(queue=queue, failures=Failures(queue), settings=BindingSettings(workers=0))
    claim_sync = ClaimSync(kube=kube, picture=picture, queue=queue, events=events, commit=commit,
                           elastic_gpus=elastic_gpus, hand_off=hand_off, settings=settings)
    pods = PodSync(kube=kube, picture=picture, queue=queue, events=events, commit=commit,
                   binding=claim_sync.binding)
    took: dict[str, float] = {}
    cpu = time.process_time()

    def step(name: str, began: float) -> None:
        """The step's wall seconds, and this process's CPU seconds in it (the controller's code
        in Python against the server's share)."""
        nonlocal cpu
        took[f"{name}_s"] = time.monotonic() - began
        took[f"{name}_cpu_s"] = time.process_time() - cpu
        cpu = time.process_time()
    try:
        for klass in kube.list_classes():
            picture.observe("class", None, klass)
        began, cpu = time.monotonic(), time.process_time()
        for answer in pool.map(kube.create_gpu, gpus):
            picture.observe("gpu", None, answer)
        step("gpus", began)

        began = time.monotonic()

        def make(index: int) -> Key:
            if is_inline(index, pods_percent):
                pod = kube.create_pod(namespace, admitted_pod(pod_name(index), namespace, pod_request))
                picture.put_pod(pod)
                pods.sync(namespace, pod_name(index))  # creates its inline claim
                claim_name = pod_name(index) + f"-{CONTAINER}"
            else:
                body = copy.deepcopy(user_claim)
                body["metadata"] = {"name": user_claim_name(index), "namespace": namespace}
                picture.put_claim(kube.create_claim(body))
                claim_name = user_claim_name(index)
            return ("claim", namespace, claim_name)

        keys = list(pool.map(make, claims))
        step("claims", began)

        began = time.monotonic()
        batch: dict[str, list[Planned]] = {}
        for key in keys:
            planned = commit.plan_slice(key)
            if planned is None:
                raise RuntimeError(f"claim {key[1]}/{key[2]}: not planned as one slice: the slice has no room")
            batch.setdefault(commit.card_of(planned), []).append(planned)
        step("plan", began)
        began = time.monotonic()
        committed = commit.commit_batch(batch)
        if len(committed) != len(keys):
            raise RuntimeError(f"{len(keys) - len(committed)} reservations not committed (a card's write failed)")
        step("reserve", began)

        began = time.monotonic()

        def finish(planned: Planned) -> None:
            # The claim as the picture holds it now (its pod's sync may have taken it in since).
            claim = picture.claim(planned.claim.metadata.namespace or "", planned.claim.metadata.name or "")
            assert claim is not None
            claim_sync.binding.after_commit(claim, planned.decision, planned.egpu_name, planned.placement)

        list(pool.map(finish, committed))
        step("bind", began)

        began = time.monotonic()
        list(pool.map(lambda i: pods.sync(namespace, pod_name(i)),
                      [i for i in claims if is_inline(i, pods_percent)]))  # lifts each gate
        step("lift", began)
        took["claims"] = len(keys)
        took["pods"] = sum(1 for i in claims if is_inline(i, pods_percent))
        return took
    finally:
        pool.shutdown(wait=True)
        events.close()
        kube.close()
