"""The public surfaces of elasticgpu.agent.cri (the CRI front) and elasticgpu.agent.injecting (the core)."""

from __future__ import annotations

import elasticgpu.agent.cri as cri
import elasticgpu.agent.injecting as injecting


def test_exports_are_exactly_the_public_names() -> None:
    assert cri.__all__ == sorted(cri.__all__)
    assert cri.__all__ == ["CriHook", "CriProxy", "HookSettings", "ProxySettings"]
    for name in cri.__all__:
        assert getattr(cri, name) is not None


def test_the_core_exports_are_exactly_the_public_names() -> None:
    assert injecting.__all__ == sorted(injecting.__all__)
    assert injecting.__all__ == [
        "AgentView", "CardDevice", "CardInfo", "CdiForm", "ClaimHooks", "ClaimInfo", "ClaimUser", "ClaimView",
        "ContainerEdit", "ContainerHooks", "ContainerRequest", "DeviceNode", "GatedHooks", "GatedView",
        "InjectionSettings", "PassThrough", "PodRef", "PreparedCreate", "Refused", "RuntimeContainer", "decide",
        "write_spec",
    ]  # fmt: skip
    for name in injecting.__all__:
        assert getattr(injecting, name) is not None
