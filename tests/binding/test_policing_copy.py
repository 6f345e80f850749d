"""The class's over-limit policy reaches the node agent through the claim (issue 25): the controller
copies `overLimitAction` and `overLimitGraceSeconds` into a Bound claim's `status.policing` with
the bind, keeps it true to the class after an admin edits the class, and keeps the copy when the
class is gone. Against the API server."""

from __future__ import annotations

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.edge.requesting import MERGE
from tests.binding import objects as o
from tests.binding.conftest import Cluster, new_controller, settle


def _setup(cluster: Cluster, **policy: object) -> str:
    model = f"T{cluster.prefix}"
    cluster.gpu(o.gpu(f"gpu-{cluster.prefix}-0", node=f"{cluster.prefix}-node", index=0, model=model))
    name = f"{cluster.prefix}-class"
    cluster.klass({**o.klass(name, parameters={"gpuModel": model}), **policy})
    return name


def _edit_class(kube: KubeApi, name: str, patch: dict[str, object]) -> None:
    kube._call("PATCH", kube._cluster(names.PLURAL_CLASS, name), body=patch, content_type=MERGE)


def test_the_bind_carries_the_class_policy_and_bound_claims_follow_the_class(cluster: Cluster, kube: KubeApi) -> None:
    class_name = _setup(cluster, overLimitAction="StopContainer", overLimitGraceSeconds=30)
    cluster.claim(o.claim("c", cores=30, memory="10Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    claim = cluster.get_claim("c")
    assert claim["status"]["phase"] == "Bound"
    assert claim["status"]["policing"] == {"overLimitAction": "StopContainer", "overLimitGraceSeconds": 30}

    # An admin relaxes the class: the Bound claim follows at its next sync (the periodic resync).
    _edit_class(kube, class_name, {"overLimitAction": "Warn", "overLimitGraceSeconds": 120})
    settle(controller)
    controller.resync(relist=False)
    settle(controller)
    assert cluster.get_claim("c")["status"]["policing"] == {"overLimitAction": "Warn", "overLimitGraceSeconds": 120}

    # The class is deleted: the claim keeps the policy it was bound under.
    kube.delete_class(class_name)
    settle(controller)
    controller.resync(relist=False)
    settle(controller)
    assert cluster.get_claim("c")["status"]["policing"] == {"overLimitAction": "Warn", "overLimitGraceSeconds": 120}


def test_a_class_that_says_nothing_gives_warn_after_60_s(cluster: Cluster, kube: KubeApi) -> None:
    class_name = _setup(cluster)
    cluster.claim(o.claim("c", cores=30, memory="10Gi", class_name=class_name))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    assert cluster.get_claim("c")["status"]["policing"] == {"overLimitAction": "Warn", "overLimitGraceSeconds": 60}


def test_allow_privileged_reaches_the_claim_status_only_from_the_class(cluster: Cluster, kube: KubeApi) -> None:
    """Issue 33.4: the agent lets a privileged container use a claim only when the claim's status (which only the
    controller writes) says allowPrivileged, copied from the class on bind and kept true to it."""
    class_name = _setup(cluster, allowPrivileged=True)
    plain = f"{cluster.prefix}-plain"
    cluster.klass({**o.klass(plain, parameters={"gpuModel": f"T{cluster.prefix}"})})
    cluster.claim(o.claim("c", cores=30, memory="10Gi", class_name=class_name))
    cluster.claim(o.claim("d", cores=30, memory="10Gi", class_name=plain))
    controller = new_controller(kube, cluster.namespace)
    settle(controller)
    assert cluster.get_claim("c")["status"]["allowPrivileged"] is True
    assert "allowPrivileged" not in cluster.get_claim("d")["status"]

    # The admin withdraws it: the Bound claim follows at its next sync.
    _edit_class(kube, class_name, {"allowPrivileged": False})
    settle(controller)
    controller.resync(relist=False)
    settle(controller)
    assert "allowPrivileged" not in cluster.get_claim("c")["status"]
