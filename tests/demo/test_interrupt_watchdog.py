"""The demo's watchdog (run_frame.Interrupts): a Ctrl-C lands wherever the main thread is, and some
places do not survive it (a gRPC channel closed while a call it interrupted is still in flight can
deadlock, grpc/grpc#19973 and #20026). CI once saw `elasticgpu demo` still running 120 s after two
Ctrl-Cs. Whatever the cleanup hangs on, the run ends: the watchdog kills what it started, says so
in one line and exits 130. A real process, real signals; the hang is a lock nobody releases."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading
    from pathlib import Path
    from elasticgpu.demo.run_frame import Interrupts

    signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupts = Interrupts(stuck_after_s=float(sys.argv[2]))
    interrupts.install()
    marker = Path(sys.argv[1])
    interrupts.abandon = lambda: (marker.write_text("abandoned"), print("interrupted: killed it all", flush=True))
    held = threading.Lock()
    held.acquire()
    try:
        print("running", flush=True)
        threading.Event().wait(60)
    except KeyboardInterrupt:
        pass
    finally:
        interrupts.shielded = True
        held.acquire()  # the cleanup that never finishes (a deadlocked channel close, say)
    interrupts.finish()
    print("interrupted: cleaned up", flush=True)
    threading.Event().wait(float(sys.argv[2]) + 1)  # past the watchdog's deadline: it must stay quiet
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hangs", [True, False], ids=["cleanup-hangs", "cleanup-finishes"])
def test_a_hung_cleanup_still_ends_the_run(tmp_path: Path, hangs: bool) -> None:
    marker = tmp_path / "marker"
    script = SCRIPT if hangs else SCRIPT.replace("held.acquire()  #", "pass  #")
    proc = subprocess.Popen([sys.executable, "-c", script, str(marker), "3"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
        proc.send_signal(signal.SIGINT)
        began = time.monotonic()
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # the second Ctrl-C only counts
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("the run did not end 60 s after Ctrl-C with its cleanup hung") from None
        took = time.monotonic() - began
        output = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    if hangs:
        assert code == 130, output
        assert marker.read_text() == "abandoned"
        assert output.splitlines() == ["interrupted: killed it all"], output
        assert took >= 2.5, f"the watchdog ended the run {took:.1f} s after Ctrl-C: before its deadline (3 s)"
    else:  # a cleanup that finishes is left to say its own line; the watchdog stays quiet after it
        assert code == 0, output
        assert not marker.exists()
        assert output.splitlines() == ["interrupted: cleaned up"], output
