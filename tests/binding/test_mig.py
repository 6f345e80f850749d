"""MIG claims bound against the API server: a `partitioning: MIG` class carves each claim a MIG
instance (issue 26): the smallest covering profile, at a start that keeps the card able to take
a 4g, committed with its partition on the GPU, shown in the claim's status (and `kubectl get
-o wide`); a request no profile covers is NeverFits naming the largest; soft slices never land
on a card in MIG mode."""

from __future__ import annotations

import subprocess
from typing import Any

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


def _setup(cluster: Cluster, *, cards: int = 1, mig: bool = True) -> tuple[list[str], str, str]:
    model = f"NVIDIA A100-SXM4-80GB-{cluster.prefix}"  # unique per test, still an A100-80GB to the tables
    gpu_names = []
    for index in range(cards):
        name = f"gpu-{cluster.prefix}-{index}"
        body = o.gpu(name, node=f"{cluster.prefix}-node", index=index, model=model, memory=81920)
        body["spec"]["mig"] = mig
        cluster.gpu(body)
        gpu_names.append(name)
    mig_class = f"{cluster.prefix}-mig"
    body = o.klass(mig_class, parameters={"gpuModel": model})
    body["partitioning"] = "MIG"
    cluster.klass(body)
    soft_class = f"{cluster.prefix}-soft"
    cluster.klass(o.klass(soft_class, parameters={"gpuModel": model}))
    return gpu_names, mig_class, soft_class


def _allocations(kube: KubeApi, gpu_name: str) -> list[dict[str, Any]]:
    return (kube.get_gpu(gpu_name).get("status") or {}).get("allocations") or []


def test_mig_claims_get_profiles_at_starts_that_keep_room(cluster: Cluster, kube: KubeApi) -> None:
    [gpu], mig_class, _soft = _setup(cluster)
    cluster.claim(o.claim("three", cores=30, memory="10Gi", class_name=mig_class))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    claim = cluster.get_claim("three")
    assert claim["status"]["phase"] == "Bound"
    # 30% -> 3g.40gb (2g has 28%); what it received is more than asked, and that is reserved.
    assert claim["status"]["partition"] == {"profile": "3g.40gb", "cores": 42, "memory": 40960, "start": 4}
    assert claim["status"]["capacity"] == {names.RESOURCE_CORE: 42, names.RESOURCE_MEMORY: "40Gi"}
    [allocation] = _allocations(kube, gpu)
    assert allocation["partition"] == {"profile": "3g.40gb", "start": 4}
    # Idempotent: another round writes nothing (the request differs from what is reserved, as MIG does).
    before = claim["metadata"]["resourceVersion"]
    settle(controller)
    assert cluster.get_claim("three")["metadata"]["resourceVersion"] == before
    # The 3g went to slice 4, so the card's only 4g start (0) is still free.
    cluster.claim(o.claim("four", cores=50, memory="20Gi", class_name=mig_class))
    settle(controller)
    four = cluster.get_claim("four")
    assert four["status"]["phase"] == "Bound", four["status"]
    assert four["status"]["partition"]["profile"] == "4g.40gb" and four["status"]["partition"]["start"] == 0
    # The card is carved: a 1g finds no slot (compute 7 of 7), and says so.
    cluster.claim(o.claim("one", cores=10, memory="4Gi", class_name=mig_class))
    settle(controller)
    one = cluster.get_claim("one")
    assert (one["status"]["phase"], one["status"]["reason"]) == ("Pending", "NoCapacity")


def test_no_profile_covers_is_never_fits_naming_the_largest(cluster: Cluster, kube: KubeApi) -> None:
    _gpus, mig_class, _soft = _setup(cluster)
    cluster.claim(o.claim("huge", cores=50, memory="90Gi", class_name=mig_class))
    settle(new_controller(kube, cluster.namespace))
    claim = cluster.get_claim("huge")
    assert (claim["status"]["phase"], claim["status"]["reason"]) == ("Pending", "NeverFits")
    assert "the largest is 7g.80gb" in claim["status"]["message"]


def test_soft_slices_stay_off_mig_cards(cluster: Cluster, kube: KubeApi) -> None:
    [gpu], _mig, soft_class = _setup(cluster)
    cluster.claim(o.claim("soft", cores=30, memory="10Gi", class_name=soft_class))
    settle(new_controller(kube, cluster.namespace))
    assert cluster.get_claim("soft")["status"]["phase"] == "Pending"
    assert _allocations(kube, gpu) == []


def test_kubectl_get_wide_shows_the_profile(cluster: Cluster, kube: KubeApi, kube_cluster: Any) -> None:
    _gpus, mig_class, _soft = _setup(cluster)
    cluster.claim(o.claim("two", cores=20, memory="10Gi", class_name=mig_class))
    settle(new_controller(kube, cluster.namespace))
    kubectl = kube_cluster.kubectl
    assert kubectl is not None, "no kubectl: set ELASTICGPU_KUBECTL_BIN"
    command = [str(kubectl), "--kubeconfig", str(kube_cluster.kubeconfig), "get", "egpuc", "two", "-n",
               cluster.namespace, "-o", "wide"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "PROFILE" in out and "2g.20gb" in out
