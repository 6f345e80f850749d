"""The public surface of elasticgpu.agent.cri is exactly what the agent wires."""

from __future__ import annotations

import elasticgpu.agent.cri as cri


def test_exports_are_exactly_the_public_names() -> None:
    assert cri.__all__ == sorted(cri.__all__)
    assert cri.__all__ == [
        "AgentView", "CardDevice", "CardInfo", "CdiForm", "ClaimHooks", "ClaimInfo", "ClaimUser", "ClaimView",
        "ContainerEdit", "ContainerHooks", "ContainerRequest", "CriHook", "CriProxy", "DeviceNode", "HookSettings",
        "InjectionSettings", "PassThrough", "PodRef", "PreparedCreate", "ProxySettings", "Refused", "decide",
        "write_spec",
    ]  # fmt: skip
    for name in cri.__all__:
        assert getattr(cri, name) is not None
