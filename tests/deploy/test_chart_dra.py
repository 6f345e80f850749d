"""The chart's DRA driver (dra.*, docs/dra.md): off by default; on, the agent's pod is the driver (its
settings, kubelet's plugin folders) and the DeviceClasses ship; the KEP-5004 class is refused beside our
own translation of nvidia.com/gpu, which would take the same pods."""

from __future__ import annotations

import re

import helm_python
import pytest

from elasticgpu.agent import settings
from tests.deploy.test_chart import _objects, _one, _render

ON = {"dra": {"enabled": True}}


def _agent_container(objects: list[dict]) -> dict:  # type: ignore[type-arg]
    daemonset = _one(objects, "DaemonSet", "elasticgpu-agent")
    (container,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    return dict(container)


def test_off_by_default() -> None:
    objects = _objects()
    assert not [doc for doc in objects if doc["kind"] == "DeviceClass"]
    assert not [e for e in _agent_container(objects)["env"] if e["name"].startswith("ELASTICGPU_AGENT_DRA")]


def test_on_the_agent_is_the_driver_and_the_classes_ship() -> None:
    objects = _objects(ON)
    classes = {doc["metadata"]["name"]: doc for doc in objects if doc["kind"] == "DeviceClass"}
    assert set(classes) == {"gpu.elasticgpu.io", "gpu-slice.elasticgpu.io"}
    assert classes["gpu.elasticgpu.io"]["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "gpu.elasticgpu.io"'}}]
    container = _agent_container(objects)
    env = {e["name"]: e.get("value") for e in container["env"]}
    # Each is a real setting of the agent (its environment variable), with the chart's paths.
    assert env[settings._env("dra")] == "true"
    assert env[settings._env("dra_kubelet_dir")] == "/var/lib/kubelet"
    assert env[settings._env("dra_checkpoint")] == "/var/lib/elasticgpu/dra-checkpoint.json"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/gpu.elasticgpu.io"} <= mounts
    rules = _one(objects, "ClusterRole", "elasticgpu-agent")["rules"]
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
            "verbs": ["get", "create", "patch", "delete"]} in rules  # fmt: skip


def test_the_extended_resource_class_maps_nvidia_gpu() -> None:
    objects = _objects({"dra": {"enabled": True, "extendedResourceDeviceClass": {"enabled": True}}})
    assert _one(objects, "DeviceClass", "nvidia-gpu.elasticgpu.io")["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_the_extended_resource_class_is_refused_beside_our_translation() -> None:
    with pytest.raises(helm_python.HelmError, match=re.escape("translation.enabled and dra.extendedResourceDeviceClass"
                                                              ".enabled are both true")):  # fmt: skip
        _render({"dra": {"enabled": True, "extendedResourceDeviceClass": {"enabled": True}},
                 "translation": {"enabled": True}})  # fmt: skip
    with pytest.raises(helm_python.HelmError, match=re.escape("needs dra.enabled")):
        _render({"dra": {"extendedResourceDeviceClass": {"enabled": True}}})


def test_the_classes_name_the_slice_isolation_the_agent_reads() -> None:
    """dra.sliceIsolation reaches both classes' opaque config in the form the agent reads at prepare (issue 48)."""
    from elasticgpu.agent.dra import class_config

    for mode in ("None", "MPS", "HAMiCore"):
        objects = _objects({"dra": {"enabled": True, "sliceIsolation": mode}})
        for name in ("gpu.elasticgpu.io", "gpu-slice.elasticgpu.io"):
            configs = _one(objects, "DeviceClass", name)["spec"]["config"]
            allocation = {"devices": {"config": [{**c, "source": "FromClass"} for c in configs]}}
            assert class_config.isolation_mode(allocation, ["gpu"], claim=name) == mode
    with pytest.raises(helm_python.HelmError, match=re.escape('dra.sliceIsolation: "Strong" is not an isolation mode')):
        _render({"dra": {"enabled": True, "sliceIsolation": "Strong"}})


@pytest.mark.parametrize(("policing", "action", "grace"), [
    ({}, "Warn", 60), ({"overLimitAction": "StopContainer", "overLimitGraceSeconds": 0}, "StopContainer", 0),
    ({"overLimitAction": "StopContainer", "overLimitGraceSeconds": 120}, "StopContainer", 120)])  # fmt: skip
def test_the_classes_name_the_slice_policing_the_agent_reads(policing: dict[str, object], action: str,
                                                            grace: int) -> None:  # fmt: skip
    """dra.slicePolicing reaches both classes' config in the form the agent reads at prepare (issue 48)."""
    from elasticgpu.agent.dra import class_config

    objects = _objects({"dra": {"enabled": True, "sliceIsolation": "MPS", "slicePolicing": policing}})
    for name in ("gpu.elasticgpu.io", "gpu-slice.elasticgpu.io"):
        configs = _one(objects, "DeviceClass", name)["spec"]["config"]
        allocation = {"devices": {"config": [{**c, "source": "FromClass"} for c in configs]}}
        assert class_config.read(allocation, ["gpu"], claim=name) == class_config.ClassConfig(
            mode="MPS", over_limit_action=action, over_limit_grace_s=grace)  # type: ignore[arg-type]


@pytest.mark.parametrize(("policing", "message"), [
    ({"overLimitAction": "Kill"}, 'dra.slicePolicing.overLimitAction: "Kill" is not an over-limit action'),
    ({"overLimitGraceSeconds": -1}, "dra.slicePolicing.overLimitGraceSeconds: -1 is not a whole number"),
    ({"overLimitGraceSeconds": 1.5}, "dra.slicePolicing.overLimitGraceSeconds: 1.5 is not a whole number"),
    ({"overLimitGraceSeconds": "60"}, "dra.slicePolicing.overLimitGraceSeconds: 60 is not a whole number"),
])  # fmt: skip
def test_a_slice_policing_the_agent_would_refuse_is_refused_at_install(policing: dict[str, object],
                                                                       message: str) -> None:  # fmt: skip
    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        _render({"dra": {"enabled": True, "slicePolicing": policing}})
