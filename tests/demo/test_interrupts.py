"""Ctrl-C on `elasticgpu demo`, as a terminal sends it (issue 36, item 5): SIGINT to the demo's
whole foreground process group, twice in a row, at start-up and in the middle of the run. However
often it is interrupted, the demo exits non-zero with one line saying so, no traceback, and leaves
no `egdemo-*` folder behind (it once printed a traceback and left 123 MB of containerd state).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from elasticgpu.testbed import local_cluster

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    local_cluster.find_binaries(build_if_missing=False) is None,
    reason="no cached test API server: run `bash testserver/build.sh` (a few minutes)",
)


def _interrupted_run(*, after_line: str | None, delay_s: float) -> tuple[int, str, list[str]]:
    """Start the demo in a process group of its own (as a shell starts a foreground job), wait for
    `after_line` in its output (or `delay_s` after its start when None), then send the group SIGINT
    twice, 0.2 s apart, as two quick Ctrl-Cs do. Returns its exit code, its output, and what it
    left in its temp folder: a TMPDIR of its own, so that other demos running on this machine
    meanwhile are not counted (short: the demo's unix sockets live there)."""
    tmp = Path(tempfile.mkdtemp(prefix="egint-", dir="/tmp"))
    try:
        code, output = _run_and_interrupt(tmp, after_line=after_line, delay_s=delay_s)
        return code, output, sorted(p.name for p in tmp.iterdir())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_and_interrupt(tmp: Path, *, after_line: str | None, delay_s: float) -> tuple[int, str]:
    # SIGINT as a terminal's foreground job has it: a shell's background job (`pytest ... &`) starts with
    # SIGINT ignored, which Python then keeps, and the demo would never see the Ctrl-Cs.
    command = [sys.executable, "-c", "import runpy, signal, sys;"
               " signal.signal(signal.SIGINT, signal.default_int_handler); sys.argv = ['elasticgpu', 'demo'];"
               " runpy.run_module('elasticgpu', run_name='__main__')"]
    proc = subprocess.Popen(command, cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200", "TMPDIR": str(tmp)})
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if after_line is not None and after_line in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if after_line is None:
            time.sleep(delay_s)
        else:
            assert seen.wait(120), f"the demo never printed {after_line!r}:\n{''.join(lines)}"
        for _ in range(2):
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.2)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    reader.join(timeout=10)
    return code, "".join(lines)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("after_line", "delay_s"), [(None, 0.3), (None, 1.5), ("2/4", 0.0), ("4/4", 0.0)],
                         ids=["importing", "starting-the-server", "starting-components", "running-containers"])
def test_ctrl_c_twice_exits_with_one_line_and_leaves_nothing(after_line: str | None, delay_s: float) -> None:
    code, output, left = _interrupted_run(after_line=after_line, delay_s=delay_s)
    assert code != 0, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    said = [line for line in output.splitlines() if "interrupted" in line]
    assert len(said) == 1, output
    assert not left, f"left behind: {left}\n{output}"
