"""The simulated backend's MIG: profiles and placements as NVIDIA's tables give them, instances
created and destroyed with the errors NVML gives, and MIG mode reported per card."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elasticgpu.agent import errors
from elasticgpu.agent.discovery.simulated import SimulatedBackend, inject
from elasticgpu.allocator.mig import by_name
from elasticgpu.allocator.mig import slots as mig_slots

A100_80 = {"model": "NVIDIA A100-SXM4-80GB", "memory": "80Gi"}


def _backend(tmp_path: Path, *cards: dict[str, Any]) -> SimulatedBackend:
    return SimulatedBackend({"cards": list(cards)}, node_name="n1", device_dir=tmp_path / "dev",
                            inject_dir=tmp_path / "inject")


def test_mig_mode_is_reported_per_card(tmp_path: Path) -> None:
    backend = _backend(tmp_path, {**A100_80, "mig": True}, A100_80)
    assert [card.mig_enabled for card in backend.snapshot().cards] == [True, False]


def test_profiles_and_starts_follow_the_tables(tmp_path: Path) -> None:
    backend = _backend(tmp_path, {**A100_80, "mig": True})
    card = backend.snapshot().cards[0].uuid
    listed = {p.name: (p.profile_id, p.compute_slices, p.memory_slices, p.memory_mib, p.starts)
              for p in backend.mig_profiles(card)}
    assert listed == {
        "1g.10gb": (19, 1, 1, 10240, (0, 1, 2, 3, 4, 5, 6)),
        "1g.20gb": (15, 1, 2, 20480, (0, 2, 4, 6)),
        "2g.20gb": (14, 2, 2, 20480, (0, 2, 4)),
        "3g.40gb": (9, 3, 4, 40960, (0, 4)),
        "4g.40gb": (5, 4, 4, 40960, (0,)),
        "7g.80gb": (0, 7, 8, 81920, (0,)),
    }


def test_create_and_destroy_with_nvmls_errors(tmp_path: Path) -> None:
    backend = _backend(tmp_path, {**A100_80, "mig": True, "migInstances": [{"profile": "3g.40gb", "start": 4}]},
                       A100_80)
    mig, plain = (c.uuid for c in backend.snapshot().cards)
    [carved] = backend.mig_instances(mig)
    assert (carved.profile, carved.start, carved.size) == ("3g.40gb", 4, 4)
    with pytest.raises(errors.MigNotEnabled, match="not in MIG mode"):
        backend.create_mig_instance(plain, profile="1g.10gb", start=0)
    with pytest.raises(errors.MigInvalidPlacement, match="may start only at"):
        backend.create_mig_instance(mig, profile="4g.40gb", start=4)
    with pytest.raises(errors.MigInvalidPlacement, match="no MIG profile"):
        backend.create_mig_instance(mig, profile="5g.50gb", start=0)
    with pytest.raises(errors.MigInsufficientResources, match="taken"):
        backend.create_mig_instance(mig, profile="1g.10gb", start=5)
    four = backend.create_mig_instance(mig, profile="4g.40gb", start=0)
    assert four.uuid.startswith("MIG-") and all(Path(p).exists() for p in four.device_paths)
    with pytest.raises(errors.MigInsufficientResources):
        backend.create_mig_instance(mig, profile="1g.10gb", start=0)
    inject(tmp_path / "inject", {"process": {"card": 0, "pid": 7, "memory": "1Gi", "instance": four.gpu_instance_id}})
    with pytest.raises(errors.MigInUse, match="processes running"):
        backend.destroy_mig_instance(mig, four.gpu_instance_id)
    inject(tmp_path / "inject", {"process": {"card": 0, "pid": 7, "gone": True}})
    backend.destroy_mig_instance(mig, four.gpu_instance_id)
    with pytest.raises(errors.MigNotFound):
        backend.destroy_mig_instance(mig, four.gpu_instance_id)
    assert [i.profile for i in backend.mig_instances(mig)] == ["3g.40gb"]


def test_a_bad_carving_or_a_card_without_mig_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.SimulationInvalid, match="migInstances"):
        _backend(tmp_path, {**A100_80, "mig": True,
                            "migInstances": [{"profile": "4g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 0}]})
    with pytest.raises(errors.SimulationInvalid, match="no MIG profiles"):
        _backend(tmp_path, {"model": "Tesla T4", "memory": "16Gi", "mig": True})


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.booleans(), st.sampled_from(by_name("A100-80GB").names), st.integers(0, 7)),
                      max_size=20))
def test_the_simulation_refuses_exactly_what_the_slot_rules_refuse(
        tmp_path: Path, steps: list[tuple[bool, str, int]]) -> None:
    backend = _backend(tmp_path, {**A100_80, "mig": True})
    card = backend.snapshot().cards[0].uuid
    model = by_name("A100-80GB")
    for create, profile, start in steps:
        held = backend.mig_instances(card)
        if not create:
            if held:
                backend.destroy_mig_instance(card, held[start % len(held)].gpu_instance_id)
            continue
        used = mig_slots.EMPTY
        for instance in held:
            used = mig_slots.taking(used, model.profile(instance.profile), instance.start)
        allowed = mig_slots.fits(model, used, model.profile(profile), start)
        try:
            backend.create_mig_instance(card, profile=profile, start=start)
            assert allowed
        except (errors.MigInvalidPlacement, errors.MigInsufficientResources):
            assert not allowed
