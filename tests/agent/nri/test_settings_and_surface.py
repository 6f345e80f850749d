"""The NRI room's public surface, and the agent's --node-hook / --nri-socket settings (issue 34)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import elasticgpu.agent.nri as nri
from elasticgpu.agent import errors, running, settings


def test_exports_are_exactly_the_public_names() -> None:
    assert nri.__all__ == sorted(nri.__all__)
    assert nri.__all__ == ["FrontServer", "NriFront", "PluginProcess", "PluginSettings"]


def test_node_hook_and_nri_socket_from_flags_and_environment() -> None:
    default = settings.from_sources(environ={})
    assert (default.cri.node_hook, default.cri.nri_socket) == ("cri-proxy", "/var/run/nri/nri.sock")
    from_env = settings.from_sources(environ={"ELASTICGPU_AGENT_NODE_HOOK": "nri",
                                              "ELASTICGPU_AGENT_NRI_SOCKET": "/run/nri/x.sock"})
    assert (from_env.cri.node_hook, from_env.cri.nri_socket) == ("nri", "/run/nri/x.sock")


def test_nri_mode_keeps_kubelet_socket_free_and_unknown_hooks_are_refused(tmp_path: Path) -> None:
    cri = dataclasses.replace(settings.CriSettings(), node_hook="nri", cri_front_dir=str(tmp_path), cri_front="none")
    hook = running.hook_settings(cri)
    assert hook.front is None and hook.proxy.listen == tmp_path / "nri-mode-cri.sock"  # not kubelet's cri_listen
    assert not hook.proxy_hooks  # the NRI front alone calls the core (and lists with the spec's annotations)
    with pytest.raises(errors.AgentError, match="--node-hook / ELASTICGPU_AGENT_NODE_HOOK='crio' is not a node hook"):
        running.hook_settings(dataclasses.replace(cri, node_hook="crio"))
