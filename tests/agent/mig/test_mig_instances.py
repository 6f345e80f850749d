"""The agent's MIG room on the simulated backend and a real SQLite ledger: instances created and
destroyed two-phase, kill -9 of a real process at each step converging at the next start, and
the CDI device of an instance."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elasticgpu.agent import errors
from elasticgpu.agent.discovery.simulated import SimulatedBackend, inject
from elasticgpu.agent.ledger import models
from elasticgpu.agent.ledger.store import LedgerStore
from elasticgpu.agent.mig import MigInstances, mig_device

REPO = Path(__file__).resolve().parents[3]
CARDS = {"cards": [{"model": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "mig": True,
                    "migInstances": [{"profile": "1g.10gb", "start": 6}]}]}


def _open(tmp_path: Path) -> tuple[LedgerStore, SimulatedBackend, str]:
    store = LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    backend = SimulatedBackend(CARDS, node_name="n1", device_dir=tmp_path / "dev", inject_dir=tmp_path / "inject")
    return store, backend, backend.snapshot().cards[0].uuid


def test_ensure_creates_once_and_release_destroys(tmp_path: Path) -> None:
    store, backend, card = _open(tmp_path)
    mig = MigInstances(store=store, backend=backend)
    first = mig.ensure(elastic_gpu="egpu-a", card_uuid=card, profile="3g.40gb", start=0)
    again = mig.ensure(elastic_gpu="egpu-a", card_uuid=card, profile="3g.40gb", start=0)
    assert first == again
    [record] = store.mig_records()
    assert (record.state, record.gpu_instance_id, record.mig_uuid) == (models.MIG_CREATED, first.gpu_instance_id,
                                                                      first.uuid)
    with pytest.raises(errors.LedgerStateError, match="does not move"):
        mig.ensure(elastic_gpu="egpu-a", card_uuid=card, profile="3g.40gb", start=4)
    # NVML refuses (slices 2..3 are the 3g's): nothing of the attempt is kept.
    with pytest.raises(errors.MigInsufficientResources):
        mig.ensure(elastic_gpu="egpu-b", card_uuid=card, profile="2g.20gb", start=2)
    assert [r.elastic_gpu for r in store.mig_records()] == ["egpu-a"]
    inject(tmp_path / "inject", {"process": {"card": 0, "pid": 9, "instance": first.gpu_instance_id}})
    assert mig.release("egpu-a") is False  # a process runs on it: kept, row too
    assert len(store.mig_records()) == 1
    inject(tmp_path / "inject", {"process": {"card": 0, "pid": 9, "gone": True}})
    assert mig.release("egpu-a") is True
    assert store.mig_records() == []
    assert [i.profile for i in backend.mig_instances(card)] == ["1g.10gb"]  # the admin's carving stays


_CRASH = textwrap.dedent("""
    import os, signal, sys
    from elasticgpu.agent.discovery.simulated import SimulatedBackend
    from elasticgpu.agent.ledger.store import LedgerStore
    tmp, step = sys.argv[1], sys.argv[2]
    cards = {cards!r}
    store = LedgerStore.open(f"sqlite:///{{tmp}}/ledger.db")
    backend = SimulatedBackend(cards, node_name="n1", device_dir=f"{{tmp}}/dev")
    card = backend.snapshot().cards[0].uuid
    record = store.record_mig_creating(card_uuid=card, elastic_gpu="egpu-a", profile="3g.40gb", start=0)
    if step == "after-create" or step == "after-mark":
        made = backend.create_mig_instance(card, profile="3g.40gb", start=0)
    if step == "after-mark":
        store.mark_mig_created(record.id, gpu_instance_id=made.gpu_instance_id, mig_uuid=made.uuid)
    os.kill(os.getpid(), signal.SIGKILL)
""").format(cards=CARDS)


@pytest.mark.parametrize("step", ["after-record", "after-create", "after-mark"])
@pytest.mark.parametrize("held", [True, False])
def test_kill_9_at_each_step_converges(tmp_path: Path, step: str, held: bool) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _CRASH, str(tmp_path), step], env=env, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    store, backend, card = _open(tmp_path)
    mig = MigInstances(store=store, backend=backend)
    mig.converge(held={"egpu-a"} if held else set())
    instances = {(i.profile, i.start) for i in backend.mig_instances(card)}
    records = store.mig_records()
    if not held:
        # Nobody holds it: whatever step the kill hit, no instance and no row is left (the admin's 1g stays).
        assert instances == {("1g.10gb", 6)} and records == []
    elif step == "after-record":
        # Held, never created: the row goes; the claim's next container creates it.
        assert instances == {("1g.10gb", 6)} and records == []
        made = mig.ensure(elastic_gpu="egpu-a", card_uuid=card, profile="3g.40gb", start=0)
        assert (made.profile, made.start) == ("3g.40gb", 0)
    else:
        # Held and created: adopted, never created twice.
        assert instances == {("1g.10gb", 6), ("3g.40gb", 0)}
        [record] = records
        assert record.state == models.MIG_CREATED and record.mig_uuid is not None


def test_cdi_device_names_the_instance(tmp_path: Path) -> None:
    store, backend, card_uuid = _open(tmp_path)
    made = MigInstances(store=store, backend=backend).ensure(elastic_gpu="egpu-a", card_uuid=card_uuid,
                                                             profile="2g.20gb", start=2)
    card = backend.snapshot().cards[0]
    device = mig_device(made, card)
    assert device["name"] == made.uuid and made.uuid.startswith("MIG-")
    paths = [node["path"] for node in device["containerEdits"]["deviceNodes"]]
    assert paths[0] == f"/dev/nvidia{card.minor}" and all(p.startswith("/dev/nvidia-caps/") for p in paths[1:])
    assert all(Path(node.get("hostPath", node["path"])).exists() for node in device["containerEdits"]["deviceNodes"])
    assert device["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={made.uuid}"]
