"""The CRI hook inside the agent: its CDI spec follows the cards, its proxy is never dead (restarted when
its socket is gone, retried with backoff while its path is taken, a failure logged once), and it stops."""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from elasticgpu.agent.cri import supervising
from elasticgpu.agent.cri.proxy import ProxySettings
from elasticgpu.agent.discovery import Card
from elasticgpu.agent.injecting import cdi
from elasticgpu.agent.ledger import store
from tests.agent.conftest import wait_for
from tests.agent.cri.node import View

CARD = Card(index=0, uuid="GPU-AAAA0000-0000-0000-0000-000000000001", model="T", memory_mib=81920, minor=0,
            device_path="/run/sim/dev/nvidia0")


class Running:
    """A CriHook running in its thread, with cards and control devices the test changes."""

    def __init__(self, tmp: Path, ledger: store.LedgerStore) -> None:
        self.cards: list[Card] = [CARD]
        self.control = ["/run/sim/dev/nvidiactl"]
        settings = supervising.HookSettings(
            proxy=ProxySettings(listen=tmp / "p.sock", upstream=str(tmp / "no-runtime.sock"),
                                reconcile_backoff_s=(0.05, 0.2)),
            cdi_dir=tmp / "cdi", cdi_check_interval_s=0.5, tick_s=0.05, backoff_s=(0.05, 0.2), grace_s=1,
        )
        self.hook = supervising.CriHook(settings=settings, view=View(), ledger=ledger, cards=lambda: self.cards,
                                        control_paths=lambda: self.control)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.hook.run, args=(self.stop,), daemon=True)

    @property
    def socket(self) -> Path:
        return self.hook.settings.proxy.listen

    def spec(self) -> dict[str, object] | None:
        path = self.hook.settings.cdi_dir / cdi.SPEC_FILE
        return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    hook = Running(tmp_path, ledger)
    yield hook
    hook.stop.set()
    hook.thread.join(10)
    ledger.close()


def test_the_spec_follows_the_cards_and_is_put_back(running: Running) -> None:
    assert running.hook.spec_problem() is not None  # no claim before the spec names its cards
    running.thread.start()
    spec = wait_for("the CDI spec", running.spec)
    assert spec["devices"] == [{"name": CARD.uuid, "containerEdits": {"deviceNodes": [
        {"path": "/dev/nvidia0", "hostPath": "/run/sim/dev/nvidia0", "permissions": "rw"}]}}]
    assert spec["containerEdits"] == {"deviceNodes": [
        {"path": "/dev/nvidiactl", "hostPath": "/run/sim/dev/nvidiactl", "permissions": "rw"}]}
    # The file is in place a moment before the hook notes it (seen flaky in 1 of 10 runs): wait for the note.
    wait_for("claims allowed once the spec is written", lambda: running.hook.spec_problem() is None)

    # A second card appears, and nvidia-uvm (created on the first CUDA use): written again.
    second = replace(CARD, index=1, uuid="GPU-AAAA0000-0000-0000-0000-000000000002", minor=1,
                     device_path="/dev/nvidia1")
    running.cards = [CARD, second]
    running.control = [*running.control, "/run/sim/dev/nvidia-uvm"]
    spec = wait_for("both cards in the spec", lambda: (s := running.spec()) and len(s["devices"]) == 2 and s)
    assert spec["devices"][1]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia1", "permissions": "rw"}]
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]

    # Someone removed the file: it is back within the check interval.
    (running.hook.settings.cdi_dir / cdi.SPEC_FILE).unlink()
    assert wait_for("the spec put back", running.spec, timeout=5) == spec


def test_the_proxy_serves_mode_0600_comes_back_and_stops(running: Running) -> None:
    running.thread.start()
    wait_for("the proxy's socket", lambda: running.socket.exists() and running.hook.proxy is not None)
    assert stat.S_IMODE(os.stat(running.socket).st_mode) == 0o600 and stat.S_ISSOCK(os.stat(running.socket).st_mode)

    # A cleaned /var/run: kubelet could not reach it any more. The proxy is restarted, fresh hooks.
    first_hooks = running.hook.hooks
    running.socket.unlink()
    wait_for("the proxy restarted", lambda: running.hook.proxy_starts == 2 and running.socket.exists())
    assert running.hook.hooks is not first_hooks

    running.stop.set()
    running.thread.join(10)
    assert not running.thread.is_alive() and not running.socket.exists() and running.hook.proxy is None


def test_a_taken_listen_path_is_retried_and_logged_once(running: Running, caplog: pytest.LogCaptureFixture) -> None:
    running.socket.write_text("not a socket")
    with caplog.at_level(logging.DEBUG, logger=supervising.__name__):
        running.thread.start()
        wait_for("several attempts", lambda: running.hook._proxy_retry.failures >= 3)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "exists and is not a socket" in warnings[0].getMessage()
        assert running.socket.read_text() == "not a socket"  # never removed: it is not ours
        assert running.thread.is_alive()

        running.socket.unlink()  # the operator fixed it
        wait_for("the proxy after the fix", lambda: running.hook.proxy is not None, timeout=5)
        assert any("works again" in r.getMessage() for r in caplog.records)
