"""A small run of bench/agent_density.py's `creates` on the issue's node shape (issue 49 item 4): 8
simulated cards, the slices spread over all of them, every create through NRI injected with its own
claim's card. 16 containers (2 slices a card) instead of 512, to stay a smoke test; the real
containerd 1.7 and the agent's NRI side as its own process, as the bench runs them."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

from tests.agent.nri.conftest import PLUGIN_UNAVAILABLE_ENV
from tests.bench import bench_module
from tests.containerd_runtime import RuntimeUnavailable

REPO = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    return bench_module.load("agent_density", "agent_density.py")


@pytest.mark.timeout(300)  # 16 pods and containers on a loaded 2-core box: ~30 s; containerd's start included
def test_creates_spread_over_eight_simulated_cards_each_injected() -> None:
    if reason := os.environ.get(PLUGIN_UNAVAILABLE_ENV):
        pytest.skip(f"no NRI plugin: {reason}")
    try:
        figures = _bench().create_figures(16, 8)
    except RuntimeUnavailable as e:
        pytest.skip(f"no test container runtime or NRI plugin: {e}")
    assert (figures["containers"], figures["cards"], figures["slices_per_card"]) == (16, 8, 2), figures
    assert figures["injected"] == 16, figures  # each container holds its claim's card, and no other
    assert 0 < figures["p50_ms"] <= figures["p99_ms"], figures


def test_the_issue_shape_fits_and_an_overfull_card_is_refused_with_the_fix() -> None:
    """512 containers on 8 cards are 64 slices of 1% a card; 512 on 2 cards would be 256 a card."""
    with pytest.raises(SystemExit, match=r"256 slices a card.*give --cards 6 or more"):
        _bench().create_figures(512, 2)
