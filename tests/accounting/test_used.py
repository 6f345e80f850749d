"""The agent's used totals: each pass's measurement x the time since the previous pass (issue 38)."""

from __future__ import annotations

import pytest

from elasticgpu.agent import usage


@pytest.mark.timeout(10)
def test_used_totals_integrate_passes_cap_stalls_and_forget_old_claims() -> None:
    used: dict[tuple[str, str], usage.UsedTotals] = {}
    key = ("team-a", "train")
    measured = {key: usage.ClaimUsage("team-a", "train", reserved_mib=10240, memory_mib=2048, sm_percent=40)}
    usage.integrate_used(used, measured, last=None, now=100.0, longest_s=15.0)  # first pass: no interval yet
    assert used[key].core_seconds == 0
    usage.integrate_used(used, measured, last=100.0, now=105.0, longest_s=15.0)
    assert used[key].core_seconds == 40 * 5
    assert used[key].memory_byte_seconds == 2048 * 2**20 * 5
    # A stall of a minute: one sample stands for at most `longest_s`.
    usage.integrate_used(used, measured, last=105.0, now=165.0, longest_s=15.0)
    assert used[key].core_seconds == 40 * 5 + 40 * 15
    # Gone from the passes: kept (its final value is scraped) for the retention, then dropped.
    usage.integrate_used(used, {}, last=165.0, now=165.0 + usage.USED_RETENTION_S, longest_s=15.0)
    assert key in used
    usage.integrate_used(used, {}, last=165.0, now=166.0 + usage.USED_RETENTION_S, longest_s=15.0)
    assert key not in used
