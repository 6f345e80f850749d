"""The agent's packages export exactly their public names (what the CRI hook and the loops build on)."""

from __future__ import annotations

from elasticgpu.agent import discovery, ledger, policing


def test_discovery_exports() -> None:
    assert sorted(discovery.__all__) == [
        "APPLICATION_XIDS", "BACKENDS", "Card", "CardReset", "DiscoveryBackend", "DriverInfo", "ProcessUsage",
        "Snapshot", "XidEvent", "open_backend",
    ]
    assert all(hasattr(discovery, name) for name in discovery.__all__)


def test_ledger_exports_the_interface_the_cri_hook_calls() -> None:
    assert sorted(ledger.__all__) == ["Allocation", "LedgerStore", "UsageSample"]
    for method in ("open", "record_started", "mark_created", "mark_released", "roll_back", "open_allocations",
                   "allocation_for_container"):
        assert callable(getattr(ledger.LedgerStore, method)), method


def test_policing_exports_the_decision_and_the_enforcer() -> None:
    assert sorted(policing.__all__) == [
        "ContainerStopper", "Enforcer", "Policy", "REASON_STOPPED", "Sample", "Stop", "Watch", "choose", "confirm",
        "observe", "policy_of",
    ]
    assert all(hasattr(policing, name) for name in policing.__all__)


def test_dra_exports_what_the_agent_wires() -> None:
    from elasticgpu.agent import dra

    assert sorted(dra.__all__) == ["Checkpoint", "DRIVER", "KubeletPlugin", "Preparer", "SlicePublisher"]
    assert all(hasattr(dra, name) for name in dra.__all__)
